"""Metrics of the pods' cgroup signals (agent/k8s/pod_cgroup_usage.py): why a GPU waits."""

from __future__ import annotations

from gpuscope.exporters.prometheus.spec import MetricSpec

POD = ("namespace", "pod", "pod_uid", "workload_kind", "workload")
WHERE = (
    "Pods that hold a GPU (every pod with --pod-signals-all-pods) whose cgroup has the "
    "file{extra}; absent, not 0, where it does not (controller not enabled, kernel without "
    "PSI). Read at most once per --pod-signals-interval per pod. Names are empty while the "
    "Kubernetes API has not named the pod."
)

POD_SIGNAL_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "gpuscope_pod_pressure_stalled_seconds_total",
        "counter",
        "Time the pod's tasks were stalled waiting for a resource (pressure stall "
        "information, the pod cgroup's cpu.pressure, memory.pressure and io.pressure "
        '`total`): `stall="some"` while at least one task waited, `stall="full"` while '
        "all of them did. rate() is the share of time lost: an io some ratio near 1 beside "
        "an idle GPU is a data loader waiting on storage.",
        (*POD, "resource", "stall"),
        "attribution",
        WHERE.format(extra=" (cgroup v2 with PSI); `full` where the kernel writes it"),
    ),
    MetricSpec(
        "gpuscope_pod_cpu_throttled_periods_total",
        "counter",
        "CFS periods in which the pod's cgroup hit its CPU limit (cpu.stat nr_throttled): "
        "a CPU limit starving the input pipeline.",
        POD,
        "attribution",
        WHERE.format(extra=" with the cpu controller (v2 cpu.stat, or v1 cpu/ on hybrid hosts)"),
    ),
    MetricSpec(
        "gpuscope_pod_cpu_throttled_seconds_total",
        "counter",
        "Time the pod's cgroup was throttled by its CPU limit (cpu.stat throttled_usec, or "
        "throttled_time on cgroup v1).",
        POD,
        "attribution",
        WHERE.format(extra=" with the cpu controller (v2 cpu.stat, or v1 cpu/ on hybrid hosts)"),
    ),
    MetricSpec(
        "gpuscope_pod_io_bytes_total",
        "counter",
        "Bytes the pod's cgroup read from or wrote to block devices, summed over devices, by "
        "direction (read, write): cgroup v2 io.stat rbytes and wbytes, or v1 "
        "blkio.throttle.io_service_bytes_recursive. Page-cache hits and network file systems "
        "are not block I/O.",
        (*POD, "direction"),
        "attribution",
        WHERE.format(
            extra=" (v2 io controller; v1 blkio on hybrid hosts, where recent kernels count "
            "only the devices a throttle rule is set on)"
        ),
    ),
    MetricSpec(
        "gpuscope_pod_io_operations_total",
        "counter",
        "Block I/O operations of the pod's cgroup by direction (read, write): io.stat rios "
        "and wios, or v1 blkio.throttle.io_serviced_recursive.",
        (*POD, "direction"),
        "attribution",
        WHERE.format(extra=" (as gpuscope_pod_io_bytes_total)"),
    ),
    MetricSpec(
        "gpuscope_pod_oom_kills_total",
        "counter",
        "Processes of the pod killed by the OOM killer for its memory limit (memory.events "
        "oom_kill, or v1 memory.oom_control oom_kill).",
        POD,
        "attribution",
        WHERE.format(extra=" with the memory controller"),
    ),
)

CAUSE_RULE = (
    "The cause of an interval comes from the workload's holder pods of that device over the "
    "same interval: input_io, cpu or memory when the largest of the pods' I/O pressure, CPU "
    "(pressure or throttled time) and memory pressure stalls (`some`) is at least "
    "--idle-cause-pressure-threshold (default 0.10) of the interval; else network when their "
    "TCP retransmits reach --idle-cause-retransmit-threshold (default 1 per second; net "
    "collector only); else none when all three were measured; else unknown (a signal could "
    "not be read: no cause claimed without evidence). Summed over cause, equals "
)
CAUSE_LABELS = ("namespace", "workload_kind", "workload", "cause")

# Why is this GPU idle (issue #16): start-up time and the causes of idle seconds.
WHY_IDLE_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "gpuscope_pod_gpu_startup_seconds",
        "gauge",
        "Seconds from the pod's scheduling (its PodScheduled condition's lastTransitionTime) "
        "to the first GPU activity of its processes (nonzero SM utilization; on MIG, its GPU "
        "instance's GPM activity): image pulls, data staging and initialisation. Precise to "
        "one attribution evaluation (about a scrape interval).",
        POD,
        "attribution",
        "Pods the agent watched from their scheduling, once one of their processes was active "
        "on a GPU; kept while the pod is listed. Absent, never a guess, for pods scheduled "
        "before the agent's watch began (or already active when it first saw them).",
    ),
    MetricSpec(
        "gpuscope_workload_gpu_idle_cause_seconds_total",
        "counter",
        "The idle GPU-seconds of gpuscope_workload_gpu_idle_seconds_total, each charged to "
        "one cause (input_io, cpu, memory, network, none, unknown). "
        + CAUSE_RULE
        + "gpuscope_workload_gpu_idle_seconds_total.",
        CAUSE_LABELS,
        "attribution",
        "As gpuscope_workload_gpu_idle_seconds_total, every cause from 0.",
    ),
    MetricSpec(
        "gpuscope_workload_gpu_low_activity_cause_seconds_total",
        "counter",
        "The low-activity GPU-seconds of gpuscope_workload_gpu_low_activity_seconds_total, "
        "each charged to one cause (input_io, cpu, memory, network, none, unknown). "
        + CAUSE_RULE
        + "gpuscope_workload_gpu_low_activity_seconds_total.",
        CAUSE_LABELS,
        "attribution",
        "As gpuscope_workload_gpu_low_activity_seconds_total, every cause from 0.",
    ),
)
