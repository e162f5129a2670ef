"""Options of the attribution stage."""

from __future__ import annotations

from dataclasses import dataclass

from gpuscope.agent.attribution.activity import DEFAULT_BUSY_THRESHOLD, DEFAULT_SM_THRESHOLD
from gpuscope.agent.attribution.cause import (
    DEFAULT_PRESSURE_THRESHOLD,
    DEFAULT_RETRANSMIT_THRESHOLD,
)
from gpuscope.agent.attribution.retention import DEFAULT_GRACE, DEFAULT_MAX_WORKLOADS
from gpuscope.agent.k8s.podresources.gpus import DEFAULT_GPU_RESOURCES
from gpuscope.agent.runtime.options import ConfigError, flag, names, number


def _resources(flag_name: str, text: str) -> tuple[str, ...]:
    found = names(text)
    if not found:
        raise ConfigError(f"{flag_name}: expected at least one resource name")
    return found


def _ratio(v: float) -> str | None:
    return None if 0 <= v <= 1 else f"expected a ratio from 0 to 1, got {v:g}"


@dataclass(frozen=True, slots=True)
class AttributionOptions:
    """The attribution stage's flags: which resources are GPUs, the low-activity and idle-cause
    thresholds, how pods' cgroup signals are read, and how many pods and workloads keep series."""

    gpu_resource_names: tuple[str, ...] = flag(
        DEFAULT_GPU_RESOURCES,
        "comma-separated extended resources that are GPUs, besides nvidia.com/mig-* and AMD's "
        "partition resources such as amd.com/cpx_nps4 (add renamed shared resources such as "
        "nvidia.com/gpu.shared)",
        parse=_resources,
    )
    # gpuscope_workload_gpu_low_activity_seconds_total (agent/attribution/activity.py).
    low_activity_busy_threshold: float = flag(
        DEFAULT_BUSY_THRESHOLD,
        "NVML utilization ratio (0-1) at or above which an allocated GPU counts as busy for "
        "the low-activity seconds",
        check=_ratio,
    )
    low_activity_sm_threshold: float = flag(
        DEFAULT_SM_THRESHOLD,
        "GPM SM-active ratio (0-1) below which a busy allocated GPU counts as low-activity",
        check=_ratio,
    )
    # Applied by exporters/prometheus/pod_bound.py. The kubelet's default --max-pods is 110
    # and the largest limits in common use are about 250 (EKS with prefix delegation,
    # OpenShift, GKE's 256): 512 is twice that, headroom for pods that linger while they
    # finish, and keeps a dense node's scrape at a few thousand per-pod series.
    max_pods_per_scrape: int = flag(
        512,
        "most pods whose per-pod series one scrape exports (GPU-holding pods first, then by "
        "network bytes, then by name); the rest are counted in gpuscope_series_dropped_total",
        check=lambda v: None if 1 <= v <= 100_000 else f"expected 1 to 100000 pods, got {v}",
    )
    # agent/k8s/pod_cgroup_usage.py: pressure, throttling, block I/O and OOM kills per pod.
    pod_signals_interval: float = flag(
        1.0,
        "seconds between two reads of one pod's cgroup signals (scrapes in between reuse the "
        "last read)",
        parse=number,
        check=lambda v: None if 0.1 <= v <= 300 else f"expected 0.1 to 300 seconds, got {v:g}",
    )
    pod_signals_all_pods: bool = flag(
        False,
        "read the cgroup signals (gpuscope_pod_pressure_*, _cpu_throttled_*, _io_*, "
        "_oom_kills_total) of every pod on the node, not only of pods that hold a GPU "
        "(true/false)",
    )
    # The cause of idle and low-activity seconds (agent/attribution/cause.py).
    idle_cause_pressure_threshold: float = flag(
        DEFAULT_PRESSURE_THRESHOLD,
        "share of an interval (0-1) a holder pod's I/O, CPU (pressure or throttling) or memory "
        "must be stalled for its GPU's idle seconds to be charged to that cause",
        check=_ratio,
    )
    idle_cause_retransmit_threshold: float = flag(
        DEFAULT_RETRANSMIT_THRESHOLD,
        "TCP retransmits per second of a holder pod (net collector) at which idle seconds "
        "without pressure are charged to cause network",
        check=lambda v: None if v >= 0 else f"expected 0 or more per second, got {v:g}",
    )
    # How long and how many per-workload counters are kept (agent/attribution/retention.py
    # says why 300 s and 256).
    workload_prune_grace: float = flag(
        DEFAULT_GRACE,
        "seconds a workload's idle and low-activity counters outlive its last GPU allocation "
        "(one that comes back later starts again at 0, a reset to rate() and increase())",
        check=lambda v: None if 0 <= v <= 86_400 else f"expected 0 to 86400 seconds, got {v:g}",
    )
    max_workloads: int = flag(
        DEFAULT_MAX_WORKLOADS,
        "most workloads whose per-workload counters are kept; past it the one that held no GPU "
        "for longest goes first, counted in gpuscope_series_dropped_total",
        check=lambda v: None if 1 <= v <= 100_000 else f"expected 1 to 100000 workloads, got {v}",
    )
