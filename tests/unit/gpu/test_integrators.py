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
