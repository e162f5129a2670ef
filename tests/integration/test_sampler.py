"""The sampler turns utilization into busy seconds: rate() of the counter must be the true
average utilization over any window, whatever the tick or scrape interval (on the fake NVML;
the integrators on literal numbers are tests/unit/gpu/test_integrators.py)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from gpuscope.agent.app.agent import Agent
from gpuscope.agent.app.config import parse
from gpuscope.agent.gpu.collector import GPU
from gpuscope.agent.gpu.sampler import Sampler
from tests.doubles.fakenvml.control import FakeNvml
from tests.support import wait_for

# A training-like pattern: compute bursts, an all-reduce stall, a data-loading gap.
PATTERN = [(7.0, 90.0, 40.0), (5.0, 0.0, 0.0), (11.0, 35.0, 10.0), (3.0, 100.0, 80.0)]


@pytest.mark.parametrize("step", [1.0, 0.4, 2.5, 15.0])
def test_busy_seconds_match_true_integral_over_60_seconds(inprocess, step: float) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", "full")
    start = h.fake.now
    h.fake.set_utilization_pattern(0, PATTERN)
    h.advance(60, step=step)

    busy = h.scrape().value("gpuscope_gpu_busy_seconds_total", gpu="0")
    truth = h.fake.true_busy_seconds(0, start, h.fake.now)

    assert truth > 20  # the pattern is far from idle: a 1% bound means something
    assert busy == pytest.approx(truth, rel=0.01)


def test_idle_gpu_accumulates_nothing_and_keeps_no_last_active(inprocess) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", "full")
    h.fake.set_utilization(1, 0)
    h.advance(30)
    metrics = h.scrape()
    assert metrics.value("gpuscope_gpu_busy_seconds_total", gpu="1") == 0
    assert metrics.get("gpuscope_gpu_last_active_timestamp_seconds", gpu="1") is None


def test_last_active_is_the_last_busy_sample_not_the_scrape(inprocess) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", "full")
    h.fake.set_utilization_pattern(2, [(10.0, 50.0, 10.0), (50.0, 0.0, 0.0)], repeat=False)
    busy_until = h.fake.now + 10
    h.advance(40)
    last = h.scrape().value("gpuscope_gpu_last_active_timestamp_seconds", gpu="2")
    # A sample covers the period before its timestamp, so the last busy one may end up to
    # one sample period (1/6 s on H100) after the work stopped.
    period = h.fake.sample_period
    assert busy_until - period <= last <= busy_until + period


def test_idle_threshold_ignores_light_background_load(inprocess) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", "full", "--idle-threshold", "0.05")
    h.fake.set_utilization(3, 3)  # a monitoring probe, not a training job
    h.advance(10)
    assert h.scrape().get("gpuscope_gpu_last_active_timestamp_seconds", gpu="3") is None
    h.fake.set_utilization(3, 60)
    h.advance(2)
    assert h.scrape().value("gpuscope_gpu_last_active_timestamp_seconds", gpu="3") > 0


def _stall(h, seconds: float) -> None:
    """Time passes on the GPU and the agent's clock while the sampler thread does not run."""
    h.fake.advance(seconds)
    h.clock.advance(seconds)


def test_a_stalled_sampler_never_invents_busy_time(inprocess) -> None:
    """After a 300 s stall on a busy GPU (NVML's ring holds 20 s), busy time grows by what
    the ring still holds plus at most one period; the rest is unsampled, and busy + not
    busy + unsampled is the wall time."""
    h = inprocess("dgx-h100", "--metrics-detail", "full")
    h.fake.set_utilization(0, 100)
    h.advance(10)
    before = h.scrape()
    _stall(h, 300)
    h.advance(1)
    after = h.scrape()
    busy = after.value("gpuscope_gpu_busy_seconds_total", gpu="0") - before.value(
        "gpuscope_gpu_busy_seconds_total", gpu="0"
    )
    unsampled = after.value("gpuscope_gpu_unsampled_seconds_total", gpu="0")
    ring = 120 * h.fake.sample_period  # FAKE_SAMPLE_RING samples
    assert ring < 30 and busy <= ring + h.fake.sample_period  # not 301 s
    assert unsampled == pytest.approx(301 - ring, abs=2 * h.fake.sample_period)
    util = h.gpu.sampler._states[h.fake.gpu_uuid(0)].util  # type: ignore[union-attr]
    total = util.busy_seconds + (util.covered_seconds - util.busy_seconds) + unsampled
    assert total == pytest.approx(311, abs=h.fake.sample_period)


def test_pcie_throughput_is_read_one_gpu_per_tick_outside_the_tick_lock(
    inprocess, monkeypatch
) -> None:
    """dgx-h100 runs R550, without the PCIe byte counter fields (R555+): the sampler reads
    nvmlDeviceGetPcieThroughput, which measures over 20 ms per call. Reading TX and RX of
    8 GPUs every tick held the tick lock for 320 ms a second; now one GPU a tick, unlocked."""
    import pynvml

    h = inprocess("dgx-h100", "--metrics-detail", "full")
    sampler = h.gpu.sampler
    assert sampler is not None
    calls: list[tuple[int, bool]] = []
    throughput = pynvml.nvmlDeviceGetPcieThroughput

    def timed(handle, counter):  # type: ignore[no-untyped-def]
        calls.append((pynvml.nvmlDeviceGetIndex(handle), sampler._tick_lock.locked()))
        return throughput(handle, counter)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPcieThroughput", timed)
    h.advance(16)
    assert len(calls) == 2 * 16  # TX and RX of one GPU per tick
    assert sorted({gpu for gpu, _ in calls}) == list(range(8))  # every GPU in turn
    assert not any(locked for _, locked in calls)


def test_the_start_leaves_pcie_throughput_to_the_sampler_thread(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each nvmlDeviceGetPcieThroughput call measures over 20 ms (nvml.h): asked at start,
    once to learn that a GPU has it and both ways for the first tick's step, it held the
    agent's first series back by 40 ms or more (issue #24). The agent's start asks none:
    every call is the sampler thread's, whose first tick takes the first step."""
    import pynvml

    calls: list[int] = []
    steps: list[str] = []
    throughput = pynvml.nvmlDeviceGetPcieThroughput
    step = Sampler._pcie_step

    def counted(handle, counter):  # type: ignore[no-untyped-def]
        calls.append(pynvml.nvmlDeviceGetIndex(handle))
        return throughput(handle, counter)

    def noted(self: Sampler) -> None:
        steps.append(threading.current_thread().name)
        step(self)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPcieThroughput", counted)
    monkeypatch.setattr(Sampler, "_pcie_step", noted)
    FakeNvml("dgx-h100", tmp_path / "state").activate()
    # Ticks 3 s apart: the first collection is long done before the first tick's step.
    flags = ["--listen", "127.0.0.1:0", "--collectors", "gpu", "--sample-interval", "3"]
    agent = Agent(parse(flags, env={}))
    try:
        first = agent.start()  # the first collection, as the first scrape gets it
        gpus = first.collection.records(GPU)
        assert gpus is not None and len(gpus.gpus) == 8
        assert calls == []  # the first collection is done: nothing held a GPU's gate for it
        wait_for(lambda: len(steps) >= 1, timeout=10, what="the sampler's first PCIe step")
    finally:
        agent.stop()  # joins the sampler thread: the lists are final
    assert set(steps) == {"gpu-sampler"}
    assert len(calls) == 2 * len(steps)  # both ways, in steps only: no probe at start


def test_a_gpu_without_counters_or_throughput_call_exports_no_pcie_bytes(
    inprocess, monkeypatch
) -> None:
    """Which GPUs have the throughput call is learnt at their first PCIe step: one answering
    NOT_SUPPORTED keeps no integrated counters from then on; the others keep theirs."""
    import pynvml

    throughput = pynvml.nvmlDeviceGetPcieThroughput

    def gpu0_lacks_it(handle, counter):  # type: ignore[no-untyped-def]
        if pynvml.nvmlDeviceGetIndex(handle) == 0:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return throughput(handle, counter)

    monkeypatch.setattr(pynvml, "nvmlDeviceGetPcieThroughput", gpu0_lacks_it)
    h = inprocess("dgx-h100", "--metrics-detail", "full")
    h.advance(8)
    metrics = h.scrape()
    assert metrics.get("gpuscope_gpu_pcie_transmit_bytes_total", gpu="0") is None
    assert metrics.get("gpuscope_gpu_pcie_receive_bytes_total", gpu="0") is None
    assert metrics.value("gpuscope_gpu_pcie_transmit_bytes_total", gpu="1") >= 0
    assert metrics.get("gpuscope_nvml_errors_total", function="nvmlDeviceGetPcieThroughput") is None
