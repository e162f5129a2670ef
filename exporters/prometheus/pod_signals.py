"""Pods' cgroup signals (Attribution.pod_signals) -> Prometheus samples. A signal a pod's
cgroup lacks is left out, never written as 0."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuscope.agent.attribution.records import Attribution
    from gpuscope.agent.k8s.pod_cgroup_usage import Pressure
    from gpuscope.exporters.prometheus.families import Families

PRESSURE = "gpuscope_pod_pressure_stalled_seconds_total"


def render_pod_signals(att: Attribution, out: Families) -> None:
    for s in att.pod_signals:
        p, u = s.pod, s.usage
        pod = (p.namespace, p.name, p.uid, p.workload.kind, p.workload.name)
        pressures: tuple[tuple[str, Pressure | None], ...] = (
            ("cpu", u.cpu_pressure),
            ("memory", u.memory_pressure),
            ("io", u.io_pressure),
        )
        for resource, pressure in pressures:
            if pressure is None:
                continue
            out.add(PRESSURE, (*pod, resource, "some"), pressure.some_seconds)
            if pressure.full_seconds is not None:
                out.add(PRESSURE, (*pod, resource, "full"), pressure.full_seconds)
        if u.cpu_throttled_periods is not None:
            out.add("gpuscope_pod_cpu_throttled_periods_total", pod, u.cpu_throttled_periods)
        if u.cpu_throttled_seconds is not None:
            out.add("gpuscope_pod_cpu_throttled_seconds_total", pod, u.cpu_throttled_seconds)
        for name, direction, value in (
            ("gpuscope_pod_io_bytes_total", "read", u.io_read_bytes),
            ("gpuscope_pod_io_bytes_total", "write", u.io_write_bytes),
            ("gpuscope_pod_io_operations_total", "read", u.io_read_operations),
            ("gpuscope_pod_io_operations_total", "write", u.io_write_operations),
        ):
            if value is not None:
                out.add(name, (*pod, direction), value)
        if u.oom_kills is not None:
            out.add("gpuscope_pod_oom_kills_total", pod, u.oom_kills)
