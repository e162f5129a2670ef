"""The guarded-execution primitive (agent/runtime/guarded.py) on its own: single flight,
the deadline counted from when the work in flight began, the last good result served while
stuck and only up to `stale_max`, and each change of state said once.

Time: deadlines are waited out in real time, so the guard's monotonic clock here is the real
one plus jumps (`Jumps`): a test makes work "9.9 s old" or a result "5 minutes old" at once,
and no test waits longer than a fraction of a second when the behaviour holds."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from gpuscope.agent.clock import ManualClock
from gpuscope.agent.runtime.guarded import Guarded, Outcome

WALL = 1_700_000_000.0


class Jumps:
    """Real monotonic time, plus whatever the test jumped ahead."""

    def __init__(self) -> None:
        self.ahead = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.ahead

    def jump(self, seconds: float) -> None:
        self.ahead += seconds


class Said:
    """A `Voice` that records what it is told to say."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def describe(self, exc: Exception) -> str:
        return f"{type(exc).__name__}: {exc}"

    def failed(self, error: str, exc: Exception) -> None:
        self.lines.append(f"failed: {error}")

    def stuck(self) -> None:
        self.lines.append("stuck")

    def recovered(self, *, was_stuck: bool) -> None:
        self.lines.append("answers again" if was_stuck else "recovered")

    def first_ok(self) -> None:
        self.lines.append("ok")


class Held:
    """Work that blocks until released (a call stuck in the kernel), counting its calls."""

    def __init__(self, value: object = "held") -> None:
        self.value = value
        self.calls = 0
        self.entered = threading.Event()
        self.released = threading.Event()

    def __call__(self) -> object:
        self.calls += 1
        self.entered.set()
        self.released.wait(30)
        return self.value


class Guard:
    """A guard under test, with its voice, its jumping clock and its wall clock."""

    def __init__(self, *, deadline: float, stale_max: float = 300.0) -> None:
        self.said = Said()
        self.jumps = Jumps()
        self.clock = ManualClock(WALL)
        self.guard: Guarded[object] = Guarded(
            "work",
            self.said,
            thread_name_prefix="test-guarded",
            deadline=deadline,
            stale_max=stale_max,
            clock=self.clock,
            monotonic=self.jumps,
        )


@pytest.fixture
def held() -> Iterator[Held]:
    work = Held()
    yield work
    work.released.set()


def timed(fn: Callable[[], Outcome[object]]) -> tuple[Outcome[object], float]:
    began = time.monotonic()
    outcome = fn()
    return outcome, time.monotonic() - began


def test_a_caller_that_finds_work_in_flight_joins_it(held: Held) -> None:
    g = Guard(deadline=10.0)
    try:
        flight = g.guard.run(held)
        other = Held("other")
        assert g.guard.run(other).future is flight.future  # joined, nothing queued
        with ThreadPoolExecutor(max_workers=4) as pool:
            calls = [pool.submit(g.guard.call, other) for _ in range(4)]
            assert held.entered.wait(5)
            held.released.set()
            outcomes = [c.result(5) for c in calls]
        assert held.calls == 1 and other.calls == 0
        assert [o.value for o in outcomes] == ["held"] * 4  # the one run, shared
        assert all(o.ok for o in outcomes)
    finally:
        g.guard.shutdown()


def test_the_deadline_counts_from_when_the_work_in_flight_began(held: Held) -> None:
    g = Guard(deadline=10.0)
    try:
        g.guard.run(held)
        g.jumps.jump(9.9)  # the work has run 9.9 s of its 10 when a caller comes
        outcome, took = timed(lambda: g.guard.call(Held("late")))
        assert took < 2.0  # what was left of the deadline, not a deadline of its own
        assert outcome.stuck and not outcome.ok
        assert outcome.duration >= 9.9  # how long the work in flight has run
        outcome, took = timed(lambda: g.guard.call(Held("later")))
        assert took < 1.0  # already past its deadline: answered at once
        assert outcome.stuck and outcome.duration >= 10.0
        assert held.calls == 1
    finally:
        g.guard.shutdown()


def test_the_last_good_result_is_served_while_stuck_and_dropped_after_stale_max(
    held: Held,
) -> None:
    g = Guard(deadline=0.05, stale_max=300.0)
    try:
        good = g.guard.call(lambda: "good")
        assert good.ok and good.value == "good" and good.last_success == WALL
        g.clock.advance(15)
        stuck = g.guard.call(held)
        assert stuck.stuck
        assert stuck.value == "good"  # the last good result...
        assert stuck.last_success == WALL  # ... and when it was had
        g.jumps.jump(299)  # the result is 299 s old
        assert g.guard.call(held).value == "good"
        g.jumps.jump(2)  # 301 s: too old to pass for current data
        dropped = g.guard.call(held)
        assert dropped.stuck and dropped.value is None
        assert dropped.last_success == WALL  # still says when it last succeeded
    finally:
        g.guard.shutdown()


def test_a_failure_keeps_the_last_good_one_out_of_the_answer() -> None:
    g = Guard(deadline=5.0)
    try:
        g.guard.call(lambda: "good")

        def broken() -> object:
            raise ValueError("bad read")

        failed = g.guard.call(broken)
        assert not failed.ok and not failed.stuck
        assert failed.value is None  # a failure is not stuck: nothing stale is passed off
        assert failed.error == "ValueError: bad read"
        assert isinstance(failed.exc, ValueError)
        assert failed.last_success == WALL
    finally:
        g.guard.shutdown()


def test_each_change_of_state_is_said_once() -> None:
    g = Guard(deadline=0.05)
    error: list[Exception | None] = [None]

    def work() -> object:
        if error[0] is not None:
            raise error[0]
        return "value"

    try:
        g.guard.call(work)
        g.guard.call(work)
        error[0] = RuntimeError("device busy")
        for _ in range(3):
            g.guard.call(work)
        error[0] = RuntimeError("device gone")
        g.guard.call(work)
        g.guard.call(work)
        error[0] = None
        g.guard.call(work)
        g.guard.call(work)
        assert g.said.lines == [
            "ok",
            "failed: RuntimeError: device busy",
            "failed: RuntimeError: device gone",
            "recovered",
        ]
    finally:
        g.guard.shutdown()


def test_stuck_is_said_once_and_so_is_the_answer_after_it(held: Held) -> None:
    g = Guard(deadline=0.05)
    try:
        g.guard.call(lambda: "good")
        flight = g.guard.run(held)
        for _ in range(3):
            assert g.guard.call(held).stuck
        assert g.said.lines == ["ok", "stuck"]
        held.released.set()
        assert isinstance(flight.future.result(5), Outcome)  # settled on the worker
        assert g.said.lines == ["ok", "stuck", "answers again"]
        assert g.guard.call(lambda: "fresh").value == "fresh"
        assert g.said.lines == ["ok", "stuck", "answers again"]
    finally:
        g.guard.shutdown()


def test_a_failure_after_being_stuck_is_said(held: Held) -> None:
    g = Guard(deadline=0.05)

    def broken() -> object:
        held()
        raise OSError("gone")

    try:
        flight = g.guard.run(broken)
        assert g.guard.call(broken).stuck
        held.released.set()
        flight.future.result(5)
        assert g.said.lines == ["stuck", "failed: OSError: gone"]
    finally:
        g.guard.shutdown()


def test_other_work_in_flight_is_waited_for_then_the_callers_work_runs(held: Held) -> None:
    """A source's start (`submit`) holds the same thread as its collections; a collection
    that finds it in flight runs once it is done, and the start is no result."""
    g = Guard(deadline=5.0)
    try:
        g.guard.submit(held)
        with ThreadPoolExecutor(max_workers=1) as pool:
            answer = pool.submit(g.guard.call, lambda: "collected")
            assert held.entered.wait(5)
            held.released.set()
            outcome = answer.result(5)
        assert outcome.ok and outcome.value == "collected"
        assert g.said.lines == ["ok"]  # the start itself said nothing
    finally:
        g.guard.shutdown()


def test_busy_and_stuck_signals(held: Held) -> None:
    g = Guard(deadline=10.0)
    try:
        assert g.guard.busy_since() is None
        assert g.guard.busy_for() is None and g.guard.stuck_for() is None
        flight = g.guard.run(held)
        assert g.guard.busy_since() == flight.began
        assert g.guard.stuck_for() is None  # busy, within its deadline
        g.jumps.jump(11)
        busy = g.guard.busy_for()
        stuck = g.guard.stuck_for()
        assert busy is not None and busy >= 11
        assert stuck is not None and stuck >= 11
        held.released.set()
        flight.future.result(5)
        assert g.guard.busy_for() is None and g.guard.stuck_for() is None
    finally:
        g.guard.shutdown()


def test_the_work_runs_on_one_named_thread() -> None:
    g = Guard(deadline=5.0)
    try:
        names = {g.guard.call(lambda: threading.current_thread().name).value for _ in range(5)}
        assert len(names) == 1
        assert str(names.pop()).startswith("test-guarded")
    finally:
        g.guard.shutdown()
