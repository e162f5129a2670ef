"""Immutable records the attribution stage adds to a collection."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuscope.agent.k8s.workloads import Workload


@dataclass(frozen=True, slots=True)
class PodRef:
    """A pod as users name it. Names are empty while the Kubernetes API never answered."""

    uid: str
    namespace: str
    name: str
    workload: Workload


@dataclass(frozen=True, slots=True)
class GpuHolding:
    """One container holding one GPU (whole, a MIG instance of it, or a time-sliced share)."""

    gpu: int
    uuid: str
    namespace: str
    pod: str
    container: str
    workload: Workload


@dataclass(frozen=True, slots=True)
class PodGpuUsage:
    """What one container's processes use of one GPU, summed over its processes."""

    gpu: int
    uuid: str
    pod: PodRef  # uid "" for processes outside every pod (host processes)
    container: str
    memory_bytes: int | None
    utilization_ratio: float | None


@dataclass(frozen=True, slots=True)
class GpuStatus:
    """Per GPU, what only the join can tell. Present only while the kubelet answers."""

    gpu: int
    uuid: str
    allocated: bool
    unallocated_memory_bytes: int
    idle_seconds: float | None  # None where NVML reports no utilization (MIG mode)


IdleKey = tuple[str, str, str]  # namespace, workload kind, workload


@dataclass(frozen=True, slots=True)
class Attribution:
    holdings: tuple[GpuHolding, ...] = ()
    gpus: tuple[GpuStatus, ...] = ()
    usage: tuple[PodGpuUsage, ...] = ()
    pods: tuple[PodRef, ...] = ()  # pods that hold a GPU, run GPU processes or have traffic
    idle_seconds_total: Mapping[IdleKey, float] = field(default_factory=dict)
