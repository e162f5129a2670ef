"""A lost GPU (fell off the bus, XID 79) is reported as down; every other GPU keeps
reporting and the agent keeps serving."""

from __future__ import annotations

import pytest


def test_lost_gpu_is_down_and_the_others_keep_reporting(inprocess) -> None:
    h = inprocess("dgx-h100")
    h.fake.set_utilization(4, 80)
    h.advance(3)
    h.fake.lose_gpu(3)
    metrics = h.scrape()

    up = metrics.by_label("gpuscope_gpu_up", "gpu")
    assert up == {str(i): (0 if i == 3 else 1) for i in range(8)}
    assert metrics.value("gpuscope_collector_success", collector="gpu") == 1
    # Its identity stays (so alerts can name it); its readings are gone, not zeroed.
    assert metrics.get("gpuscope_gpu_info", gpu="3") == 1
    assert metrics.get("gpuscope_gpu_memory_used_bytes", gpu="3") is None
    assert metrics.get("gpuscope_gpu_power_watts", gpu="3") is None
    # The others are complete.
    assert metrics.value("gpuscope_gpu_utilization_ratio", gpu="4") == pytest.approx(0.8)
    assert len(metrics.series("gpuscope_gpu_memory_used_bytes")) == 7

    # The sampler also survives a lost GPU on its ticks.
    h.advance(3)
    assert h.scrape().value("gpuscope_gpu_busy_seconds_total", gpu="4") > 0


def test_gpu_comes_back_after_a_reset(inprocess) -> None:
    h = inprocess("dgx-h100")
    h.fake.lose_gpu(6)
    h.advance(2)
    assert h.scrape().value("gpuscope_gpu_up", gpu="6") == 0
    h.fake.restore_gpu(6)
    h.advance(2)
    metrics = h.scrape()
    assert metrics.value("gpuscope_gpu_up", gpu="6") == 1
    assert metrics.get("gpuscope_gpu_memory_total_bytes", gpu="6") is not None


def test_gpu_lost_before_the_agent_started_is_reported_and_found_later(inprocess) -> None:
    h = inprocess("dgx-h100", setup=lambda fake: fake.lose_gpu(7))
    metrics = h.scrape()
    assert metrics.value("gpuscope_gpu_up", gpu="7") == 0
    assert metrics.value("gpuscope_collector_success", collector="gpu") == 1
    assert len(metrics.series("gpuscope_gpu_up")) == 8

    h.fake.restore_gpu(7)
    h.advance(2)  # the next scrape, past --collection-max-age
    metrics = h.scrape()
    assert metrics.value("gpuscope_gpu_up", gpu="7") == 1
    assert metrics.series("gpuscope_gpu_info", gpu="7", model="NVIDIA H100 80GB HBM3")
