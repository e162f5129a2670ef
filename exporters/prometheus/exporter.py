"""The Prometheus exporter: one fresh set of families per scrape, built from records.

`PrometheusExporter` implements prometheus_client's `Collector` protocol (its `collect()` is
that library's verb) and is registered in its own `CollectorRegistry` (made on first use:
only OpenMetrics needs it, so this module does not import prometheus_client); gpuscope's own
collectors are declared by a `CollectorSpec` (agent/runtime/spec.py). Nothing is kept
between scrapes, so a GPU or pod that disappears stops being exported at once (module-level
gauges would keep it forever).
Each source is rendered into its own batch and merged only if rendering succeeded: a bug in
one renderer marks that collector failed and leaves the rest of the scrape intact.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import gpuscope
from gpuscope.exporters.prometheus.attribution import render_attribution
from gpuscope.exporters.prometheus.families import Families
from gpuscope.exporters.prometheus.pod_bound import PodBound, per_pod_sources
from gpuscope.exporters.prometheus.render import CompatRenderer, RenderContext, Renderer
from gpuscope.exporters.scrape import ATTRIBUTION_STAGE, Scrape

if TYPE_CHECKING:
    from prometheus_client.core import Metric

    from gpuscope.agent.accelerators.records import AnyAccelerators
    from gpuscope.agent.runtime.self_stats import ProcessStats
    from gpuscope.agent.runtime.sources import Keyed, SourceResult
    from gpuscope.exporters.prometheus.catalog import Catalog
    from gpuscope.exporters.prometheus.detail import MetricSelection

log = logging.getLogger("gpuscope.exporter")


@dataclass(frozen=True, slots=True)
class Exposition:
    """Everything the exporter is told, once, by whoever wires it (agent/app/exposition.py):
    what may be exported, how each enabled collector renders, and what the flags select.
    The exporter reads no configuration and knows no registry."""

    catalog: Catalog
    renderers: Mapping[str, Renderer[Any, Any]]  # by collector name: the enabled ones
    options: Mapping[str, Any]  # by collector name: its declared options, for RenderContext
    selection: MetricSelection
    max_pods_per_scrape: int
    node_label: str | None = None  # node="<this>" on every series (--series-node-label)
    # The enabled accelerator collectors (role ACCELERATOR), in registry order.
    accelerators: tuple[Keyed[AnyAccelerators], ...] = ()
    # dcgm-exporter's names (--dcgm-compat); None when the option is off.
    compat: CompatRenderer[Any] | None = None

    def pod_bound(self) -> PodBound:
        """The bound, with a counter for each enabled collector with per-pod series and for
        the attribution stage."""
        sources = per_pod_sources(self.catalog.metrics) & {*self.renderers, ATTRIBUTION_STAGE}
        return PodBound(self.max_pods_per_scrape, sources)


class PrometheusExporter:
    def __init__(self, scrape: Callable[[], Scrape], exposition: Exposition) -> None:
        """`scrape`: what one scrape renders (the agent's sources and stages, collected)."""
        self._scrape = scrape
        self._exposition = exposition
        self._catalog = exposition.catalog
        self._renderers = exposition.renderers
        self._render_failed: set[str] = set()
        self._pod_bound = exposition.pod_bound()
        self._selection = exposition.selection

    def describe(self) -> list[Metric]:
        return []  # nothing to describe up front; keeps registration from collecting

    def collect(self) -> Iterator[Metric]:
        yield from self.families().metrics()

    def render_text(self) -> bytes:
        """The text exposition of a fresh collection (the fast path for /metrics)."""
        return self.families().render_text()

    def families(self) -> Families:
        scraped = self._scrape()
        collection, attribution = scraped.collection, scraped.attribution
        out = Families(self._catalog, self._selection)
        if self._exposition.node_label is not None:
            out.with_constant_labels({"node": self._exposition.node_label})
        out.add("gpuscope_build_info", _build_labels(scraped, self._exposition.accelerators), 1)
        for name, result in collection.results.items():
            ok = result.success
            renderer = self._renderers.get(name)
            # A stuck collector's last good records are served (flagged by
            # gpuscope_collector_stuck), so its series do not vanish while it hangs.
            if (ok or result.stuck) and result.records is not None and renderer is not None:
                ctx = RenderContext(self._exposition.options.get(name), attribution)
                rendered = self._render_collector(name, renderer, result.records, ctx, out)
                ok = ok and rendered
            _status(out, result, ok)
        if scraped.attribution_status is not None:
            _status(out, scraped.attribution_status, scraped.attribution_status.success)
        if attribution is not None:
            self._render("attribution", out, lambda batch: render_attribution(attribution, batch))
        if self._exposition.compat is not None:
            self._render_compat(self._exposition.compat, scraped, out)
        self._pod_bound.apply(out)  # after every per-pod family is rendered
        if scraped.process is not None:
            _process(out, scraped.process)
        return out

    def _render_collector(
        self,
        name: str,
        renderer: Renderer[Any, Any],
        records: Any,
        ctx: RenderContext[Any],
        out: Families,
    ) -> bool:
        return self._render(name, out, lambda batch: renderer.render(records, batch, ctx))

    def _render_compat(self, compat: CompatRenderer[Any], scraped: Scrape, out: Families) -> None:
        """Another exporter's names from its collector's records as they are served (a
        stuck collector's last good ones too), and the holders attribution found; a
        failure leaves them out of this scrape, and the rest of it intact."""
        result = scraped.collection.result(compat.records)
        if result is None or result.records is None or not (result.success or result.stuck):
            return
        records, attribution = result.records, scraped.attribution
        self._render(compat.name, out, lambda batch: compat.render(records, attribution, batch))

    def _render(self, name: str, out: Families, render: Callable[[Families], None]) -> bool:
        """Render into a batch of its own, merged only if rendering succeeded: one broken
        renderer marks its collector failed and leaves the rest of the scrape intact."""
        batch = Families(self._catalog, self._selection)
        try:
            render(batch)
        except Exception:
            if name not in self._render_failed:
                log.exception("rendering collector %s failed", name)
                self._render_failed.add(name)
            return False
        self._render_failed.discard(name)
        out.merge(batch)
        return True


def _status(out: Families, result: SourceResult[Any], ok: bool) -> None:
    """The health series of one collector (or the attribution stage)."""
    out.add("gpuscope_collector_success", (result.name,), 1 if ok else 0)
    if result.not_installed:  # only then, at every level: rules select it without comparing
        out.add("gpuscope_collector_absent", (result.name,), 1)
    out.add("gpuscope_collector_duration_seconds", (result.name,), result.duration_seconds)
    out.add("gpuscope_collector_stuck", (result.name,), 1 if result.stuck else 0)
    if result.last_success is not None:
        out.add(
            "gpuscope_collector_last_success_timestamp_seconds", (result.name,), result.last_success
        )


def _process(out: Families, stats: ProcessStats) -> None:
    out.add("gpuscope_agent_threads", (), stats.threads)
    out.add("process_cpu_seconds_total", (), stats.cpu_seconds)
    out.add("process_resident_memory_bytes", (), stats.resident_memory_bytes)
    out.add("process_virtual_memory_bytes", (), stats.virtual_memory_bytes)
    out.add("process_start_time_seconds", (), stats.start_time_seconds)
    out.add("process_open_fds", (), stats.open_fds)
    out.add("process_max_fds", (), stats.max_fds)


def _build_labels(
    scraped: Scrape, accelerators: Sequence[Keyed[AnyAccelerators]]
) -> tuple[str, str, str, str]:
    """The agent's versions, and the accelerator library's and driver's: those of the first
    accelerator collector that read its devices (empty where none did)."""
    for key in accelerators:
        snapshot = scraped.collection.records(key)
        if snapshot is not None:
            library, driver = snapshot.library_version, snapshot.driver_version
            return (gpuscope.__version__, sys.version.split()[0], library, driver)
    return (gpuscope.__version__, sys.version.split()[0], "", "")
