"""Guarded execution: run a piece of work once, on its own thread, against a deadline.

Every source and the attribution stage after them read things that can hang: an NVML call
blocked in the kernel, a frozen socket, a /proc walk on a wedged mount. A scrape must answer
within its deadline whatever they do, so each runs as a `Guarded`:

- on a worker thread of its own, so a hang holds only that thread;
- once at a time: a caller who finds work in flight joins it instead of queueing more
  behind it, so a hung reader costs one thread however many scrapes come;
- against a deadline counted from when the work in flight began, not from when the caller
  came: a caller that joins mid-way waits only for what is left, and one that finds the work
  already past its deadline is answered at once (a hang costs one deadline, not one per
  scrape);
- answered, when late, with the last good result and its wall time, but only while it is
  younger than `stale_max`: long enough that series do not vanish while a hang is looked
  at, not so long that a hang passes for flat data;
- saying so once per change of state (failed, failed differently, stuck, recovered), not
  once per scrape, in its owner's words (`Voice`).

The rule lives here once; `SourceRunner` (agent/runtime/sources.py) holds one per source
and the agent (agent/app/agent.py) one for the attribution stage.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from enum import Enum
from functools import partial
from typing import Any, Generic, Protocol, TypeVar

from gpuscope.agent.clock import Clock, SystemClock

T = TypeVar("T")
K = TypeVar("K", bound=Hashable)

STALE_MAX = 300.0  # seconds a stuck run's last good result is still served


class Voice(Protocol):
    """How a guarded run says what happened to it. `Guarded` decides *when* (once per
    change of state); the owner decides the words, so a collector's lines name the
    collector and keep the wording operators and alerts already know."""

    def describe(self, exc: Exception) -> str:
        """The error in one line, as the failure is reported and compared for change."""
        ...

    def failed(self, error: str, exc: Exception) -> None:
        """The work failed, for the first time or with a different error than before."""
        ...

    def stuck(self) -> None:
        """The work in flight passed its deadline (said once until it settles again)."""
        ...

    def recovered(self, *, was_stuck: bool) -> None:
        """The work succeeded after failing (`was_stuck`: after being stuck)."""
        ...

    def first_ok(self) -> None:
        """The work succeeded and had never settled before."""
        ...


class _Mark(Enum):
    """States of a guarded run other than ok (None) and failed (its error)."""

    NEVER = "never"  # nothing settled yet
    STUCK = "stuck"  # past the deadline, not settled since


@dataclass(frozen=True, slots=True)
class Flight:
    """The work in flight: its future, and when it began and is due (monotonic seconds)."""

    future: Future[Any]
    began: float
    due: float


@dataclass(frozen=True, slots=True)
class Outcome(Generic[T]):
    """What a caller of a guarded run gets.

    Settled work: its `value` (None when it raised), its `error` in one line and the
    exception `exc`, and `duration`, how long it ran. Stuck work (`stuck`): `value` is the
    last good result while younger than `stale_max`, else None, and `duration` is how long
    the work in flight has run so far. `last_success` is the wall time of the last good
    result, either way.
    """

    value: T | None
    error: str | None = None
    exc: Exception | None = None
    duration: float = 0.0
    stuck: bool = False
    last_success: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and not self.stuck


class Guarded(Generic[T]):
    """One worker thread that runs its owner's work once at a time, against a deadline.

    `run` hands it work whose result is kept as the last good one and whose failures are
    said through the `Voice`; `submit` hands it other work that shares the thread and the
    single flight but not the bookkeeping (a source's start, which must hold the same
    thread as its collections but is no collection itself). `call` and `call_all` wait for
    the answers.

    Deadlines are waited out in real time, so they are measured on `monotonic` (the real
    monotonic clock unless a test brings its own), not on the agent's `Clock`, whose
    `ManualClock` stands still in tests; the `Clock` gives the wall time of a good result.
    """

    def __init__(
        self,
        name: str,
        voice: Voice,
        *,
        thread_name_prefix: str,
        deadline: float,
        stale_max: float = STALE_MAX,
        clock: Clock | None = None,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.name = name
        self.deadline = deadline
        self.stale_max = stale_max
        self.monotonic = monotonic
        self._voice = voice
        self._clock = clock or SystemClock()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=thread_name_prefix)
        self._lock = threading.Lock()  # guards everything below
        self._pending: Future[Any] | None = None
        self._began = 0.0
        self._last_good: tuple[T, float, float] | None = None  # result, wall, monotonic
        self._state: str | _Mark | None = _Mark.NEVER  # None: ok; a string: that error

    def submit(self, work: Callable[[], Any]) -> Flight:
        """The work in flight, or `work` started now if none is: single flight."""
        with self._lock:
            if self._pending is None or self._pending.done():
                self._began = self.monotonic()
                self._pending = self._executor.submit(work)
            return Flight(self._pending, self._began, self._began + self.deadline)

    def run(self, work: Callable[[], T]) -> Flight:
        """Like `submit`, for work whose outcome counts: the flight's future gives an
        `Outcome` (it never raises) once the last good result and the log are updated."""
        return self.submit(partial(self._settle, work))

    def call(self, work: Callable[[], T]) -> Outcome[T]:
        """`work`'s outcome (or the outcome of the run in flight, joined), or the stuck
        answer once the deadline passes."""
        outcome: Outcome[T] = call_all({self.name: (self, work)})[self.name]
        return outcome

    def outcome(self, flight: Flight) -> Outcome[T] | None:
        """A finished flight's outcome; None when it was `submit` work, not `run` work."""
        result = flight.future.result()
        return result if isinstance(result, Outcome) else None

    def overdue(self, running: float) -> Outcome[T]:
        """The answer for work in flight `running` seconds, past its deadline: stuck, with
        the last good result while it is younger than `stale_max`. Says so once."""
        with self._lock:
            if self._state is not _Mark.STUCK:
                self._state = _Mark.STUCK
                self._voice.stuck()
            last = self._last_good
        kept = None
        if last is not None and self.monotonic() - last[2] <= self.stale_max:
            kept = last[0]
        return Outcome(
            value=kept,
            duration=running,
            stuck=True,
            last_success=last[1] if last is not None else None,
        )

    def busy_since(self) -> float | None:
        """When (monotonic) the work in flight began, or None when idle."""
        with self._lock:
            if self._pending is None or self._pending.done():
                return None
            return self._began

    def busy_for(self) -> float | None:
        """Seconds the work in flight has run so far, or None when idle."""
        began = self.busy_since()
        return None if began is None else self.monotonic() - began

    def stuck_for(self) -> float | None:
        """Seconds the work in flight has run, if that is past the deadline (the signal
        /healthz reports), else None."""
        busy = self.busy_for()
        return busy if busy is not None and busy > self.deadline else None

    def shutdown(self) -> None:
        """Let the thread go once idle; work stuck in a call keeps it until the call returns."""
        self._executor.shutdown(wait=False, cancel_futures=True)

    def _settle(self, work: Callable[[], T]) -> Outcome[T]:
        """Runs on the worker: `work`, then the bookkeeping. Never raises."""
        began = time.perf_counter()
        try:
            value = work()
        except Exception as exc:  # noqa: BLE001 - any failure must stay inside the work
            error = self._voice.describe(exc)
            duration = time.perf_counter() - began
            with self._lock:
                last = self._last_good
                self._failed(error, exc)
            return Outcome(
                value=None,
                error=error,
                exc=exc,
                duration=duration,
                last_success=last[1] if last is not None else None,
            )
        duration = time.perf_counter() - began
        wall = self._clock.time()
        with self._lock:
            self._last_good = (value, wall, self.monotonic())
            self._succeeded()
        return Outcome(value=value, duration=duration, last_success=wall)

    def _failed(self, error: str, exc: Exception) -> None:
        """Say a failure, unless it is the one already said (lock held)."""
        before, self._state = self._state, error
        if error != before:
            self._voice.failed(error, exc)

    def _succeeded(self) -> None:
        """Say a success if it ends a failure or is the first (lock held)."""
        before, self._state = self._state, None
        if before is _Mark.STUCK:
            self._voice.recovered(was_stuck=True)
        elif isinstance(before, str):
            self._voice.recovered(was_stuck=False)
        elif before is _Mark.NEVER:
            self._voice.first_ok()


def call_all(calls: Mapping[K, tuple[Guarded[Any], Callable[[], Any]]]) -> dict[K, Outcome[Any]]:
    """Run each guarded work at once and answer for each within its deadline.

    Each is waited for up to its deadline counted from when its work in flight began, and
    never past one deadline from now. Where other work (a source's start) was in flight, the
    work is run after it, within what is left of that same bound.
    """
    flights = {key: guard.run(work) for key, (guard, work) in calls.items()}
    until = {key: guard.monotonic() + guard.deadline for key, (guard, _) in calls.items()}

    def due(key: K) -> float:
        return min(until[key], flights[key].due)

    answers: dict[K, Outcome[Any]] = {}
    while flights:
        soonest = min(due(key) - calls[key][0].monotonic() for key in flights)
        wait(
            [flight.future for flight in flights.values()],
            timeout=max(0.0, soonest),
            return_when=FIRST_COMPLETED,
        )
        for key, flight in list(flights.items()):
            guard, work = calls[key]
            now = guard.monotonic()
            if flight.future.done():
                outcome = guard.outcome(flight)
                if outcome is None:  # other work was in flight: now this
                    flights[key] = guard.run(work)
                else:
                    answers[key] = outcome
                    del flights[key]
            elif now >= due(key):
                answers[key] = guard.overdue(now - flight.began)
                del flights[key]
    return answers
