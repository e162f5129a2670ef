"""Declaration of the `dra` collector: GPUs allocated through Dynamic Resource Allocation
(`resource.k8s.io`: v1 on Kubernetes 1.34+, else v1beta2 on 1.33, else v1beta1 on 1.32, the
newest the API server's discovery offers), from the claims' allocation results and the
driver's ResourceSlices.

Off by default, on with `--collectors ...,dra`: the API offers no field selector for a
claim's node, so the collector watches every ResourceClaim of the cluster (keeping only this
node's), and every claim change then reaches every node's agent, a load on the API server a
cluster that allocates GPUs through the device plugin should not pay; and an API server
before 1.32 serves no version of `resource.k8s.io` the collector reads (it then fails with
one line saying so). It renders nothing itself: the attribution stage joins its records with the
kubelet's and the GPUs'.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscope.agent.k8s.dra_records import DEFAULT_DRA_DRIVERS, DraSnapshot
from gpuscope.agent.runtime.options import ConfigError, flag, names
from gpuscope.agent.runtime.spec import BuildContext, CollectorSpec

if TYPE_CHECKING:
    from gpuscope.agent.runtime.sources import Source


def _drivers(flag_name: str, text: str) -> tuple[str, ...]:
    found = names(text)
    if not found:
        raise ConfigError(f"{flag_name}: expected at least one DRA driver name")
    return found


def _seconds(value: float) -> str | None:
    return None if 10 <= value <= 3600 else f"expected 10 to 3600 seconds, got {value:g}"


@dataclass(frozen=True, slots=True)
class DraOptions:
    """The `dra` collector's flags: which DRA drivers' devices are GPUs, and how long its watches
    may stay silent before the collector fails."""

    dra_drivers: tuple[str, ...] = flag(
        DEFAULT_DRA_DRIVERS,
        "comma-separated DRA drivers whose devices are GPUs (their ResourceSlices carry a uuid "
        "attribute, as NVIDIA's gpu.nvidia.com does)",
        parse=_drivers,
    )
    dra_stale_after: float = flag(
        90.0,
        "seconds without word from the Kubernetes API on a DRA watch (pods, ResourceClaims, "
        "ResourceSlices) after which the dra collector fails with its last allocations",
        check=_seconds,
    )


def _build(ctx: BuildContext[DraOptions]) -> Source[DraSnapshot]:
    from gpuscope.agent.k8s.client import make_client
    from gpuscope.agent.k8s.dra_source import DraSource

    return DraSource(
        functools.partial(make_client, ctx.agent.kubeconfig),
        ctx.agent.node_name,
        drivers=ctx.options.dra_drivers,
        stale_after=ctx.options.dra_stale_after,
    )


DRA: CollectorSpec[DraSnapshot, DraOptions] = CollectorSpec(
    name="dra",
    summary="GPUs allocated through Dynamic Resource Allocation, from the ResourceClaims' "
    "allocation results and the driver's ResourceSlices (Kubernetes API, resource.k8s.io v1, "
    "v1beta2 or v1beta1, the newest served).",
    options=DraOptions,
    build=_build,
    default=False,
)
