"""Every metric gpuscope exports: the public contract, in one place.

The exporter refuses to emit a metric that is not in its `Catalog` or with labels other than
those declared, and `docs/metrics.md` is generated from the catalog (a test fails when the
two drift), so the documentation cannot lie about the output. Each collector's renderer
declares its metrics (usually from its `catalog_<collector>.py`); `Catalog.assemble` puts
them in export order: the agent's own, every collector's in the order given (the
registry's), then the attribution stage's.

The catalog is a value handed to the exporter, not looked up: which collectors exist is the
app's knowledge (agent/app/registry.py, `catalog()`), and the exporters import nothing of
the app.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuscope.exporters.prometheus.catalog_gpu import BUILD_INFO
from gpuscope.exporters.prometheus.catalog_inputs import INPUT_METRICS
from gpuscope.exporters.prometheus.catalog_pods import ATTRIBUTION_METRICS
from gpuscope.exporters.prometheus.spec import MetricSpec

__all__ = ["Catalog", "MetricSpec"]

AGENT_METRICS: tuple[MetricSpec, ...] = (
    # --- the agent itself -------------------------------------------------------------------
    BUILD_INFO,  # declared with NVIDIA's metrics: its library label is named for NVIDIA's
    MetricSpec(
        "gpuscope_collector_success",
        "gauge",
        "1 if the collector's last collection succeeded, 0 if it failed or its source is absent.",
        ("collector",),
        "agent",
        "Every enabled collector, on every scrape.",
    ),
    MetricSpec(
        "gpuscope_collector_absent",
        "gauge",
        "Always 1, while the vendor library the collector reads is not installed on this "
        "host (the amd collector on an NVIDIA node, gpu on an AMD one): "
        "gpuscope_collector_success is 0 but nothing is failing. GpuscopeCollectorFailing "
        "leaves such collectors out; a library that is there with its driver not loaded is "
        "not absent in this sense, and fires it.",
        ("collector",),
        "agent",
        "Only while the collector's source is absent, at every detail level.",
    ),
    MetricSpec(
        "gpuscope_collector_duration_seconds",
        "gauge",
        "Time the collector's last collection took; for a stuck one, how long its collection "
        "in flight has run.",
        ("collector",),
        "agent",
        "Every enabled collector, on every scrape.",
    ),
    MetricSpec(
        "gpuscope_collector_stuck",
        "gauge",
        "1 while the collector's collection has run past the deadline (--collect-deadline) "
        "and not returned: it is hung, not failing. Its last good series are served meanwhile "
        '(up to 5 minutes old). collector="attribution" is the attribution stage.',
        ("collector",),
        "agent",
        "Every enabled collector and the attribution stage, on every scrape.",
    ),
    MetricSpec(
        "gpuscope_collector_last_success_timestamp_seconds",
        "gauge",
        "When the collector last collected successfully (Unix time); "
        "`time() - this` is how stale its data is.",
        ("collector",),
        "agent",
        "Once the collector (or the attribution stage) has succeeded at least once.",
    ),
    MetricSpec(
        "gpuscope_agent_threads",
        "gauge",
        "Threads of the agent process, native ones (NVML, AMD SMI) included. Grows by one "
        "per stuck collector or GPU at most.",
        (),
        "agent",
    ),
)

# The agent's own process, under the names every Prometheus client library gives them (so
# the usual exporter dashboards and alerts work): the one exception to the gpuscope_ prefix.
PROCESS_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "process_cpu_seconds_total",
        "counter",
        "User and system CPU time the agent process has used.",
        (),
        "process",
    ),
    MetricSpec(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory of the agent process (what a container memory limit counts).",
        (),
        "process",
    ),
    MetricSpec(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory of the agent process.",
        (),
        "process",
    ),
    MetricSpec(
        "process_start_time_seconds",
        "gauge",
        "When the agent process started (Unix time).",
        (),
        "process",
    ),
    MetricSpec(
        "process_open_fds", "gauge", "Open file descriptors of the agent process.", (), "process"
    ),
    MetricSpec(
        "process_max_fds",
        "gauge",
        "The agent process's limit on open file descriptors (soft RLIMIT_NOFILE).",
        (),
        "process",
    ),
)


@dataclass(frozen=True, eq=False)
class Catalog:
    """The metrics one agent may export, in export order. Compared and hashed by identity:
    an agent builds one and the per-catalog caches (families.py) key on it."""

    metrics: tuple[MetricSpec, ...]
    by_name: Mapping[str, MetricSpec] = field(init=False)
    order: Mapping[str, int] = field(init=False)

    def __post_init__(self) -> None:
        # A family several vendors' collectors render (gpuscope_gpu_info, ...) is declared
        # once and listed by each: the same declaration counts once, at its first place.
        object.__setattr__(self, "metrics", tuple(dict.fromkeys(self.metrics)))
        by_name = {m.name: m for m in self.metrics}
        if len(by_name) != len(self.metrics):
            twice = [name for name, n in Counter(m.name for m in self.metrics).items() if n > 1]
            raise ValueError(f"metrics declared twice, differently: {', '.join(twice)}")
        object.__setattr__(self, "by_name", by_name)
        object.__setattr__(self, "order", {m.name: i for i, m in enumerate(self.metrics)})

    @classmethod
    def assemble(cls, collectors_metrics: Iterable[tuple[MetricSpec, ...]]) -> Catalog:
        """The agent's own metrics, each collector's (in the order given), the attribution
        stage's and its inputs'."""
        return cls(
            (
                *AGENT_METRICS,
                *PROCESS_METRICS,
                *(m for metrics in collectors_metrics for m in metrics),
                *ATTRIBUTION_METRICS,
                *INPUT_METRICS,
            )
        )

    def of_source(self, source: str) -> tuple[MetricSpec, ...]:
        return tuple(m for m in self.metrics if m.source == source)
