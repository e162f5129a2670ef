"""The per-GPU gate on plain work (no NVML): a unit past its deadline makes the GPU stuck,
nothing is queued behind it, one thread per GPU ever, normal service once it returns; a
fenced GPU runs nothing but probes on a doubling schedule of the agent's clock
(agent/accelerators/gate.py; over the fake NVML: tests/integration/test_gpu_hang.py and
test_gpu_fence.py)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from gpuscope.agent.accelerators.gate import Blocked, Gate, GpuGates, Job
from gpuscope.agent.app.config import ConfigError, parse
from gpuscope.agent.clock import ManualClock
from tests.support import wait_for

SHORT = 0.2  # seconds: the deadline here (real time)


class CallNames:
    """Stands in for `Nvml.current_call`: the function a thread is "in"."""

    library = "NVML"

    def __init__(self) -> None:
        self.calls: dict[int, str] = {}

    def current_call(self, thread_id: int) -> str | None:
        return self.calls.get(thread_id)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(1000.0)


@pytest.fixture
def names() -> CallNames:
    return CallNames()


@pytest.fixture
def gate(clock: ManualClock, names: CallNames) -> Iterator[Gate]:
    g = Gate(3, "GPU-3", names, clock)
    yield g
    g.close()


def run(gate: Gate, fn: Any) -> Any:
    deadline_at = time.monotonic() + SHORT
    job = gate.begin(fn, deadline_at)
    return job if isinstance(job, Blocked) else job.wait(deadline_at)


def begin_at_once(gate: Gate, fn: Any) -> Any:
    """`begin` with an hour's deadline, which must answer at once (a bounded wait of 10 s
    on another thread, so a gate that waits fails the test instead of stalling it)."""
    got: list[Any] = []
    thread = threading.Thread(
        target=lambda: got.append(gate.begin(fn, time.monotonic() + 3600)), daemon=True
    )
    thread.start()
    thread.join(10)
    assert got, "begin waited on a stuck GPU"
    return got[0]


def hang(names: CallNames, release: threading.Event, function: str) -> Any:
    def work() -> str:
        names.calls[threading.get_ident()] = function
        release.wait(30)
        names.calls.pop(threading.get_ident(), None)
        return "late"

    return work


def test_a_unit_within_the_deadline_returns_its_value_or_raises_its_error(gate: Gate) -> None:
    assert run(gate, lambda: 42) == 42
    with pytest.raises(ZeroDivisionError):
        run(gate, lambda: 1 / 0)
    assert run(gate, lambda: "again") == "again"


def test_a_blocked_unit_makes_the_gpu_stuck_and_nothing_is_queued_behind_it(
    gate: Gate, clock: ManualClock, names: CallNames, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="gpuscope.gpu")
    release = threading.Event()
    first = run(gate, hang(names, release, "nvmlDeviceGetPowerUsage"))
    assert first == Blocked(stuck_seconds=0.0, function="nvmlDeviceGetPowerUsage")

    clock.advance(41)
    ran: list[int] = []
    again = begin_at_once(gate, lambda: ran.append(1))  # a stuck gate makes no caller wait
    assert again == Blocked(stuck_seconds=41.0, function="nvmlDeviceGetPowerUsage")
    assert ran == []
    assert gate.blocked() == again

    release.set()
    wait_for(lambda: not gate.busy(), what="the blocked unit to return")
    assert run(gate, lambda: "fresh") == "fresh"  # the late "late" was dropped
    assert gate.blocked() is None
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2, messages
    assert "GPU 3 (GPU-3) stuck in nvmlDeviceGetPowerUsage" in messages[0]
    assert "GPU 3 (GPU-3) answers again" in messages[1]


def test_a_short_unit_of_another_caller_is_waited_for_not_taken_for_a_hang(gate: Gate) -> None:
    release = threading.Event()
    deadline_at = time.monotonic() + 10
    job = gate.begin(lambda: release.wait(10), deadline_at)
    assert isinstance(job, Job)
    threading.Timer(0.05, release.set).start()
    assert run(gate, lambda: "next") == "next"  # waited the 50 ms, within its deadline
    assert job.wait(deadline_at) is True


def test_one_gpu_hanging_never_makes_another_look_stuck(
    clock: ManualClock, names: CallNames
) -> None:
    """A scrape meets GPU 0 busy with a sampler unit that is hanging, but not yet known to
    hang: it queues its own unit there and hands GPU 1's over at once, so GPU 1 answers
    within the scrape's deadline and only GPU 0 is stuck."""
    gates = GpuGates(names, clock, deadline=SHORT)
    release = threading.Event()
    try:
        sampler = gates.gate(0).begin(hang(names, release, "nvmlDeviceGetSamples"), 1e12)
        assert isinstance(sampler, Job)
        deadline_at = gates.deadline_at()
        read0 = gates.gate(0).begin(lambda: "GPU 0", deadline_at)
        read1 = gates.gate(1).begin(lambda: "GPU 1", deadline_at)
        assert isinstance(read0, Job) and isinstance(read1, Job)
        assert read0.wait(deadline_at) == Blocked(0.0, "nvmlDeviceGetSamples")
        assert read1.wait(deadline_at) == "GPU 1"
        assert gates.gate(1).blocked() is None
    finally:
        release.set()
        assert gates.close() == []


def test_work_begun_on_the_gpus_own_worker_runs_inline(gate: Gate) -> None:
    def outer() -> Any:
        return run(gate, lambda: threading.current_thread().name)

    assert run(gate, outer) == "gpu-3"


def test_one_worker_thread_per_gpu_ever(clock: ManualClock, names: CallNames) -> None:
    gates = GpuGates(names, clock, deadline=SHORT)
    release = threading.Event()
    try:
        for index in range(4):
            assert gates.gate(index).begin(lambda: None, gates.deadline_at()) is not None
        gate = gates.gate(2)
        run(gate, hang(names, release, "nvmlDeviceGetSamples"))
        before = threading.active_count()
        for _ in range(20):
            for index in range(4):
                run(gates.gate(index), lambda: None)
        assert threading.active_count() == before
        assert gates.threads() == 4
    finally:
        release.set()
        assert gates.close() == []


def test_a_fenced_gpu_runs_only_probes_on_a_doubling_schedule(
    gate: Gate, clock: ManualClock
) -> None:
    gate.fence(119)
    assert run(gate, lambda: pytest.fail("called a fenced GPU")) == Blocked(fenced_xid=119)
    probes: list[float] = []

    def probe_at(t: float, answers: bool) -> None:
        clock.set(1000.0 + t)
        job = gate.begin_probe(lambda: probes.append(t) or answers, time.monotonic() + SHORT)
        if isinstance(job, Job):
            job.wait(time.monotonic() + SHORT)

    for t in range(0, 800):
        probe_at(float(t), answers=False)
    # 10 s after the XID, then 20, 40, 80, 160 s apart, then every 300 s.
    assert probes == [10, 30, 70, 150, 310, 610]
    assert gate.fenced_xid == 119
    probe_at(910, answers=True)
    assert gate.fenced_xid is None
    assert run(gate, lambda: "read again") == "read again"


def test_the_read_deadline_flag_rejects_what_is_not_a_duration() -> None:
    options = parse(["--gpu-read-deadline", "0.5"], env={}).collector_options["gpu"]
    assert options.gpu_read_deadline == 0.5
    for bad, message in (
        ("nan", "expected a finite number, got 'nan'"),
        ("inf", "expected a finite number, got 'inf'"),
        ("0", "expected 0.05 to 60 seconds, got 0"),
        ("600", "expected 0.05 to 60 seconds, got 600"),
    ):
        with pytest.raises(ConfigError) as err:
            parse(["--gpu-read-deadline", bad], env={})
        assert str(err.value) == f"--gpu-read-deadline: {message}"
