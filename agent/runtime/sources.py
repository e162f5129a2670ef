"""The source contract and the runner that isolates sources from each other.

A source reads one part of the world (NVML, the kernel, the kubelet) into immutable records.
The runner calls every enabled source on each collection, each one guarded
(agent/runtime/guarded.py: its own thread, a deadline, its last good records when late),
times it, and turns any failure into a `SourceResult` with `success=False`, so one broken
source never fails a scrape or takes the agent down. Errors are logged once per change of
state, not once per scrape: a node with no GPU driver should say so once, not every 15
seconds forever.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import wait
from dataclasses import dataclass
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.runtime.guarded import STALE_MAX, Guarded, Outcome, call_all

log = logging.getLogger("gpuscope.sources")

R_co = TypeVar("R_co", covariant=True)
R = TypeVar("R")


class SourceUnavailable(Exception):
    """The thing a source reads is absent or unusable (no driver, no permission).

    Raised with a message a node operator can act on; the runner logs it verbatim.
    """


class SourceAbsent(SourceUnavailable):
    """What the source reads is confirmed not there (no driver or vendor library on the
    host), as opposed to a fault reading it. The result says so (`SourceResult.absent`):
    node labels withdraw only after an absence lasts, never after a fault."""


class SourceNotInstalled(SourceAbsent):
    """Absent because the vendor's library itself is not on this host (no NVML, no ROCm):
    nothing of this kind is here to read, as the `amd` collector finds on an NVIDIA node.
    A library that is there with its driver not loaded is only `SourceAbsent`: on a node of
    that vendor, that is an incident. The result says so (`SourceResult.not_installed`)."""


class SourceStale(SourceUnavailable):
    """The source failed, but holds the last records it read, still worth using.

    The collection reports failure (`collector_success` 0) and carries `records`, so a later
    stage can keep names it learned before an outage instead of dropping them.
    """

    def __init__(self, message: str, records: object) -> None:
        super().__init__(message)
        self.records = records


class Source(Protocol[R_co]):
    """One reader of the world. `read` returns immutable records or raises; the runner's
    `collect` reads every source, and the exporter renders what they read."""

    name: str

    def start(self) -> None:
        """Acquire long-lived resources and start background threads. May raise."""
        ...

    def read(self) -> R_co:
        """Read the current state. Called on the source's own worker thread, one call at a
        time; a call that blocks delays only this source (the runner's deadline)."""
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
    """One source's part of a collection.

    `stuck` means the source's collection did not finish within the deadline and is still
    running: `records` are then the last good ones (or None), `success` is False, and
    `duration_seconds` is how long the collection in flight has run so far.
    `last_success` is the wall-clock time the source last collected successfully.
    """

    name: str
    records: R | None
    success: bool
    duration_seconds: float
    error: str | None = None
    stuck: bool = False
    last_success: float | None = None
    absent: bool = False  # failed because what it reads is not there (`SourceAbsent`)
    not_installed: bool = False  # ... because its library is not on the host at all


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
        return key.typed(result.records) if result is not None and result.success else None

    def last_records(self, key: Keyed[R]) -> R | None:
        """The records even of a failed collection that kept its last ones (`SourceStale`)."""
        result = self.results.get(key.name)
        return key.typed(result.records) if result is not None else None


class Keyed(Protocol[R_co]):
    """A collector's declaration as a typed key (agent/runtime/spec.py `CollectorSpec`).

    The key's type parameter is its records' type; `typed` gives records, stored by name
    without one, that type. Declarations do not import their records (a GPU-only agent
    would then import every collector's), so the key carries the type and not the class."""

    @property
    def name(self) -> str: ...

    def typed(self, records: Any) -> R_co: ...


RETRY_FIRST = 10.0  # seconds before retrying a source that failed to start
RETRY_MAX = 300.0  # ... doubling up to this
DEADLINE = 5.0  # seconds a collection waits for its sources (--collect-deadline)
STOP_WAIT = 5.0  # seconds `stop` waits for a source to stop before giving up on it


class _NotStarted(SourceUnavailable):
    """A collection found its source not started: the start's error, already in one line,
    and whether it was an absence (`SourceAbsent`)."""

    def __init__(self, error: str, absent: bool, not_installed: bool = False) -> None:
        super().__init__(error)
        self.error = error
        self.absent = absent
        self.not_installed = not_installed


class _CollectorVoice:
    """A source's changes of state in the log, each line naming the collector."""

    def __init__(self, name: str, deadline: float, stale_max: float) -> None:
        self.name = name
        self._deadline = deadline
        self._stale_max = stale_max
        self._extra = {"collector": name}

    def describe(self, exc: Exception) -> str:
        # A start's error was described when the start failed: said as it was, not again.
        return exc.error if isinstance(exc, _NotStarted) else describe(exc)

    def failed(self, error: str, exc: Exception) -> None:
        log.error("collector %s failed: %s", self.name, error, extra=self._extra)

    def stuck(self) -> None:
        log.error(
            "collector %s is stuck: no answer within the %.1f s deadline; serving its "
            "last good data (up to %.0f s old)",
            self.name,
            self._deadline,
            self._stale_max,
            extra=self._extra,
        )

    def recovered(self, *, was_stuck: bool) -> None:
        if was_stuck:
            log.info("collector %s answers again", self.name, extra=self._extra)
        else:
            log.info("collector %s recovered", self.name, extra=self._extra)

    def first_ok(self) -> None:
        log.debug("collector %s ok", self.name, extra=self._extra)


class SourceRunner:
    """Starts, collects from and stops a fixed set of sources, isolating their failures.

    Each source runs guarded (`Guarded`, agent/runtime/guarded.py): on a worker thread of its
    own, where its start and every collection run, all sources at once, and a collection
    waits for each up to a deadline counted from when that source's work in flight began. A
    source that raises is reported failed; one that is late is reported *stuck*: failed, with
    the last good records it returned (up to `STALE_MAX` old) so its series do not vanish
    while the cause is looked at, and with no second collection queued behind the one in
    flight. Once stuck it is answered as stuck at once: a hang costs the scrape that first
    meets it one deadline, and the scrapes after it nothing.

    A source that failed to start is retried with a backoff (10 s, doubling to 5 min), not on
    every scrape: starting can be expensive (compiling eBPF programs takes half a second of
    CPU) and the thing it lacks rarely appears within seconds.
    """

    def __init__(
        self,
        sources: Iterable[Source[Any]],
        clock: Clock | None = None,
        *,
        deadline: float = DEADLINE,
        stale_max: float = STALE_MAX,
    ) -> None:
        self._sources = list(sources)
        self._clock = clock or SystemClock()
        self.deadline = deadline
        self._guards: dict[str, Guarded[Any]] = {
            s.name: Guarded(
                s.name,
                _CollectorVoice(s.name, deadline, stale_max),
                thread_name_prefix=f"src-{s.name}",
                deadline=deadline,
                stale_max=stale_max,
                clock=self._clock,
            )
            for s in self._sources
        }
        self._state_lock = threading.Lock()  # guards the start bookkeeping below
        self._started: set[str] = set()
        # By source: error, retry at, delay, whether the error was an absence.
        # name -> (error, retry at, delay, absent, not installed)
        self._start_failure: dict[str, tuple[str, float, float, bool, bool]] = {}

    @property
    def names(self) -> list[str]:
        return [s.name for s in self._sources]

    def start(self, deadline: float | None = None) -> None:
        """Start every source, each on its worker, all at once, waiting up to `deadline`.
        One that fails is retried by later collections, with backoff; one still starting
        when the deadline passes is reported stuck by the collections that follow."""
        futures = [
            self._guards[s.name].submit(partial(self._try_start, s)).future for s in self._sources
        ]
        wait(futures, timeout=self.deadline if deadline is None else deadline)

    def _try_start(self, source: Source[Any]) -> _NotStarted | None:
        """None once the source is started; else why not (its start failed now, or did
        before and it is not yet time to retry)."""
        with self._state_lock:
            if source.name in self._started:
                return None
            now = self._clock.monotonic()
            failed = self._start_failure.get(source.name)
            if failed is not None and now < failed[1]:
                return _NotStarted(failed[0], failed[3], failed[4])  # not yet time to retry
        try:
            source.start()
        except Exception as exc:  # noqa: BLE001 - any failure must stay inside the source
            error, absent = describe(exc), isinstance(exc, SourceAbsent)
            not_installed = isinstance(exc, SourceNotInstalled)
            delay = min(RETRY_MAX, failed[2] * 2) if failed else RETRY_FIRST
            with self._state_lock:
                self._start_failure[source.name] = (
                    error,
                    now + delay,
                    delay,
                    absent,
                    not_installed,
                )
            return _NotStarted(error, absent, not_installed)
        with self._state_lock:
            self._start_failure.pop(source.name, None)
            self._started.add(source.name)
        return None

    def collect(self, only: Iterable[str] | None = None) -> Collection:
        """Collect from every source (or the named ones), in parallel, within the deadline.

        Safe from several threads at once: a source's collection in flight is shared by
        everyone who asks while it runs."""
        wanted = None if only is None else set(only)
        sources = [s for s in self._sources if wanted is None or s.name in wanted]
        outcomes = call_all(
            {s.name: (self._guards[s.name], partial(self._read, s)) for s in sources}
        )
        results = {s.name: self._result(s.name, outcomes[s.name]) for s in sources}
        return Collection(results=results, collected_at=time.time())

    def _read(self, source: Source[Any]) -> Any:
        """One collection, on the source's worker: started first if it is not yet."""
        not_started = self._try_start(source)
        if not_started is not None:
            raise not_started
        return source.read()

    @staticmethod
    def _result(name: str, outcome: Outcome[Any]) -> SourceResult[Any]:
        """A source's part of the collection: failed, with the last records a `SourceStale`
        kept; or stuck, with its last good records (`Guarded` keeps them)."""
        records = outcome.value
        error = outcome.error
        exc = outcome.exc
        absent = isinstance(exc, SourceAbsent) or (isinstance(exc, _NotStarted) and exc.absent)
        not_installed = isinstance(exc, SourceNotInstalled) or (
            isinstance(exc, _NotStarted) and exc.not_installed
        )
        if outcome.stuck:
            error = f"stuck: its collection has been running for {outcome.duration:.1f} s"
        elif isinstance(outcome.exc, SourceStale):
            records = outcome.exc.records
        return SourceResult(
            name=name,
            records=records,
            success=outcome.ok,
            duration_seconds=outcome.duration,
            error=error,
            stuck=outcome.stuck,
            last_success=outcome.last_success,
            absent=absent and not outcome.stuck,
            not_installed=not_installed and not outcome.stuck,
        )

    def stuck(self) -> dict[str, float]:
        """Sources whose collection in flight is past the deadline: name -> seconds running."""
        found = {}
        for name, guard in self._guards.items():
            running = guard.stuck_for()
            if running is not None:
                found[name] = running
        return found

    def stop(self) -> None:
        """Stop every source, each given `STOP_WAIT` seconds: a source stuck in a call may
        never stop, and must not keep the agent from exiting."""
        for source in reversed(self._sources):
            done = threading.Event()

            def stop_one(s: Source[Any] = source, done: threading.Event = done) -> None:
                try:
                    s.stop()
                except Exception as exc:  # noqa: BLE001
                    log.warning("collector %s did not stop cleanly: %s", s.name, describe(exc))
                finally:
                    done.set()

            threading.Thread(target=stop_one, name=f"stop-{source.name}", daemon=True).start()
            if not done.wait(STOP_WAIT):
                log.warning("collector %s did not stop within %.0f s", source.name, STOP_WAIT)
        for guard in self._guards.values():
            guard.shutdown()
        with self._state_lock:
            self._started.clear()


def describe(exc: BaseException) -> str:
    """One line, no traceback: what the operator needs to read in a log."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, SourceUnavailable):
        return text or "unavailable"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
