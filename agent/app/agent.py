"""Wiring: sources -> runner -> Prometheus collector -> HTTP server.

The only module that knows both sides of the data flow. Tests build an `Agent` in-process
with their own clock; the command line builds one from flags.
"""

from __future__ import annotations

import logging
import threading
from functools import cached_property, partial
from typing import TYPE_CHECKING, Any

from gpuscope.agent.app.exposition import exposition_of
from gpuscope.agent.app.registry import BY_NAME, accelerators
from gpuscope.agent.attribution.stage import Attributor
from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.k8s.pod_cgroup_usage import CgroupRoots, PodCgroupReader
from gpuscope.agent.runtime.guarded import Guarded
from gpuscope.agent.runtime.self_stats import read_process_stats
from gpuscope.agent.runtime.sources import (
    Collection,
    Source,
    SourceResult,
    SourceRunner,
    SourceUnavailable,
    StatelessSource,
    describe,
)
from gpuscope.agent.runtime.spec import BuildContext
from gpuscope.exporters.prometheus.exporter import PrometheusExporter
from gpuscope.exporters.scrape import ATTRIBUTION_STAGE, Scrape

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from gpuscope.agent.app.config import Config
    from gpuscope.agent.attribution.records import Attribution

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

    def read(self) -> Any:
        raise SourceUnavailable(self._message)


def build_sources(config: Config, clock: Clock, *, background: bool = True) -> list[Source[Any]]:
    """The enabled collectors' sources, built from their declarations (agent/app/registry.py)."""
    sources: list[Source[Any]] = []
    for name in config.collectors:
        collector = BY_NAME[name]
        ctx = BuildContext(config.agent, config.of(collector), clock, background)
        try:
            sources.append(collector.build(ctx))
        except ImportError as exc:
            sources.append(MissingDependency(name, exc))
    return sources


class _StageVoice:
    """A stage's changes of state in the log: failures with their traceback, since a stage
    that raises is a bug in the agent, not a feature the node lacks."""

    def __init__(self, name: str) -> None:
        self.name = name

    def describe(self, exc: Exception) -> str:
        return describe(exc)

    def failed(self, error: str, exc: Exception) -> None:
        log.error("%s failed: %s", self.name, error, exc_info=exc)

    def stuck(self) -> None:
        log.error("%s is stuck: serving its last good result", self.name)

    def recovered(self, *, was_stuck: bool) -> None:
        log.info("%s recovered", self.name)

    def first_ok(self) -> None:
        pass


def _pod_signals(config: Config, clock: Clock) -> PodCgroupReader:
    """The per-pod cgroup reader: under --cgroup-root (else detected under --sysfs), each
    pod read at most once per --pod-signals-interval."""
    roots = CgroupRoots.detect(config.agent.sysfs, config.agent.cgroup_root)
    interval = config.attribution.pod_signals_interval
    return PodCgroupReader(roots, clock=clock, interval=interval)


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
        self.runner = SourceRunner(
            self.sources, clock=self.clock, deadline=config.agent.collect_deadline
        )
        self.attributor = Attributor(
            config.agent.procfs,
            gpu_resource_names=config.attribution.gpu_resource_names,
            clock=self.clock,
            options=config.attribution,
            pod_signals=_pod_signals(config, self.clock),
            accelerators=accelerators(config.collectors),
        )
        self.collector = PrometheusExporter(self.scrape, exposition_of(config))
        self._start_lock = threading.Lock()
        self._started = threading.Event()
        self._ready = threading.Event()
        # Attribution runs guarded like a source (agent/runtime/guarded.py): its own thread,
        # the collection deadline, its last good result while it is late.
        self._attribution: Guarded[Attribution] = Guarded(
            ATTRIBUTION_STAGE,
            _StageVoice(ATTRIBUTION_STAGE),
            thread_name_prefix=f"stage-{ATTRIBUTION_STAGE}",
            deadline=config.agent.collect_deadline,
            clock=self.clock,
        )
        self._collect_lock = threading.Lock()
        self._last: tuple[Scrape, float] | None = None  # the newest scrape, clock when done
        self._generation = 0  # collections done; a scrape that saw it change shares the last

    @cached_property
    def registry(self) -> CollectorRegistry:
        """prometheus_client's registry holding `collector`, made on first use: OpenMetrics
        scrapes and tests' `generate_latest` read it; the text format does not, so an agent
        only ever scraped in it never imports prometheus_client."""
        from prometheus_client.registry import CollectorRegistry

        registry = CollectorRegistry(auto_describe=False)
        registry.register(self.collector)
        return registry

    def scrape(self, *, start_wait: float = START_WAIT) -> Scrape:
        """Every source, then attribution: what one scrape renders.

        Concurrent scrapes share one collection: a scrape that arrives while one is in flight
        gets its result, and so does one that arrives within `--collection-max-age` after it
        finished. A scrape that comes while the sources are still starting (Prometheus
        scrapes a new pod as soon as it listens) waits up to `start_wait` seconds and then
        answers with no collector at all, rather than starting a source a second time.
        """
        if not self._started.wait(start_wait):
            return Scrape(Collection(results={}, collected_at=self.clock.time()), None)
        generation = self._generation
        with self._collect_lock:
            last = self._last
            if last is not None and (
                self._generation != generation  # one finished while this scrape waited
                or self.clock.monotonic() - last[1] < self.config.agent.collection_max_age
            ):
                return last[0]
            return self._collect_shared()

    def _collect_shared(self) -> Scrape:
        """Collect and keep the result for the scrapes that share it (collect lock held)."""
        scrape = self._collect()
        self._last = (scrape, self.clock.monotonic())
        self._generation += 1
        return scrape

    def _collect(self) -> Scrape:
        collection = self.runner.collect()
        outcome = self._attribution.call(partial(self.attributor.attribute, collection))
        error = f"stuck: running for {outcome.duration:.1f} s" if outcome.stuck else outcome.error
        status: SourceResult[Attribution] = SourceResult(
            name=ATTRIBUTION_STAGE,
            records=None,  # the stage's result is the scrape's `attribution`
            success=outcome.ok,
            duration_seconds=outcome.duration,
            error=error,
            stuck=outcome.stuck,
            last_success=outcome.last_success,
        )
        return Scrape(collection, outcome.value, status, read_process_stats())

    def stuck(self) -> dict[str, float]:
        """Collectors and stages stuck past their deadline: name -> seconds running."""
        found = self.runner.stuck()
        busy = self._attribution.stuck_for()
        if busy is not None:
            found[ATTRIBUTION_STAGE] = busy
        return found

    def health_detail(self) -> str:
        """For /healthz: what is stuck (the agent stays live: see docs/architecture.md)."""
        stuck = self.stuck()
        if not stuck:
            return ""
        return "".join(f"stuck: {name} for {seconds:.0f} s\n" for name, seconds in stuck.items())

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def start(self) -> Scrape:
        """Start every source once and run the first full collection (then /readyz says
        ready). Safe to call again, and from several threads: later calls collect."""
        with self._start_lock:
            if self._ready.is_set():
                return self.scrape()
            self.runner.start()
            self._started.set()
            with self._collect_lock:  # scrapes that come meanwhile get this one
                first = self._collect_shared()
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
