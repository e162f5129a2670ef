"""Metrics of the attribution stage: who holds each GPU, what pods use, what sits idle."""

from __future__ import annotations

from gpuscope.exporters.prometheus.catalog_pod_signals import (
    POD_SIGNAL_METRICS,
    WHY_IDLE_METRICS,
)
from gpuscope.exporters.prometheus.spec import GPU, MetricSpec

WORKLOAD = ("workload_kind", "workload")
POD_GPU = (*GPU, "namespace", "pod", "pod_uid", "container", *WORKLOAD)
MIG = (*GPU, "mig_uuid")
MIG_NOTE = (
    " MIG devices of GPUs with NVML GPM (Hopper and later): idle and busy come from the GPU "
    "instance's GPM graphics-engine activity, shared by its MIG devices."
)
KUBELET_NOTE = "While the kubelet's PodResources API answers (collector kubelet)."

ATTRIBUTION_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "gpuscope_gpu_allocation_info",
        "gauge",
        "Always 1; one series per (GPU, container) allocation from the kubelet: a GPU shared "
        "by time-slicing has one per holder; a MIG instance counts for its GPU. Join with "
        "`* on(uuid) group_left(namespace, pod, workload) gpuscope_gpu_allocation_info`.",
        (*GPU, "namespace", "pod", "container", *WORKLOAD),
        "attribution",
        KUBELET_NOTE + " Workload labels are empty until the Kubernetes API names the pod.",
    ),
    MetricSpec(
        "gpuscope_gpu_allocated",
        "gauge",
        "1 if the kubelet has allocated the GPU (or a MIG instance or share of it) to a "
        "container, else 0.",
        GPU,
        "attribution",
        KUBELET_NOTE + " Every GPU that answers NVML.",
    ),
    MetricSpec(
        "gpuscope_pod_info",
        "gauge",
        "Always 1; the pod's workload (resolved from framework labels and owners: JobSet, "
        "Kubeflow, Volcano, LeaderWorkerSet, Ray, Job, controller owners, else the pod) and "
        "its replica in it (rank, index, ordinal).",
        ("namespace", "pod", "pod_uid", *WORKLOAD, "replica"),
        "attribution",
        "Pods that hold a GPU, run a GPU process or have network series, once the "
        "Kubernetes API has named them.",
    ),
    MetricSpec(
        "gpuscope_pod_gpu_memory_bytes",
        "gauge",
        "GPU memory held by the container's processes on the GPU "
        "(the vendor library's list of compute processes; processes mapped to pods by their "
        "cgroup).",
        POD_GPU,
        "attribution",
        'GPUs with compute processes. Processes outside every pod: `pod=""`, `pod_uid=""`. '
        "Names are empty while the Kubernetes API has not named the pod.",
    ),
    MetricSpec(
        "gpuscope_pod_gpu_utilization_ratio",
        "gauge",
        "SM utilization by the container's processes on the GPU (0-1), the mean of NVML's "
        "per-process samples since the previous scrape: splits a time-sliced GPU by pod.",
        POD_GPU,
        "attribution",
        "GPUs with compute processes. On MIG (no per-process utilization in NVML): the GPU "
        "instance's GPM graphics-engine activity, for a container whose processes are the only "
        "ones in one GPU instance; absent otherwise and on MIG GPUs without GPM.",
    ),
    MetricSpec(
        "gpuscope_gpu_unallocated_memory_bytes",
        "gauge",
        "GPU memory held by processes of pods the kubelet did not allocate this GPU to, or by "
        "host processes: a job using GPUs it never requested.",
        GPU,
        "attribution",
        KUBELET_NOTE + " Pods the Kubernetes API never named are not counted.",
    ),
    MetricSpec(
        "gpuscope_gpu_allocated_idle_seconds",
        "gauge",
        "While the GPU is allocated: seconds since the later of the allocation's start (as "
        "first seen by the agent) and the GPU's last activity above --idle-threshold, from the "
        "sampler; memory held does not count as activity. 0 when not allocated.",
        GPU,
        "attribution",
        KUBELET_NOTE + " Not on MIG-enabled GPUs (see gpuscope_mig_allocated_idle_seconds).",
    ),
    MetricSpec(
        "gpuscope_workload_gpu_idle_seconds_total",
        "counter",
        "GPU-seconds spent allocated and idle, by the holder's namespace and workload (a "
        "shared GPU splits its idle time between its workloads; a MIG device counts its GPU "
        "instance's idle time times its share of the GPU's compute slices, so seven idle 1g "
        "devices add up to one GPU): increase() over a week is "
        "the GPU-hours the team wasted. (Not gpuscope_gpu_allocated_idle_seconds_total: in "
        "OpenMetrics that counter's family name would clash with the gauge's.)",
        ("namespace", *WORKLOAD),
        "attribution",
        "Workloads that held a GPU within --workload-prune-grace (300 s), at most "
        "--max-workloads (256); then dropped, and a workload that comes back starts again at "
        "0 (increase() and rate() read it as a reset).",
    ),
    MetricSpec(
        "gpuscope_mig_allocation_info",
        "gauge",
        "Always 1; one series per (MIG device, container) allocation from the kubelet "
        "(resources nvidia.com/mig-*, by MIG UUID). Joins every gpuscope_mig_* series to its "
        "pod: `* on(mig_uuid) group_left(namespace, pod, workload) "
        "gpuscope_mig_allocation_info`.",
        (*MIG, "namespace", "pod", "container", *WORKLOAD),
        "attribution",
        KUBELET_NOTE + " Workload labels are empty until the Kubernetes API names the pod.",
    ),
    MetricSpec(
        "gpuscope_mig_allocated",
        "gauge",
        "1 if the kubelet has allocated the MIG device to a container, else 0.",
        MIG,
        "attribution",
        KUBELET_NOTE + " Every MIG device of a GPU that answers NVML.",
    ),
    MetricSpec(
        "gpuscope_mig_allocated_idle_seconds",
        "gauge",
        "While the MIG device is allocated: seconds since the later of the allocation's start "
        "and the GPU instance's last GPM window with graphics-engine activity above "
        "--idle-threshold, right to within one evaluation (about a scrape interval). 0 when "
        "not allocated.",
        MIG,
        "attribution",
        KUBELET_NOTE + MIG_NOTE,
    ),
    MetricSpec(
        "gpuscope_workload_gpu_low_activity_seconds_total",
        "counter",
        "Busy on paper, idle in fact: GPU-seconds an allocated GPU's NVML utilization averaged "
        "at or above --low-activity-busy-threshold (default 0.5) while its GPM SM activity "
        "averaged below --low-activity-sm-threshold (default 0.1), by the holder's namespace "
        "and workload; judged per evaluation interval (about the scrape interval) from the "
        "sampler's exact integrals. A shared GPU splits the time equally; a MIG device uses "
        "its GPU instance's GPM graphics-engine activity as busy and counts its share of the "
        "GPU. Compare gpuscope_workload_gpu_idle_seconds_total (no kernel at all).",
        ("namespace", *WORKLOAD),
        "attribution",
        "Workloads that held a GPU with NVML GPM (Hopper and later), kept as "
        "gpuscope_workload_gpu_idle_seconds_total is; absent, not 0, for GPUs without GPM.",
    ),
    MetricSpec(
        "gpuscope_pod_gpu_energy_joules_total",
        "counter",
        "The GPU's energy (gpuscope_gpu_energy_joules_total) credited to the pods holding it, "
        "integrated per evaluation: all of it on a GPU one pod holds; by each pod's share of "
        "per-process SM utilization on a time-sliced GPU (equally when none ran a kernel); on "
        "MIG by each MIG device's share of the GPU's compute slices, to its holders. Starts at "
        "0 when the agent first sees the pod on the GPU; a pod that leaves keeps nothing (its "
        "series ends).",
        (*GPU, "namespace", "pod", "pod_uid", *WORKLOAD),
        "attribution",
        KUBELET_NOTE + " GPUs with an energy counter or power reading; `pod_uid` is empty "
        "until the Kubernetes API names the pod.",
    ),
    *POD_SIGNAL_METRICS,
    *WHY_IDLE_METRICS,
)
