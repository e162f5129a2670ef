"""Wiring: sources -> runner -> Prometheus collector -> HTTP server.

The only module that knows both sides of the data flow. Tests build an `Agent` in-process
with their own clock; the command line builds one from flags.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from prometheus_client.registry import CollectorRegistry

from gpuscope.agent.attribution.records import Attributed, Attribution
from gpuscope.agent.attribution.stage import Attributor
from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.collector import BuildContext
from gpuscope.agent.config import Config
from gpuscope.agent.registry import BY_NAME
from gpuscope.agent.sources import (
    Collection,
    Source,
    SourceRunner,
    SourceUnavailable,
    StatelessSource,
    describe,
)
from gpuscope.exporters.prometheus.collector import GpuscopeCollector

log = logging.getLogger("gpuscope")

START_WAIT = 10.0  # seconds a scrape during start-up waits for the sources to be started


class MissingDependency(StatelessSource):
    """Stands in for a source whose Python dependency is not installed: it fails to start
    with the import error, every retry, and the other sources carry on."""

    def __init__(self, name: str, error: ImportError) -> None:
        self.name = name
        self._message = f"cannot import {error.name or 'a dependency'}: {error}"

    def start(self) -> None:
        raise SourceUnavailable(self._message)

    def collect(self) -> Any:
        raise SourceUnavailable(self._message)


def build_sources(config: Config, clock: Clock, *, background: bool = True) -> list[Source[Any]]:
    """The enabled collectors' sources, built from their declarations (agent/registry.py)."""
    sources: list[Source[Any]] = []
    for name in config.collectors:
        collector = BY_NAME[name]
        ctx = BuildContext(config.agent, config.of(collector), clock, background)
        try:
            sources.append(collector.build(ctx))
        except ImportError as exc:
            sources.append(MissingDependency(name, exc))
    return sources


class Agent:
    def __init__(
        self,
        config: Config,
        *,
        clock: Clock | None = None,
        sources: list[Source[Any]] | None = None,
        background: bool = True,
    ) -> None:
        self.config = config
        self.clock = clock or SystemClock()
        self.sources = (
            sources
            if sources is not None
            else build_sources(config, self.clock, background=background)
        )
        self.runner = SourceRunner(self.sources, clock=self.clock)
        self.attributor = Attributor(
            config.agent.procfs,
            gpu_resource_names=config.attribution.gpu_resource_names,
            clock=self.clock,
        )
        self.registry = CollectorRegistry(auto_describe=False)
        self.collector = GpuscopeCollector(self.collect, config)
        self.registry.register(self.collector)
        self._start_lock = threading.Lock()
        self._started = threading.Event()
        self._ready = threading.Event()
        self._attribution_error: str | None = None

    def collect(self, *, start_wait: float = START_WAIT) -> Attributed:
        """Every source, then attribution: what one scrape renders.

        A scrape that comes while the sources are still starting (Prometheus scrapes a new
        pod as soon as it listens) waits up to `start_wait` seconds and then answers with no
        collector at all, rather than starting or collecting a source a second time.
        """
        if not self._started.wait(start_wait):
            return Attributed(Collection(results={}, collected_at=self.clock.time()), None)
        return self._collect()

    def _collect(self) -> Attributed:
        collection = self.runner.collect()
        return Attributed(collection, self._attribute(collection))

    def _attribute(self, collection: Collection) -> Attribution | None:
        """The attribution stage, isolated like a source: its failure costs the names and
        the idle figures of this scrape, never the scrape."""
        try:
            attribution = self.attributor.attribute(collection)
        except Exception as exc:
            error = describe(exc)
            if error != self._attribution_error:
                log.exception("attribution failed: %s", error)
            self._attribution_error = error
            return None
        if self._attribution_error is not None:
            log.info("attribution recovered")
        self._attribution_error = None
        return attribution

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def start(self) -> Attributed:
        """Start every source once and run the first full collection (then /readyz says
        ready). Safe to call again, and from several threads: later calls collect."""
        with self._start_lock:
            if self._ready.is_set():
                return self._collect()
            self.runner.start()
            self._started.set()
            first = self._collect()
            self._ready.set()
        failed = [r.name for r in first.collection.results.values() if not r.success]
        log.info(
            "ready: collectors %s%s",
            ", ".join(self.runner.names) or "none",
            f" (failing: {', '.join(failed)})" if failed else "",
        )
        return first

    def source(self, name: str) -> Source[Any]:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(name)

    def stop(self) -> None:
        self.runner.stop()
