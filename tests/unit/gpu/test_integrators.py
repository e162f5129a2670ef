"""The sampler's integrators on literal numbers: utilization samples and held rates become
busy seconds, each sample counted once (the sampler on the fake NVML is
tests/integration/test_sampler.py)."""

from __future__ import annotations

import pytest

from gpuscope.agent.gpu.sampler import RateIntegrator, UtilizationIntegrator


def test_first_sample_only_sets_the_starting_point() -> None:
    i = UtilizationIntegrator(idle_threshold=0.0)
    i.add_samples([(10_000_000, 100.0)])
    assert i.busy_seconds == 0
    i.add_samples([(11_000_000, 50.0), (12_000_000, 100.0)])
    assert i.busy_seconds == pytest.approx(1.5)


def test_repeated_and_out_of_order_samples_count_once() -> None:
    i = UtilizationIntegrator(idle_threshold=0.0)
    i.add_samples([(1_000_000, 0.0), (2_000_000, 100.0)])
    i.add_samples([(2_000_000, 100.0), (1_500_000, 100.0), (3_000_000, 20.0)])
    assert i.busy_seconds == pytest.approx(1.2)
    assert i.last_active == pytest.approx(3.0)


def test_rates_are_held_from_the_previous_tick() -> None:
    i = UtilizationIntegrator(idle_threshold=0.1)
    i.add_rate(100.0, 5000.0, 50.0)
    i.add_rate(102.0, 5002.0, 50.0)
    i.add_rate(103.0, 5003.0, 5.0)
    assert i.busy_seconds == pytest.approx(1.0 + 0.05)
    assert i.last_active == 5002.0  # wall time, not the monotonic clock


def test_rate_integrator_counts_only_elapsed_time() -> None:
    r = RateIntegrator()
    r.add(10.0, 100.0)  # first reading: nothing elapsed yet
    r.add(10.0, 100.0)
    r.add(12.5, 40.0)
    assert r.total == pytest.approx(100.0)


# --- what a stall or a gap is worth (issue "truth on real NVIDIA drivers", item 3) ----------


def test_one_sample_after_a_long_gap_counts_one_period_not_the_gap() -> None:
    """The sampler starved for 300 s (or the ring ran dry while the GPU idled): the next
    100% sample is the busy share of one sample period, not of 300 s."""
    i = UtilizationIntegrator(idle_threshold=0.0)
    i.add_samples([(10_000_000 + k * 166_667, 0.0) for k in range(7)])  # 1 s idle
    assert i.period_us == 166_667
    i.add_samples([(311_000_002, 100.0)])
    assert i.busy_seconds == pytest.approx(0.166667)
    assert i.idle_seconds == pytest.approx(1.0, abs=1e-5)


def test_samples_with_timestamp_zero_or_values_above_100_are_dropped() -> None:
    i = UtilizationIntegrator(idle_threshold=0.0)
    i.add_samples([(1_000_000, 10.0), (0, 100.0), (1_500_000, 250.0), (2_000_000, 50.0)])
    assert i.dropped_samples == 2
    assert i.busy_seconds == pytest.approx(0.5)  # 1 s at 50%, nothing from the bad ones
    i.add_rate(10.0, 10.0, 100.0)
    i.add_rate(11.0, 11.0, -1.0)
    assert i.dropped_samples == 3


def test_covered_and_unsampled_time_add_up_to_the_time_since_the_first_tick() -> None:
    """busy + not busy + unsampled = wall time, per GPU."""
    i = UtilizationIntegrator(idle_threshold=0.0)
    i.tick(100.0)
    i.add_samples([(100_000_000 + k * 200_000, 100.0 * (k % 2)) for k in range(26)])  # 5 s
    i.tick(105.0)
    i.tick(125.0)  # a 20 s stall, then samples again
    i.add_samples([(125_000_000 + k * 200_000, 40.0) for k in range(6)])
    i.tick(126.0)
    busy, not_busy = i.busy_seconds, i.covered_seconds - i.busy_seconds
    assert busy + not_busy + i.unsampled_seconds == pytest.approx(126.0 - 100.0)
    assert i.unsampled_seconds == pytest.approx(26.0 - 5.0 - 1.2, abs=0.01)
    assert busy <= i.covered_seconds


def test_a_rate_reading_is_held_no_longer_than_its_cap() -> None:
    i = UtilizationIntegrator(idle_threshold=0.0, max_rate_gap=2.0)
    i.tick(0.0)
    i.add_rate(0.0, 0.0, 100.0)
    i.add_rate(60.0, 60.0, 100.0)  # a minute-long stall between two readings
    i.tick(60.0)
    assert i.busy_seconds == pytest.approx(2.0)
    assert i.unsampled_seconds == pytest.approx(58.0)
