"""A hung or slow GPU is confined to that GPU: the scrape answers with the other GPUs'
fresh readings and the hung one as down with its stuck time, one thread per GPU whatever
happens, and normal service once the blocked call returns (agent/accelerators/gate.py).

The fake NVML holds a GPU's calls in the kernel-like way a GSP timeout does (`hang_call`:
blocked until released, no lock held) or slows them (`set_call_latency`). The agent's
clock is moved by hand, so stuck times are exact; the read deadline is real time, kept
short here (0.5 s) so that the tests are quick.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support import InProcess, wait_for

DEADLINE = "0.5"
BOUND = 20.0  # seconds a scrape may take here before it counts as frozen (normally < 1 s)


@pytest.fixture
def inprocess(inprocess: Callable[..., InProcess]) -> Iterator[Callable[..., InProcess]]:
    """The agent on the fake, with every hang and slow call ended before it stops, even
    when a test fails half-way (a worker still blocked at stop leaves NVML initialized)."""
    started: list[InProcess] = []

    def start(*args: Any, **kwargs: Any) -> InProcess:
        started.append(inprocess(*args, **kwargs))
        return started[-1]

    yield start
    for h in started:
        h.fake.release_calls()
        h.fake.set_call_latency(0)
        for gpu in range(h.fake.gpu_count()):
            h.fake.set_call_latency(0, gpu=gpu)
        for gate in range(h.fake.gpu_count()):
            wait_for(gate_idle(h, gate), timeout=10, what=f"GPU {gate}'s call to return")


def scrape_within(h: InProcess, bound: float = BOUND) -> Any:
    """A scrape on another thread, waited for at most `bound` seconds: a scrape that hangs
    fails the test instead of freezing it. Time moves first (scrapes are seconds apart, and
    the agent reuses a collection younger than --collection-max-age)."""
    h.clock.advance(2)
    h.fake.advance(2)
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(h.scrape()), daemon=True)
    thread.start()
    thread.join(bound)
    assert result, f"the scrape did not answer within {bound} s"
    return result[0]


def gate_idle(h: InProcess, gpu: int) -> Callable[[], bool]:
    return lambda: not h.gpu.gates.gate(gpu).busy()


def test_one_hung_gpu_is_down_with_its_stuck_time_and_the_others_stay_fresh(
    inprocess, caplog
) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", "full", "--gpu-read-deadline", DEADLINE)
    h.advance(2)
    h.fake.hang_call("nvmlDeviceGetPowerUsage", gpu=3)
    h.fake.set_power(4, 321.0)
    with caplog.at_level(logging.INFO, logger="gpuscope.gpu"):
        metrics = scrape_within(h)

        up = metrics.by_label("gpuscope_gpu_up", "gpu")
        assert up == {str(i): (0 if i == 3 else 1) for i in range(8)}
        assert metrics.value("gpuscope_collector_success", collector="gpu") == 1
        assert metrics.value("gpuscope_gpu_stuck_seconds", gpu="3") >= 0
        assert metrics.series(
            "gpuscope_gpu_stuck_call_info", gpu="3", function="nvmlDeviceGetPowerUsage"
        )
        # Its identity stays, its readings go; the others are read now, not remembered.
        assert metrics.get("gpuscope_gpu_info", gpu="3") == 1
        assert metrics.get("gpuscope_gpu_power_watts", gpu="3") is None
        assert metrics.value("gpuscope_gpu_power_watts", gpu="4") == pytest.approx(321.0)
        assert len(metrics.series("gpuscope_gpu_memory_used_bytes")) == 7
        assert [c.gpu for c in h.fake.blocked_calls()] == [3]

        # Stuck time is the age of the blocked call on the agent's clock.
        h.advance(30)
        later = scrape_within(h)
        assert later.value("gpuscope_gpu_stuck_seconds", gpu="3") == pytest.approx(32)
        assert later.value("gpuscope_gpu_up", gpu="3") == 0
        assert later.value("gpuscope_gpu_stuck_seconds", gpu="5") == 0

        h.fake.release_calls()
        wait_for(gate_idle(h, 3), what="the blocked call to return")
        h.fake.set_power(3, 123.0)
        back = scrape_within(h)

    assert back.value("gpuscope_gpu_up", gpu="3") == 1
    assert back.value("gpuscope_gpu_stuck_seconds", gpu="3") == 0
    assert back.value("gpuscope_gpu_power_watts", gpu="3") == pytest.approx(123.0)
    assert not back.series("gpuscope_gpu_stuck_call_info")
    records = [r for r in caplog.records if "GPU 3 " in r.getMessage()]
    lines = [r.getMessage() for r in records]
    assert len(lines) == 2, lines  # once each way, not once per scrape
    assert "stuck in nvmlDeviceGetPowerUsage" in lines[0]
    assert "answers again" in lines[1]
    assert [r.levelname for r in records] == ["WARNING", "INFO"]


def test_scrapes_while_a_gpu_hangs_queue_nothing_and_start_no_thread(inprocess) -> None:
    h = inprocess("dgx-h100", "--gpu-read-deadline", DEADLINE)
    h.fake.hang_call(gpu=6)  # every call on GPU 6
    scrape_within(h)
    threads = threading.active_count()
    for _ in range(6):
        h.advance(1)  # the sampler skips it too
        metrics = scrape_within(h)
        assert metrics.value("gpuscope_gpu_up", gpu="6") == 0
    assert threading.active_count() <= threads  # threads of earlier tests may end meanwhile
    assert h.gpu.gates.threads() == 8  # one worker per GPU, ever
    assert len(h.fake.blocked_calls()) == 1  # one outstanding call, however many scrapes
    h.fake.release_calls()
    wait_for(gate_idle(h, 6), what="the blocked call to return")
    assert scrape_within(h).value("gpuscope_gpu_up", gpu="6") == 1


def test_the_sampler_keeps_integrating_the_other_gpus(inprocess) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", "full", "--gpu-read-deadline", DEADLINE)
    h.fake.set_utilization_pattern(0, [(3.0, 80.0, 40.0), (2.0, 10.0, 5.0)])
    h.fake.set_utilization(3, 50)
    h.advance(2)
    start = h.fake.now  # the last tick: what the scrape's counter covers
    before = scrape_within(h)
    busy_before = before.value("gpuscope_gpu_busy_seconds_total", gpu="0")
    h.fake.hang_call("nvmlDeviceGetSamples", gpu=3)
    h.advance(40)
    h.fake.release_calls()
    wait_for(gate_idle(h, 3), what="the blocked call to return")
    h.advance(1)
    end = h.fake.now
    after = scrape_within(h)

    busy = after.value("gpuscope_gpu_busy_seconds_total", gpu="0") - busy_before
    truth = h.fake.true_busy_seconds(0, start, end)
    assert truth > 10
    assert busy == pytest.approx(truth, rel=0.02)
    # GPU 3's hung time is unsampled (NVML's ring, 20 s, held only its last part), never busy.
    assert after.value("gpuscope_gpu_unsampled_seconds_total", gpu="3") > 15
    assert after.value("gpuscope_gpu_unsampled_seconds_total", gpu="0") < 1


def test_a_slow_gpu_is_confined_like_a_hung_one(inprocess) -> None:
    """Each call on GPU 2 takes 2 s: one read of it (dozens of calls) would take minutes."""
    h = inprocess("dgx-h100", "--metrics-detail", "full", "--gpu-read-deadline", DEADLINE)
    h.advance(1)
    h.fake.set_call_latency(2.0, gpu=2)
    for _ in range(3):
        metrics = scrape_within(h)
        up = metrics.by_label("gpuscope_gpu_up", "gpu")
        assert up == {str(i): (0 if i == 2 else 1) for i in range(8)}
    assert metrics.value("gpuscope_gpu_stuck_seconds", gpu="2") > 0
    assert h.gpu.gates.threads() == 8
    h.fake.set_call_latency(0, gpu=2)
    wait_for(gate_idle(h, 2), timeout=10, what="the slow call to return")
    assert scrape_within(h).value("gpuscope_gpu_up", gpu="2") == 1


def test_a_gpu_hung_from_the_start_is_reported_and_found_when_it_answers(inprocess) -> None:
    h = inprocess(
        "dgx-h100",
        "--metrics-detail",
        "full",
        "--gpu-read-deadline",
        DEADLINE,
        setup=lambda f: f.hang_call(gpu=5),
    )
    metrics = scrape_within(h)
    assert len(metrics.series("gpuscope_gpu_up")) == 8
    assert metrics.value("gpuscope_gpu_up", gpu="5") == 0
    assert metrics.value("gpuscope_gpu_stuck_seconds", gpu="5") > 0
    assert metrics.value("gpuscope_gpu_up", gpu="4") == 1

    h.fake.release_calls()
    wait_for(gate_idle(h, 5), what="the blocked call to return")
    found = scrape_within(h)
    assert found.value("gpuscope_gpu_up", gpu="5") == 1
    assert found.series("gpuscope_gpu_info", gpu="5", uuid=h.fake.gpu_uuid(5))
