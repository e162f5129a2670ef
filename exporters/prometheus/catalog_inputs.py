"""Metrics of inputs a stage could not use: what was dropped, rather than failing a scrape."""

from __future__ import annotations

from gpuscope.agent.hostfs import REASONS
from gpuscope.exporters.prometheus.spec import MetricSpec

INPUT_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "gpuscope_inputs_dropped_total",
        "counter",
        "Inputs a stage left out because they could not be read or used, by reason: "
        + ", ".join(REASONS)
        + " (unreadable: permission or I/O error; loop: a symbolic link loop; too_large: a "
        "file over the read cap; invalid: content that could not be parsed). For "
        'stage="attribution", GPU processes whose /proc/<pid>/cgroup failed (their memory '
        "and utilization are on no pod series) and pod cgroup files (pressure, cpu.stat, "
        'io.stat, memory.events: that signal is absent); for stage="nic" and "rdma", files '
        "under --sysfs, whose values are absent. Bytes that are not UTF-8 drop nothing: they are "
        "kept, written \\xNN.",
        ("stage", "reason"),
        "attribution",
        "Every reason, for the attribution stage and the nic and rdma collectors that are "
        "enabled, from the first scrape (0 until a drop). One log line per failing file and "
        "change of state, never one per scrape.",
    ),
    MetricSpec(
        "gpuscope_series_dropped_total",
        "counter",
        "Series left out of scrapes to keep them bounded, by the collector or stage that "
        'rendered them and reason. reason="pod_limit": the per-pod series (every family '
        "with a pod or pod_uid label) of the pods past --max-pods-per-scrape; pods that "
        "hold or use a GPU are kept first, then by network bytes sent and received, then "
        "by namespace and name; host-level, device and per-workload series are never "
        'dropped for it; counts series per scrape. reason="workload_limit" (the attribution '
        "stage): per-workload idle and low-activity series past --max-workloads: a workload "
        "that held no GPU for longest dropped before its --workload-prune-grace (its series, "
        "once) and a holder left without a place (its series, per evaluation). rate() > 0 "
        "means series are being left out.",
        ("collector", "reason"),
        "attribution",
        "The attribution stage (both reasons) and each enabled collector with per-pod series "
        "(pod_limit), from the first scrape (0 until a drop). One log line when the node goes "
        "over a bound and one when it is back, never one per scrape.",
    ),
)
