"""Declarations of the Kubernetes collectors: `kubelet` (who holds each device, from the
PodResources API) and `pods` (this node's pods and workloads, from the Kubernetes API).

Neither renders series of its own: the attribution stage joins their records with the GPU
and network records, and the exporter renders what it adds.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuscope.agent.k8s.workloads import DEFAULT_ORDER, RESOLVERS
from gpuscope.agent.runtime.options import ConfigError, flag, names
from gpuscope.agent.runtime.spec import BuildContext, CollectorSpec

if TYPE_CHECKING:
    from gpuscope.agent.k8s.podresources.records import KubeletSnapshot
    from gpuscope.agent.k8s.records import PodsSnapshot
    from gpuscope.agent.runtime.sources import Source


@dataclass(frozen=True, slots=True)
class KubeletOptions:
    """The `kubelet` collector's flags: where the PodResources socket is and how often it is
    asked."""

    kubelet_socket: Path = flag(
        Path("/var/lib/kubelet/pod-resources/kubelet.sock"), "the kubelet's PodResources socket"
    )
    kubelet_interval: float = flag(
        10.0,
        "seconds between PodResources polls",
        check=lambda v: None if 1 <= v <= 600 else f"expected 1 to 600 seconds, got {v:g}",
    )


def _workload_order(flag_name: str, text: str) -> tuple[str, ...]:
    order = names(text)
    unknown = [n for n in order if n not in RESOLVERS]
    if unknown or not order:
        raise ConfigError(
            f"{flag_name}: unknown resolver {unknown[0] if unknown else '(none)'!r} "
            f"(available: {', '.join(RESOLVERS)})"
        )
    return order


def _seconds(low: float, high: float) -> Callable[[float], str | None]:
    def check(value: float) -> str | None:
        if low <= value <= high:
            return None
        return f"expected {low:g} to {high:g} seconds, got {value:g}"

    return check


@dataclass(frozen=True, slots=True)
class PodsOptions:
    """The `pods` collector's flags: the order in which workloads are resolved, and how long a
    silent Kubernetes API is waited for before the watch is dropped or the collector fails."""

    workload_order: tuple[str, ...] = flag(
        DEFAULT_ORDER,
        "comma-separated order in which pod workloads are resolved (leave one out to ignore it)",
        parse=_workload_order,
    )
    # Real API servers send a BOOKMARK on a quiet watch about once a minute (kubernetes#90249):
    # silence well past that means the connection is dead, not that nothing happened.
    pods_watch_read_timeout: float = flag(
        75.0,
        "seconds without a byte on the pod watch (no event, no bookmark) before it is dropped "
        "and the pods relisted; keep it above the API server's bookmark gap (about 60 s)",
        check=_seconds(10, 3600),
    )
    pods_stale_after: float = flag(
        90.0,
        "seconds without word from the Kubernetes API (list, watch event or bookmark) after "
        "which the pods collector fails with its last pods until the watch is back",
        check=_seconds(10, 3600),
    )


def _build_kubelet(ctx: BuildContext[KubeletOptions]) -> Source[KubeletSnapshot]:
    from gpuscope.agent.k8s.kubelet_source import KubeletSource

    return KubeletSource(
        ctx.options.kubelet_socket,
        interval=ctx.options.kubelet_interval,
        clock=ctx.clock,
        background=ctx.background,
    )


def _build_pods(ctx: BuildContext[PodsOptions]) -> Source[PodsSnapshot]:
    from gpuscope.agent.k8s.client import make_client
    from gpuscope.agent.k8s.pods_source import PodsSource

    return PodsSource(
        functools.partial(make_client, ctx.agent.kubeconfig),
        ctx.agent.node_name,
        order=ctx.options.workload_order,
        stale_after=ctx.options.pods_stale_after,
        read_timeout=ctx.options.pods_watch_read_timeout,
        # Not ctx.clock: the watch's silence is measured on the real clock its sockets use,
        # even where a test simulates minutes for the GPU sampler.
    )


KUBELET: CollectorSpec[KubeletSnapshot, KubeletOptions] = CollectorSpec(
    name="kubelet",
    summary="Device allocations per container from the kubelet's PodResources API (gRPC on "
    "its unix socket).",
    options=KubeletOptions,
    build=_build_kubelet,
)

PODS: CollectorSpec[PodsSnapshot, PodsOptions] = CollectorSpec(
    name="pods",
    summary="This node's pods, their containers and workloads, from the Kubernetes API "
    "(list and watch).",
    options=PodsOptions,
    build=_build_pods,
)
