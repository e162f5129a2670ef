"""The source contract and the runner that isolates sources from each other.

A source reads one part of the world (NVML, the kernel, the kubelet) into immutable records.
The runner calls every enabled source on each collection, times it, and turns any failure
into a `SourceResult` with `success=False`, so one broken source never fails a scrape or
takes the agent down. Errors are logged once per change of state, not once per scrape:
a node with no GPU driver should say so once, not every 15 seconds forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from gpuscope.agent.clock import Clock, SystemClock

log = logging.getLogger("gpuscope.sources")

R_co = TypeVar("R_co", covariant=True)
R = TypeVar("R")


class SourceUnavailable(Exception):
    """The thing a source reads is absent or unusable (no driver, no permission).

    Raised with a message a node operator can act on; the runner logs it verbatim.
    """


class SourceStale(SourceUnavailable):
    """The source failed, but holds the last records it read, still worth using.

    The collection reports failure (`collector_success` 0) and carries `records`, so a later
    stage can keep names it learned before an outage instead of dropping them.
    """

    def __init__(self, message: str, records: object) -> None:
        super().__init__(message)
        self.records = records


class Source(Protocol[R_co]):
    """One reader of the world. `collect` returns immutable records or raises."""

    name: str

    def start(self) -> None:
        """Acquire long-lived resources and start background threads. May raise."""
        ...

    def collect(self) -> R_co:
        """Read the current state. Called from scrape threads, serialized by the runner."""
        ...

    def stop(self) -> None:
        """Release resources; must be safe to call after a failed or missing start."""
        ...


class StatelessSource:
    """Base for sources with nothing to start or stop: every collection reads afresh."""

    name: str

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass


@dataclass(frozen=True, slots=True)
class SourceResult(Generic[R]):
    name: str
    records: R | None
    success: bool
    duration_seconds: float
    error: str | None = None


@dataclass(frozen=True, slots=True)
class Collection:
    """What every enabled source returned on one collection, in a stable order.

    Read it through a collector's declaration, which types the records:
    `collection.records(GPU)` is a `GpuSnapshot | None`.
    """

    results: Mapping[str, SourceResult[Any]]
    collected_at: float

    def result(self, key: Keyed[R]) -> SourceResult[R] | None:
        return self.results.get(key.name)

    def records(self, key: Keyed[R]) -> R | None:
        """The collector's records, if its last collection succeeded."""
        result = self.results.get(key.name)
        return result.records if result is not None and result.success else None

    def last_records(self, key: Keyed[R]) -> R | None:
        """The records even of a failed collection that kept its last ones (`SourceStale`)."""
        result = self.results.get(key.name)
        return result.records if result is not None else None


class Keyed(Protocol[R_co]):
    """A collector's declaration as a typed key (agent/collector.py `Collector`)."""

    @property
    def name(self) -> str: ...

    @property
    def records(self) -> type[R_co]: ...


RETRY_FIRST = 10.0  # seconds before retrying a source that failed to start
RETRY_MAX = 300.0  # ... doubling up to this


class SourceRunner:
    """Starts, collects from and stops a fixed set of sources, isolating their failures.

    A source that failed to start is retried with a backoff (10 s, doubling to 5 min), not on
    every scrape: starting can be expensive (compiling eBPF programs takes half a second of
    CPU) and the thing it lacks rarely appears within seconds.
    """

    def __init__(self, sources: Iterable[Source[Any]], clock: Clock | None = None) -> None:
        self._sources = list(sources)
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._started: set[str] = set()
        self._last_error: dict[str, str | None] = {}
        self._start_failure: dict[str, tuple[str, float, float]] = {}  # error, retry at, delay

    @property
    def names(self) -> list[str]:
        return [s.name for s in self._sources]

    def start(self) -> None:
        """Start every source; one that fails is retried by later collections, with backoff.
        Holds the collection lock: no collection can start a source at the same time."""
        with self._lock:
            for source in self._sources:
                self._try_start(source)

    def _try_start(self, source: Source[Any]) -> str | None:
        if source.name in self._started:
            return None
        now = self._clock.monotonic()
        failed = self._start_failure.get(source.name)
        if failed is not None and now < failed[1]:
            return failed[0]  # not yet time to retry
        try:
            source.start()
        except Exception as exc:  # noqa: BLE001 - any failure must stay inside the source
            error = describe(exc)
            delay = min(RETRY_MAX, failed[2] * 2) if failed else RETRY_FIRST
            self._start_failure[source.name] = (error, now + delay, delay)
            return error
        self._start_failure.pop(source.name, None)
        self._started.add(source.name)
        return None

    def collect(self, only: Iterable[str] | None = None) -> Collection:
        """Collect from every source (or the named ones). Concurrent callers are serialized
        (NVML is not free)."""
        wanted = None if only is None else set(only)
        with self._lock:
            results: dict[str, SourceResult[Any]] = {}
            for source in self._sources:
                if wanted is None or source.name in wanted:
                    results[source.name] = self._collect_one(source)
            return Collection(results=results, collected_at=time.time())

    def _collect_one(self, source: Source[Any]) -> SourceResult[Any]:
        began = time.perf_counter()
        error = self._try_start(source)
        records: Any = None
        if error is None:
            try:
                records = source.collect()
            except SourceStale as exc:
                records, error = exc.records, describe(exc)
            except Exception as exc:  # noqa: BLE001
                error = describe(exc)
        duration = time.perf_counter() - began
        self._log_transition(source.name, error)
        return SourceResult(
            name=source.name,
            records=records,
            success=error is None,
            duration_seconds=duration,
            error=error,
        )

    def _log_transition(self, name: str, error: str | None) -> None:
        previous = self._last_error.get(name, None)
        first = name not in self._last_error
        self._last_error[name] = error
        if error is not None and error != previous:
            log.error("collector %s failed: %s", name, error, extra={"collector": name})
        elif error is None and previous is not None:
            log.info("collector %s recovered", name, extra={"collector": name})
        elif error is None and first:
            log.debug("collector %s ok", name, extra={"collector": name})

    def stop(self) -> None:
        for source in reversed(self._sources):
            try:
                source.stop()
            except Exception as exc:  # noqa: BLE001
                log.warning("collector %s did not stop cleanly: %s", source.name, describe(exc))
        self._started.clear()


def describe(exc: BaseException) -> str:
    """One line, no traceback: what the operator needs to read in a log."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, SourceUnavailable):
        return text or "unavailable"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
