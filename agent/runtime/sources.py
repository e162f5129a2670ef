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
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from functools import partial
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
    """A collector's declaration as a typed key (agent/runtime/spec.py `CollectorSpec`)."""

    @property
    def name(self) -> str: ...

    @property
    def records(self) -> type[R_co]: ...


RETRY_FIRST = 10.0  # seconds before retrying a source that failed to start
RETRY_MAX = 300.0  # ... doubling up to this
DEADLINE = 5.0  # seconds a collection waits for its sources (--collect-deadline)
STALE_MAX = 300.0  # seconds a stuck source's last good records are still served
STOP_WAIT = 5.0  # seconds `stop` waits for a source to stop before giving up on it


class _Worker:
    """One source's own thread: every start and collection of that source runs here.

    A source that hangs (an NVML call blocked in the kernel, a frozen socket) holds only its
    own thread. While one collection is in flight no other is queued: later requests join
    it, so a stuck source costs one thread, however many scrapes come.
    """

    def __init__(self, source: Source[Any]) -> None:
        self.source = source
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"src-{source.name}")
        self._lock = threading.Lock()
        self._pending: Future[Any] | None = None
        self._began = 0.0  # time.monotonic() the pending work started

    def request(self, work: Callable[[], Any]) -> tuple[Future[Any], float]:
        """The work in flight, or `work` submitted now; and when it began (monotonic)."""
        with self._lock:
            if self._pending is None or self._pending.done():
                self._began = time.monotonic()
                self._pending = self._executor.submit(work)
            return self._pending, self._began

    def busy_since(self) -> float | None:
        with self._lock:
            if self._pending is None or self._pending.done():
                return None
            return self._began

    def shutdown(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class SourceRunner:
    """Starts, collects from and stops a fixed set of sources, isolating their failures.

    Each source runs on its own worker thread (`_Worker`), all of them at once, and a
    collection waits for each up to a deadline counted from when that source's work in
    flight began. A source that raises is reported failed; one that is late is reported
    *stuck*: failed, with the last good records it returned (up to `STALE_MAX` old) so its
    series do not vanish while the cause is looked at, and with no second collection queued
    behind the one in flight. Once stuck it is answered as stuck at once: a hang costs the
    scrape that first meets it one deadline, and the scrapes after it nothing.

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
        self._stale_max = stale_max
        self._workers = {s.name: _Worker(s) for s in self._sources}
        self._state_lock = threading.Lock()  # guards the bookkeeping below
        self._started: set[str] = set()
        self._last_error: dict[str, str | None] = {}
        self._start_failure: dict[str, tuple[str, float, float]] = {}  # error, retry at, delay
        self._last_good: dict[str, tuple[Any, float, float]] = {}  # records, wall, monotonic
        self._stuck_logged: set[str] = set()

    @property
    def names(self) -> list[str]:
        return [s.name for s in self._sources]

    def start(self, deadline: float | None = None) -> None:
        """Start every source, each on its worker, all at once, waiting up to `deadline`.
        One that fails is retried by later collections, with backoff; one still starting
        when the deadline passes is reported stuck by the collections that follow."""
        futures = [w.request(partial(self._try_start, w.source))[0] for w in self._workers.values()]
        wait(futures, timeout=self.deadline if deadline is None else deadline)

    def _try_start(self, source: Source[Any]) -> str | None:
        with self._state_lock:
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
            with self._state_lock:
                self._start_failure[source.name] = (error, now + delay, delay)
            return error
        with self._state_lock:
            self._start_failure.pop(source.name, None)
            self._started.add(source.name)
        return None

    def collect(self, only: Iterable[str] | None = None) -> Collection:
        """Collect from every source (or the named ones), in parallel, within the deadline.

        Safe from several threads at once: a source's collection in flight is shared by
        everyone who asks while it runs."""
        wanted = None if only is None else set(only)
        workers = [w for w in self._workers.values() if wanted is None or w.source.name in wanted]
        collect = {w.source.name: partial(self._collect_one, w.source) for w in workers}
        requests = {w.source.name: w.request(collect[w.source.name]) for w in workers}
        results: dict[str, SourceResult[Any]] = {}
        until = time.monotonic() + self.deadline

        def due(began: float) -> float:
            # A source's deadline runs from when its work in flight began, not from this
            # collection: one already stuck is answered at once (a hang costs one deadline,
            # not one per scrape), one joined mid-way gets what is left of its deadline.
            return min(until, began + self.deadline)

        while requests:
            soonest = min(due(began) for _future, began in requests.values())
            wait(
                [future for future, _ in requests.values()],
                timeout=max(0.0, soonest - time.monotonic()),
                return_when=FIRST_COMPLETED,
            )
            now = time.monotonic()
            for name, (future, began) in list(requests.items()):
                if future.done():
                    result = future.result()
                    if isinstance(result, SourceResult):
                        results[name] = result
                        del requests[name]
                    else:  # the work in flight was the source's start: now collect
                        requests[name] = self._workers[name].request(collect[name])
                elif now >= due(began):
                    results[name] = self._stuck(name, now - began)
                    del requests[name]
        results = {w.source.name: results[w.source.name] for w in workers}  # stable order
        return Collection(results=results, collected_at=time.time())

    def _collect_one(self, source: Source[Any]) -> SourceResult[Any]:
        """Runs on the source's worker; never raises."""
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
        with self._state_lock:
            if error is None:
                self._last_good[source.name] = (records, self._clock.time(), time.monotonic())
            last = self._last_good.get(source.name)
            self._log_transition(source.name, error)
        return SourceResult(
            name=source.name,
            records=records,
            success=error is None,
            duration_seconds=duration,
            error=error,
            last_success=last[1] if last is not None else None,
        )

    def _stuck(self, name: str, running: float) -> SourceResult[Any]:
        """A source still collecting past the deadline: failed, stuck, with its last good
        records while they are younger than `stale_max`."""
        error = f"stuck: its collection has been running for {running:.1f} s"
        with self._state_lock:
            last = self._last_good.get(name)
            if name not in self._stuck_logged:
                self._stuck_logged.add(name)
                self._last_error[name] = "stuck"
                log.error(
                    "collector %s is stuck: no answer within the %.1f s deadline; serving its "
                    "last good data (up to %.0f s old)",
                    name,
                    self.deadline,
                    self._stale_max,
                    extra={"collector": name},
                )
        records = None
        if last is not None and time.monotonic() - last[2] <= self._stale_max:
            records = last[0]
        return SourceResult(
            name=name,
            records=records,
            success=False,
            duration_seconds=running,
            error=error,
            stuck=True,
            last_success=last[1] if last is not None else None,
        )

    def stuck(self) -> dict[str, float]:
        """Sources whose collection in flight is past the deadline: name -> seconds running."""
        now = time.monotonic()
        found = {}
        for name, worker in self._workers.items():
            began = worker.busy_since()
            if began is not None and now - began > self.deadline:
                found[name] = now - began
        return found

    def _log_transition(self, name: str, error: str | None) -> None:
        """Called with the state lock held."""
        previous = self._last_error.get(name, None)
        first = name not in self._last_error
        self._last_error[name] = error
        if name in self._stuck_logged and error is None:
            self._stuck_logged.discard(name)
            log.info("collector %s answers again", name, extra={"collector": name})
            return
        self._stuck_logged.discard(name)
        if error is not None and error != previous:
            log.error("collector %s failed: %s", name, error, extra={"collector": name})
        elif error is None and previous is not None:
            log.info("collector %s recovered", name, extra={"collector": name})
        elif error is None and first:
            log.debug("collector %s ok", name, extra={"collector": name})

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
        for worker in self._workers.values():
            worker.shutdown()
        with self._state_lock:
            self._started.clear()


def describe(exc: BaseException) -> str:
    """One line, no traceback: what the operator needs to read in a log."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    if isinstance(exc, SourceUnavailable):
        return text or "unavailable"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
