"""The fake NVML's realistic-timing mode and timed behaviours, through the real pynvml.

Realistic mode (the `dgx-h100-realistic` profile, or `FakeNvml.set_realistic_timing()`):
utilization samples only while the GPU is busy, per-process samples at their own cadence,
nvmlDeviceGetPcieThroughput blocking for its 20 ms interval. Independent of the mode: per-call
latency (`set_call_latency`) and fabric states scheduled on the fake clock (`script_fabric`).
See tests/doubles/README.md. The last test runs the agent's sampler on the realistic profile.
"""

from __future__ import annotations

import ctypes
import statistics
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml as nv
import pytest

from tests.doubles.fakenvml.control import FakeNvml

T0 = 1_700_000_000.0  # frozen fake clock, epoch seconds (a multiple of 5 s)
MIB = 1024 * 1024
GPU = nv.NVML_GPU_UTILIZATION_SAMPLES

Make = Callable[..., FakeNvml]


@pytest.fixture
def make_fake(tmp_path: Path) -> Iterator[Make]:
    """make(profile): a fake at T0, activated in this process, nvmlInit done (one at a time)."""
    active = 0

    def make(profile: str = "dgx-h100-realistic", now: float | None = T0) -> FakeNvml:
        nonlocal active
        while active:
            nv.nvmlShutdown()
            active -= 1
        fake = FakeNvml(profile, tmp_path / f"{profile}-{time.monotonic_ns()}.state", now=now)
        fake.activate()
        nv.nvmlInit()
        active += 1
        assert nv.nvmlDeviceGetUUID(nv.nvmlDeviceGetHandleByIndex(0)) == fake.gpu_uuid(0)
        return fake

    yield make
    while active:
        nv.nvmlShutdown()
        active -= 1


def h(i: int) -> Any:
    return nv.nvmlDeviceGetHandleByIndex(i)


def samples(handle: Any, last_seen: int = 0, kind: int = GPU) -> list[tuple[int, int]]:
    """(timestamp µs, value) of the samples newer than last_seen; [] on NOT_FOUND."""
    try:
        _, got = nv.nvmlDeviceGetSamples(handle, kind, last_seen)
    except nv.NVMLError_NotFound:
        return []
    return [(int(s.timeStamp), int(s.sampleValue.uiVal)) for s in got]


def grid(fake: FakeNvml, a: float, b: float) -> list[int]:
    """Sample-period grid points (µs) in (a, b]."""
    p = round(fake.sample_period * 1e6)
    lo, hi = round(a * 1e6) // p, round(b * 1e6) // p
    return [k * p for k in range(lo + 1, hi + 1)]


def timed(call: Callable[[], Any], n: int = 3) -> float:
    """Median wall seconds of n calls."""
    took = []
    for _ in range(n):
        t = time.perf_counter()
        call()
        took.append(time.perf_counter() - t)
    return statistics.median(took)


# ---- utilization sample ring -------------------------------------------------------------------


def test_realistic_ring_is_empty_while_idle_and_fills_at_the_period_while_busy(
    make_fake: Make,
) -> None:
    fake = make_fake()
    assert fake.realistic_timing
    # Idle since boot: the driver took no sample at all.
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetSamples(h(0), GPU, 0)
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetSamples(h(0), nv.NVML_MEMORY_UTILIZATION_SAMPLES, 0)
    assert nv.nvmlDeviceGetUtilizationRates(h(0)).gpu == 0
    # Power is sampled regardless.
    assert samples(h(0), kind=nv.NVML_TOTAL_POWER_SAMPLES)

    fake.set_utilization(0, 60)
    fake.advance(3)
    busy = samples(h(0))
    # One sample per period, at the period's grid, from the first period that saw work.
    assert [ts for ts, _ in busy] == grid(fake, T0, T0 + 3)
    assert {v for _, v in busy[1:]} == {60}
    assert len(busy) == 18

    fake.set_utilization(0, 0)
    last = busy[-1][0]
    fake.advance(10)
    tail = samples(h(0), last)
    # At most the one period that straddles the end of the work; then the ring runs dry.
    assert len(tail) <= 1 and all(v > 0 for _, v in tail)
    newest = tail[-1][0] if tail else last
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetSamples(h(0), GPU, newest)
    assert nv.nvmlDeviceGetUtilizationRates(h(0)).gpu == 0  # the current reading is idle
    # The ring still holds the busy samples, however old.
    assert [ts for ts, _ in samples(h(0))] == [ts for ts, _ in busy] + [ts for ts, _ in tail]

    # A long busy stretch: the newest 120 are kept, and the idle gap leaves no samples.
    fake.set_utilization(0, 100)
    fake.advance(30)
    ring = samples(h(0))
    assert len(ring) == 120
    assert [ts for ts, _ in ring] == grid(fake, T0 + 13, T0 + 43)[-120:]


def test_default_mode_samples_every_period_even_when_idle(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    assert not fake.realistic_timing
    idle = samples(h(0))
    assert len(idle) == 120 and {v for _, v in idle} == {0}


def test_realistic_ring_skips_idle_gaps_inside_a_pattern(make_fake: Make) -> None:
    fake = make_fake()
    fake.set_utilization_pattern(1, [(1.0, 50, 20), (4.0, 0, 0)])  # 1 s busy every 5 s
    fake.advance(20)
    got = samples(h(1))
    assert got and all(v > 0 for _, v in got)
    busy_windows = 4
    per_window = 1 / fake.sample_period  # 6 samples per busy second, +1 straddling the edge
    assert busy_windows * per_window <= len(got) <= busy_windows * (per_window + 2)
    # Every sample's period overlaps a busy second of the pattern.
    for ts, _ in got:
        offset = (ts / 1e6 - T0) % 5.0
        assert offset <= 1.0 + fake.sample_period + 1e-6


def test_mode_can_be_switched_on_a_default_profile(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    fake.set_realistic_timing(process_sample_period=2.0)
    with pytest.raises(nv.NVMLError_NotFound):
        nv.nvmlDeviceGetSamples(h(0), GPU, 0)
    fake.set_realistic_timing(False)
    assert len(samples(h(0))) == 120


# ---- per-process samples -----------------------------------------------------------------------


def test_process_samples_come_at_their_own_cadence(make_fake: Make) -> None:
    fake = make_fake()
    assert fake.process_sample_period == 5.0
    fake.set_utilization(0, 70)
    fake.add_process(0, 4242, 10 * MIB, sm_util=70, mem_util=30)
    fake.add_process(0, 4343, 10 * MIB)  # no utilization: not listed (nvml.h)
    first = nv.nvmlDeviceGetProcessUtilization(h(0), 0)
    assert [(s.pid, s.smUtil, s.memUtil, s.timeStamp) for s in first] == [
        (4242, 70, 30, round(T0 * 1e6))
    ]
    seen = first[0].timeStamp
    for _ in range(29):  # every utilization sample period up to 4.83 s: nothing new
        fake.advance(fake.sample_period)
        with pytest.raises(nv.NVMLError_NotFound):
            nv.nvmlDeviceGetProcessUtilization(h(0), seen)
    fake.set_time(T0 + 5)
    (second,) = nv.nvmlDeviceGetProcessUtilization(h(0), seen)
    assert second.timeStamp == seen + 5_000_000


def test_process_samples_in_default_mode_come_every_period(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    fake.add_process(0, 4242, 10 * MIB, sm_util=70, mem_util=30)
    seen = nv.nvmlDeviceGetProcessUtilization(h(0), 0)[0].timeStamp
    fake.advance(fake.sample_period)
    assert nv.nvmlDeviceGetProcessUtilization(h(0), seen)[0].timeStamp > seen


def test_process_util_scale_exceeds_100_only_when_asked(make_fake: Make) -> None:
    fake = make_fake()
    fake.set_utilization(2, 90)
    fake.add_process(2, 77, MIB, sm_util=90, mem_util=60)
    assert nv.nvmlDeviceGetProcessUtilization(h(2), 0)[0].smUtil == 90
    fake.set_process_util_scale(2, 1.5)
    (s,) = nv.nvmlDeviceGetProcessUtilization(h(2), 0)
    assert (s.smUtil, s.memUtil) == (135, 90)


# ---- PCIe throughput blocks for its interval ---------------------------------------------------


def test_pcie_throughput_takes_its_20ms_interval_only_in_realistic_mode(make_fake: Make) -> None:
    make_fake("dgx-h100")
    fast = timed(lambda: nv.nvmlDeviceGetPcieThroughput(h(0), nv.NVML_PCIE_UTIL_TX_BYTES))
    assert fast < 0.01
    make_fake()
    slow = timed(lambda: nv.nvmlDeviceGetPcieThroughput(h(0), nv.NVML_PCIE_UTIL_RX_BYTES))
    assert 0.020 <= slow < 0.1
    # Other calls stay fast.
    assert timed(lambda: nv.nvmlDeviceGetPowerUsage(h(0))) < 0.01


def test_pcie_wait_does_not_hold_up_other_threads(make_fake: Make) -> None:
    """The wait is slept outside the library lock: other threads' calls go on meanwhile."""
    make_fake()
    handle = h(0)
    t = threading.Thread(
        target=lambda: [
            nv.nvmlDeviceGetPcieThroughput(handle, nv.NVML_PCIE_UTIL_TX_BYTES) for _ in range(5)
        ]
    )
    t.start()
    time.sleep(0.01)
    took = timed(lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU), n=5)
    t.join()
    assert took < 0.01


# ---- per-call latency --------------------------------------------------------------------------


def test_latency_delays_exactly_the_named_call_on_the_named_gpu(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    fake.set_call_latency(0.05, "nvmlDeviceGetPowerUsage", gpu=1)
    assert 0.05 <= timed(lambda: nv.nvmlDeviceGetPowerUsage(h(1))) < 0.15
    assert timed(lambda: nv.nvmlDeviceGetPowerUsage(h(0))) < 0.01
    assert timed(lambda: nv.nvmlDeviceGetTemperature(h(1), nv.NVML_TEMPERATURE_GPU)) < 0.01

    fake.set_call_latency(0.03, "nvmlDeviceGetPowerUsage")  # every GPU; gpu 1's rule wins there
    assert 0.03 <= timed(lambda: nv.nvmlDeviceGetPowerUsage(h(0))) < 0.1
    assert 0.05 <= timed(lambda: nv.nvmlDeviceGetPowerUsage(h(1))) < 0.15

    # A helper shared by entry points still delays only the one named.
    fake.set_call_latency(0.03, "nvmlDeviceGetMaxPcieLinkWidth")
    assert timed(lambda: nv.nvmlDeviceGetCurrPcieLinkWidth(h(0))) < 0.01
    assert timed(lambda: nv.nvmlDeviceGetMaxPcieLinkWidth(h(0))) >= 0.03

    fake.set_call_latency(0, "nvmlDeviceGetPowerUsage", gpu=1)
    fake.set_call_latency(0, "nvmlDeviceGetPowerUsage")
    assert timed(lambda: nv.nvmlDeviceGetPowerUsage(h(1))) < 0.01


def test_latency_for_every_call(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    fake.set_call_latency(0.02)
    assert timed(lambda: nv.nvmlDeviceGetTemperature(h(3), nv.NVML_TEMPERATURE_GPU)) >= 0.02
    assert timed(nv.nvmlSystemGetDriverVersion) >= 0.02
    fake.set_call_latency(0.02, gpu=3)  # every call on GPU 3's handles
    fake.set_call_latency(0)  # removes the rule for every call; GPU 3's stays
    assert timed(lambda: nv.nvmlDeviceGetTemperature(h(2), nv.NVML_TEMPERATURE_GPU)) < 0.01
    assert timed(lambda: nv.nvmlDeviceGetTemperature(h(3), nv.NVML_TEMPERATURE_GPU)) >= 0.02
    with pytest.raises(ValueError):
        fake.set_call_latency(-1)
    with pytest.raises(ValueError):
        fake.set_call_latency(0.1, "GetPowerUsage")


def test_no_latency_rule_costs_nothing_measurable(make_fake: Make) -> None:
    make_fake("dgx-h100")
    handle = h(0)
    t = time.perf_counter()
    for _ in range(2000):
        nv.nvmlDeviceGetPowerUsage(handle)
    assert (time.perf_counter() - t) / 2000 < 0.0005


# ---- fabric moving on the fake clock -----------------------------------------------------------


def fabric(handle: Any) -> tuple[int, int]:
    info = nv.c_nvmlGpuFabricInfoV_t()
    info.version = nv.nvmlGpuFabricInfo_v2
    nv.nvmlDeviceGetGpuFabricInfoV(handle, ctypes.byref(info))
    return info.state, info.status


@pytest.mark.pinned_bindings("nvidia-ml-py 12.535 has no nvmlGpuFabricInfoV struct")
def test_fabric_registration_moves_on_schedule(make_fake: Make) -> None:
    fake = make_fake("gb200-nvl")
    completed = fabric(h(0))
    assert completed[0] == nv.NVML_GPU_FABRIC_STATE_COMPLETED
    fake.script_fabric(
        0,
        [
            (0, "not_started", nv.NVML_ERROR_NOT_READY),
            (5, "in_progress", nv.NVML_ERROR_NOT_READY),
            (20, "completed", nv.NVML_SUCCESS),
        ],
    )
    assert fabric(h(0)) == (nv.NVML_GPU_FABRIC_STATE_NOT_STARTED, nv.NVML_ERROR_NOT_READY)
    assert fabric(h(1)) == completed  # only the scripted GPU moves
    fake.advance(4.9)
    assert fabric(h(0))[0] == nv.NVML_GPU_FABRIC_STATE_NOT_STARTED
    fake.advance(0.1)
    assert fabric(h(0)) == (nv.NVML_GPU_FABRIC_STATE_IN_PROGRESS, nv.NVML_ERROR_NOT_READY)
    # The unversioned call follows the same script.
    old = nv.c_nvmlGpuFabricInfo_t()
    nv.nvmlDeviceGetGpuFabricInfo(h(0), ctypes.byref(old))
    assert old.state == nv.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    fake.advance(14.999)
    assert fabric(h(0))[0] == nv.NVML_GPU_FABRIC_STATE_IN_PROGRESS
    fake.advance(0.001)
    assert fabric(h(0)) == (nv.NVML_GPU_FABRIC_STATE_COMPLETED, nv.NVML_SUCCESS)
    fake.advance(3600)
    assert fabric(h(0)) == (nv.NVML_GPU_FABRIC_STATE_COMPLETED, nv.NVML_SUCCESS)

    with pytest.raises(ValueError):
        fake.script_fabric(0, [(5, "in_progress", 0), (1, "completed", 0)])
    with pytest.raises(ValueError):
        make_fake("dgx-h100").script_fabric(0, [(0, "completed", 0)])  # no fabric there


# ---- the agent on the realistic profile --------------------------------------------------------


def test_agent_busy_and_idle_seconds_on_the_realistic_profile(inprocess) -> None:
    """The ring runs dry while a GPU idles: the sampler falls back to the current reading
    (agent/gpu/sampler.py), so idle time is idle, and busy time is still the true integral."""
    h = inprocess("dgx-h100-realistic")
    uuid = h.fake.gpu_uuid(0)
    start = h.fake.now
    # Busy bursts with idle gaps longer than a tick, then a long idle stretch.
    h.fake.set_utilization_pattern(
        0, [(7.0, 90.0, 40.0), (5.0, 0.0, 0.0), (11.0, 35.0, 10.0), (3.0, 0.0, 0.0)]
    )
    h.advance(52)
    h.fake.set_utilization(0, 0)
    before = h.gpu.sampler.integrals()[uuid]
    h.advance(30)
    after = h.gpu.sampler.integrals()[uuid]

    busy = h.scrape().value("gpuscope_gpu_busy_seconds_total", gpu="0")
    truth = h.fake.true_busy_seconds(0, start, h.fake.now)
    assert truth > 20
    assert busy == pytest.approx(truth, rel=0.03)
    # While idle, the idle clock runs (within a tick), and nothing is left unsampled.
    assert after.idle_seconds - before.idle_seconds == pytest.approx(30, abs=1.5)
    assert after.busy_seconds == pytest.approx(before.busy_seconds, abs=0.2)
    assert after.unsampled_seconds - before.unsampled_seconds <= 1.5


def test_agent_short_idle_gaps_are_idle_not_unsampled(inprocess) -> None:
    h = inprocess("dgx-h100-realistic")
    uuid = h.fake.gpu_uuid(0)
    h.fake.set_utilization_pattern(
        0, [(7.0, 90.0, 40.0), (5.0, 0.0, 0.0), (11.0, 35.0, 10.0), (3.0, 0.0, 0.0)]
    )
    h.advance(52)
    got = h.gpu.sampler.integrals()[uuid]
    # 5 + 3 + 5 + 3 s idle. The busy -> idle edge is idle at once (the rate reading covers
    # from the last sampled tick); at each idle -> busy edge the time from the last dry tick
    # to the first new sample (under one tick, 1 s) is covered by nothing: unsampled.
    edges = 4
    assert 16 - edges * 1.0 - 0.5 <= got.idle_seconds <= 16.5
    assert got.idle_seconds + got.unsampled_seconds == pytest.approx(16, abs=1.5)
