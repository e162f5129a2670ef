"""Immutable records the attribution stage adds to a collection (it never changes the
sources' records: what it adds travels beside them, in `Attributed`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuscope.agent.hostfs import Reason
    from gpuscope.agent.k8s.pod_cgroup_usage import PodCgroupUsage
    from gpuscope.agent.k8s.workloads import Workload
    from gpuscope.agent.runtime.sources import Collection


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
    mig_uuid: str = ""  # the MIG device held, "" for a whole GPU or a share of one


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
    unallocated_memory_bytes: int | None  # None where NVML refused the process list
    idle_seconds: float | None  # None where NVML reports no utilization (MIG mode)


@dataclass(frozen=True, slots=True)
class PodName:
    """What the Kubernetes API says of a pod UID, as network series are labelled."""

    namespace: str
    pod: str
    workload_kind: str
    workload: str
    containers: Mapping[str, str] = field(default_factory=dict)  # runtime id -> name


@dataclass(frozen=True, slots=True)
class MigStatus:
    """Per MIG device, what GpuStatus says of a GPU: MIG has no NVML utilization, so idle
    comes from its GPU instance's GPM graphics-engine activity. Present only while the
    kubelet answers; `idle_seconds` None where the GPU has no GPM."""

    gpu: int
    uuid: str  # the parent GPU
    mig_uuid: str
    allocated: bool
    idle_seconds: float | None


@dataclass(frozen=True, slots=True)
class PodEnergy:
    """The GPU energy credited to one pod on one GPU since the pod was first seen on it."""

    gpu: int
    uuid: str
    pod: PodRef  # uid "" where the API never named the pod (names from the kubelet)
    joules: float


@dataclass(frozen=True, slots=True)
class PodSignals:
    """What the kernel measures of one pod's cgroup (agent/k8s/pod_cgroup_usage.py)."""

    pod: PodRef  # names empty while the Kubernetes API has not named the pod
    usage: PodCgroupUsage


@dataclass(frozen=True, slots=True)
class PodStartup:
    """Seconds from a pod's scheduling to the first GPU activity of its processes
    (agent/attribution/startup.py); known only for pods the agent watched from their
    scheduling."""

    pod: PodRef
    seconds: float


IdleKey = tuple[str, str, str]  # namespace, workload kind, workload
# gpuscope_series_dropped_total's reason for per-workload series left out past --max-workloads
# (agent/attribution/retention.py).
WORKLOAD_LIMIT = "workload_limit"
CauseKey = tuple[str, str, str, str]  # namespace, workload kind, workload, cause


@dataclass(frozen=True, slots=True)
class Attribution:
    """Everything the attribution stage added to one collection, as a scrape renders it: who
    holds each GPU, what pods use and what they are called, and the per-workload counters.
    Fields whose inputs were missing stay empty."""

    holdings: tuple[GpuHolding, ...] = ()
    gpus: tuple[GpuStatus, ...] = ()
    usage: tuple[PodGpuUsage, ...] = ()
    pods: tuple[PodRef, ...] = ()  # pods that hold a GPU, run GPU processes or have traffic
    idle_seconds_total: Mapping[IdleKey, float] = field(default_factory=dict)
    migs: tuple[MigStatus, ...] = ()
    # Seconds allocated GPUs were busy by NVML while their SM activity stayed low (GPM).
    low_activity_seconds_total: Mapping[IdleKey, float] = field(default_factory=dict)
    energy: tuple[PodEnergy, ...] = ()
    # Every pod the Kubernetes API named, by UID (one mapping per pod list, shared by
    # scrapes): how network records, keyed by pod UID, get their names. Empty until the API
    # answers; pods it lacks keep only `pod_uid`.
    pod_names: Mapping[str, PodName] = field(default_factory=dict)
    # Inputs the stage left out since the agent started, by reason (`hostfs.REASONS`): GPU
    # processes whose /proc/<pid>/cgroup could not be read or used. Each drop costs that
    # process's pod names, never the others'.
    dropped: Mapping[Reason, int] = field(default_factory=dict)
    # Pods that hold a GPU (every pod with --pod-signals-all-pods) and have a cgroup here.
    pod_signals: tuple[PodSignals, ...] = ()
    # The idle and low-activity seconds above, each charged also to one cause
    # (agent/attribution/cause.py): summed over the causes, a workload's are its total.
    idle_cause_seconds_total: Mapping[CauseKey, float] = field(default_factory=dict)
    low_activity_cause_seconds_total: Mapping[CauseKey, float] = field(default_factory=dict)
    # Pods whose start-up (scheduling to first GPU activity) is known, while they live.
    startups: tuple[PodStartup, ...] = ()
    # Series the stage left out since the agent started, by reason (`WORKLOAD_LIMIT`).
    series_dropped: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Attributed:
    """One collection and what the attribution stage added to it: what a scrape renders.
    `attribution` is None where the stage itself failed (its failure is counted, and the
    collectors' series are rendered without names)."""

    collection: Collection
    attribution: Attribution | None
