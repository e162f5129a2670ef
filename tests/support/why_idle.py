"""Hand-made collections for the "why is this GPU idle" tests (issue #16): one GPU, the
pods holding it (kubelet), the pods list (API) and optionally per-pod TCP retransmits (net),
fed to the real attribution stage."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from gpuscope.agent.gpu.records import GpuProcess, GpuReading
from gpuscope.agent.k8s.podresources.records import (
    ContainerDevices,
    Device,
    KubeletSnapshot,
    PodDevices,
)
from gpuscope.agent.k8s.records import PodMeta, PodsSnapshot
from gpuscope.agent.k8s.workloads import Workload
from gpuscope.agent.net.records import NetSnapshot, PodNetwork
from gpuscope.agent.runtime.sources import Collection, SourceResult
from tests.support import gpu_records

G0 = "GPU-00000000-0000-4000-8000-000000000000"


def meta(uid: str, name: str, *, scheduled_at: float | None = None, ns: str = "ml") -> PodMeta:
    """A pod of workload Job `name`."""
    return PodMeta(uid, ns, name, Workload("Job", name), scheduled_at=scheduled_at)


def gpu_collection(
    *,
    idle: float,
    pods: Sequence[PodMeta],
    holders: Sequence[PodMeta] | None = None,
    processes: Sequence[GpuProcess] = (),
    busy: float = 0.0,
    sm_active: float | None = None,
    retransmits: Mapping[str, int] | None = None,
    at: float = 0.0,
) -> Collection:
    """The GPU with `idle` idle seconds integrated so far, held by `holders` (default every
    pod, through the kubelet), `pods` as the API lists them; `retransmits` by pod UID as the
    net collector counts them (None: no net collector)."""
    identity = gpu_records.identity(0, G0, "H100")
    reading = GpuReading(
        identity,
        True,
        utilization_ratio=0.0,
        busy_seconds=busy,
        idle_seconds=idle,
        sm_active_seconds=sm_active,
        processes=tuple(processes),
    )
    kubelet = KubeletSnapshot(
        pods=tuple(
            PodDevices(
                p.namespace, p.name, (ContainerDevices("main", (Device("nvidia.com/gpu", G0),)),)
            )
            for p in (pods if holders is None else holders)
        ),
        polled_at=at,
    )
    results: dict[str, SourceResult[object]] = {
        "gpu": SourceResult("gpu", gpu_records.snapshot((reading,)), True, 0),
        "kubelet": SourceResult("kubelet", kubelet, True, 0),
        "pods": SourceResult("pods", PodsSnapshot({p.uid: p for p in pods}), True, 0),
    }
    if retransmits is not None:
        net = NetSnapshot(
            pods=tuple(PodNetwork(uid, "", tcp_retransmits=n) for uid, n in retransmits.items()),
            probes={},
            map_full={},
            map_entries={},
            map_max_entries={},
        )
        results["net"] = SourceResult("net", net, True, 0)
    return Collection(results=results, collected_at=at)
