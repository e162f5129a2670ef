"""The Prometheus collector: one fresh set of families per scrape, built from records.

Registered in its own `CollectorRegistry`. Nothing is kept between scrapes, so a GPU or pod
that disappears stops being exported at once (module-level gauges would keep it forever).
Each source is rendered into its own batch and merged only if rendering succeeded: a bug in
one renderer marks that collector failed and leaves the rest of the scrape intact.
"""

from __future__ import annotations

import logging
import platform
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

import gpuscope
from gpuscope.agent.attribution.records import Attribution
from gpuscope.agent.gpu.records import GpuSnapshot
from gpuscope.agent.sources import Collection
from gpuscope.exporters.prometheus.attribution import render_attribution
from gpuscope.exporters.prometheus.families import Families
from gpuscope.exporters.prometheus.gpu import render_gpu
from gpuscope.exporters.prometheus.net import render_net
from gpuscope.exporters.prometheus.net_devices import render_nic, render_rdma

log = logging.getLogger("gpuscope.exporter")

Renderer = Callable[[Any, Families], None]

RENDERERS: Mapping[str, Renderer] = {
    "gpu": render_gpu,
    "net": render_net,
    "nic": render_nic,
    "rdma": render_rdma,
}


class GpuscopeCollector(Collector):
    def __init__(
        self,
        collect: Callable[[], Collection],
        renderers: Mapping[str, Renderer] = RENDERERS,
    ) -> None:
        self._collect = collect
        self._renderers = renderers
        self._render_failed: set[str] = set()

    def describe(self) -> list[Metric]:
        return []  # nothing to describe up front; keeps registration from collecting

    def collect(self) -> Iterator[Metric]:
        yield from self.families().metrics()

    def render_text(self) -> bytes:
        """The text exposition of a fresh collection (the fast path for /metrics)."""
        return self.families().render_text()

    def families(self) -> Families:
        collection = self._collect()
        out = Families()
        out.add("gpuscope_build_info", _build_labels(collection), 1)
        for name, result in collection.results.items():
            ok = result.success
            if ok and result.records is not None and name in self._renderers:
                ok = self._render(name, result.records, out, self._renderers[name])
            out.add("gpuscope_collector_success", (name,), 1 if ok else 0)
            out.add("gpuscope_collector_duration_seconds", (name,), result.duration_seconds)
        if isinstance(collection.attribution, Attribution):
            self._render("attribution", collection.attribution, out, render_attribution)
        return out

    def _render(self, name: str, records: object, out: Families, renderer: Renderer) -> bool:
        batch = Families()
        try:
            renderer(records, batch)
        except Exception:
            if name not in self._render_failed:
                log.exception("rendering collector %s failed", name)
                self._render_failed.add(name)
            return False
        self._render_failed.discard(name)
        out.merge(batch)
        return True


def _build_labels(collection: Collection) -> tuple[str, str, str, str]:
    gpu = collection.records("gpu")
    nvml_version = gpu.nvml_version if isinstance(gpu, GpuSnapshot) else ""
    driver_version = gpu.driver_version if isinstance(gpu, GpuSnapshot) else ""
    return (gpuscope.__version__, platform.python_version(), nvml_version, driver_version)
