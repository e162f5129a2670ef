"""Metrics of the attribution stage: who holds each GPU, what pods use, what sits idle."""

from __future__ import annotations

from gpuscope.exporters.prometheus.spec import GPU, MetricSpec

WORKLOAD = ("workload_kind", "workload")
POD_GPU = (*GPU, "namespace", "pod", "pod_uid", "container", *WORKLOAD)
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
        "(nvmlDeviceGetComputeRunningProcesses; processes mapped to pods by their cgroup).",
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
        "GPUs with compute processes, not in MIG mode (NVML has no per-process utilization there).",
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
        KUBELET_NOTE + " Not on MIG-enabled GPUs (no utilization).",
    ),
    MetricSpec(
        "gpuscope_workload_gpu_idle_seconds_total",
        "counter",
        "GPU-seconds spent allocated and idle, by the holder's namespace and workload (a "
        "shared GPU splits its idle time between its workloads): increase() over a week is "
        "the GPU-hours the team wasted. (Not gpuscope_gpu_allocated_idle_seconds_total: in "
        "OpenMetrics that counter's family name would clash with the gauge's.)",
        ("namespace", *WORKLOAD),
        "attribution",
        "Workloads that held a GPU in the last 15 minutes (then dropped: increase() treats "
        "a returning series as a reset).",
    ),
)
