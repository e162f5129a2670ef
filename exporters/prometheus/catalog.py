"""Every metric gpuscope exports: the public contract, in one place.

The exporter refuses to emit a metric that is not declared here or with labels other than
those declared, and `docs/metrics.md` is generated from this table (a test fails when the
two drift), so the documentation cannot lie about the output. Each collector's renderer
declares its metrics (usually from its `catalog_<collector>.py`); this module assembles them
in export order: the agent's own, every collector's in registry order, then the
attribution stage's.
"""

from __future__ import annotations

from gpuscope.agent.registry import COLLECTORS
from gpuscope.exporters.prometheus.catalog_pods import ATTRIBUTION_METRICS
from gpuscope.exporters.prometheus.render import renderer_of
from gpuscope.exporters.prometheus.spec import MetricSpec

__all__ = ["BY_NAME", "METRICS", "ORDER", "MetricSpec"]

AGENT_METRICS: tuple[MetricSpec, ...] = (
    # --- the agent itself -------------------------------------------------------------------
    MetricSpec(
        "gpuscope_build_info",
        "gauge",
        "Always 1; labels identify the agent build and the NVIDIA driver it talks to.",
        ("version", "python_version", "nvml_version", "driver_version"),
        "agent",
        "Always. Driver labels are empty when NVML is unavailable.",
    ),
    MetricSpec(
        "gpuscope_collector_success",
        "gauge",
        "1 if the collector's last collection succeeded, 0 if it failed or its source is absent.",
        ("collector",),
        "agent",
        "Every enabled collector, on every scrape.",
    ),
    MetricSpec(
        "gpuscope_collector_duration_seconds",
        "gauge",
        "Time the collector's last collection took.",
        ("collector",),
        "agent",
        "Every enabled collector, on every scrape.",
    ),
)

METRICS: tuple[MetricSpec, ...] = (
    *AGENT_METRICS,
    *(m for c in COLLECTORS if (r := renderer_of(c)) is not None for m in r.metrics),
    *ATTRIBUTION_METRICS,
)

BY_NAME: dict[str, MetricSpec] = {m.name: m for m in METRICS}
ORDER: dict[str, int] = {m.name: i for i, m in enumerate(METRICS)}
