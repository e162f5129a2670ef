"""Attribution records -> Prometheus samples."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuscope.exporters.prometheus.pod_signals import render_pod_signals

if TYPE_CHECKING:
    from gpuscope.agent.attribution.records import Attribution
    from gpuscope.exporters.prometheus.families import Families


def render_attribution(att: Attribution, out: Families) -> None:
    allocations: dict[tuple[str, ...], None] = {}  # two MIG devices of one GPU: one series
    for h in att.holdings:
        holder = (h.namespace, h.pod, h.container, h.workload.kind, h.workload.name)
        allocations[(str(h.gpu), h.uuid, *holder)] = None
        if h.mig_uuid:
            out.add("gpuscope_mig_allocation_info", (str(h.gpu), h.uuid, h.mig_uuid, *holder), 1)
    for allocation in allocations:
        out.add("gpuscope_gpu_allocation_info", allocation, 1)
    for g in att.gpus:
        gpu = (str(g.gpu), g.uuid)
        out.add("gpuscope_gpu_allocated", gpu, 1 if g.allocated else 0)
        if g.unallocated_memory_bytes is not None:
            out.add("gpuscope_gpu_unallocated_memory_bytes", gpu, g.unallocated_memory_bytes)
        if g.idle_seconds is not None:
            out.add("gpuscope_gpu_allocated_idle_seconds", gpu, g.idle_seconds)
    for m in att.migs:
        mig = (str(m.gpu), m.uuid, m.mig_uuid)
        out.add("gpuscope_mig_allocated", mig, 1 if m.allocated else 0)
        if m.idle_seconds is not None:
            out.add("gpuscope_mig_allocated_idle_seconds", mig, m.idle_seconds)
    for p in att.pods:
        out.add(
            "gpuscope_pod_info",
            (p.namespace, p.name, p.uid, p.workload.kind, p.workload.name, p.workload.replica),
            1,
        )
    for u in att.usage:
        labels = (
            str(u.gpu),
            u.uuid,
            u.pod.namespace,
            u.pod.name,
            u.pod.uid,
            u.container,
            u.pod.workload.kind,
            u.pod.workload.name,
        )
        if u.memory_bytes is not None:
            out.add("gpuscope_pod_gpu_memory_bytes", labels, u.memory_bytes)
        if u.utilization_ratio is not None:
            out.add("gpuscope_pod_gpu_utilization_ratio", labels, u.utilization_ratio)
    for (namespace, kind, name), seconds in sorted(att.idle_seconds_total.items()):
        out.add("gpuscope_workload_gpu_idle_seconds_total", (namespace, kind, name), seconds)
    for (namespace, kind, name), seconds in sorted(att.low_activity_seconds_total.items()):
        out.add(
            "gpuscope_workload_gpu_low_activity_seconds_total", (namespace, kind, name), seconds
        )
    for name, totals in (
        ("gpuscope_workload_gpu_idle_cause_seconds_total", att.idle_cause_seconds_total),
        ("gpuscope_workload_gpu_low_activity_cause_seconds_total",
         att.low_activity_cause_seconds_total),
    ):  # fmt: skip
        for cause_key, seconds in sorted(totals.items()):
            out.add(name, cause_key, seconds)
    for s in att.startups:
        pod = (s.pod.namespace, s.pod.name, s.pod.uid, s.pod.workload.kind, s.pod.workload.name)
        out.add("gpuscope_pod_gpu_startup_seconds", pod, s.seconds)
    for e in att.energy:
        out.add(
            "gpuscope_pod_gpu_energy_joules_total",
            (str(e.gpu), e.uuid, e.pod.namespace, e.pod.name, e.pod.uid,
             e.pod.workload.kind, e.pod.workload.name),
            e.joules,
        )  # fmt: skip
    for reason, count in att.dropped.items():
        out.add("gpuscope_inputs_dropped_total", ("attribution", reason), count)
    for why, series in att.series_dropped.items():  # pod_limit is the exporter's (pod_bound)
        out.add("gpuscope_series_dropped_total", ("attribution", why), series)
    render_pod_signals(att, out)
