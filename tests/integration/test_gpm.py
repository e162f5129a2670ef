"""GPM in the GPU source: profiling-grade activity per GPU and per MIG GPU instance.

The counters must be as exact as busy seconds: rate() of `gpuscope_gpu_sm_active_seconds_total`
is the true average SM activity over any window, whatever the tick. These tests script the
fake's activity and compare with its exact integral (`FakeNvml.true_gpm_seconds`); they
also pin that GPUs without GPM export none of the families (absent, not 0), that MIG
instances get their own, and that a GPM call that fails or hangs costs that GPU alone.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from gpuscope.agent.gpu.records import nvidia
from tests.support import InProcess, wait_for

PATTERN = [(0.7, 90.0, 40.0), (0.5, 0.0, 0.0), (1.1, 35.0, 10.0), (0.3, 100.0, 80.0)]
GPM_FAMILIES = (
    "sm_active_ratio",
    "sm_occupancy_ratio",
    "graphics_engine_active_ratio",
    "tensor_active_ratio",
    "dram_active_ratio",
    "pipe_active_ratio",
    "sm_active_seconds_total",
    "tensor_active_seconds_total",
    "dram_active_seconds_total",
)
DEADLINE = "0.5"


@pytest.fixture
def inprocess(inprocess: Callable[..., InProcess]) -> Iterator[Callable[..., InProcess]]:
    """As the shared fixture, with every hang released and storm cleared before stopping."""
    started: list[InProcess] = []

    def start(*args: Any, **kwargs: Any) -> InProcess:
        started.append(inprocess(*args, **kwargs))
        return started[-1]

    yield start
    for h in started:
        h.fake.release_calls()
        h.fake.clear_error_storm()
        for gpu in range(h.fake.gpu_count()):
            wait_for(lambda h=h, g=gpu: not h.gpu.gates.gate(g).busy(), timeout=10, what="idle")


@pytest.mark.parametrize("step", [1.0, 0.4, 2.5])
def test_gpm_seconds_are_the_exact_integral_of_the_activity(inprocess, step: float) -> None:
    h = inprocess("dgx-h100")
    start = h.fake.now  # the agent took its first GPM sample at start
    h.fake.set_utilization_pattern(0, PATTERN)
    h.fake.set_gpm_activity(0, sm_active=0.6, tensor=0.3, dram=0.45)
    h.advance(20, step=step)
    h.fake.set_gpm_activity(0, sm_active=0.2, tensor=0.05)  # the job changes phase
    h.advance(20, step=step)
    metrics = h.scrape()
    for key, family in (
        ("sm_active", "gpuscope_gpu_sm_active_seconds_total"),
        ("tensor", "gpuscope_gpu_tensor_active_seconds_total"),
        ("dram", "gpuscope_gpu_dram_active_seconds_total"),
    ):
        truth = h.fake.true_gpm_seconds(0, key, start, h.fake.now)
        assert truth > 2
        assert metrics.value(family, gpu="0") == pytest.approx(truth, rel=1e-6), key


def test_ratios_are_the_last_window_and_differ_from_nvml_utilization(inprocess) -> None:
    h = inprocess("dgx-h100", "--metrics-detail", "full")
    h.fake.set_utilization(1, 100)  # "a kernel is always running" ...
    h.fake.set_gpm_activity(1, sm_active=0.1, sm_occupancy=0.05, tensor=0.0, dram=0.02,
                            fp32=0.08, fp64=0.0, fp16=0.0, integer=0.03)  # fmt: skip
    h.advance(3)
    m = h.scrape()
    assert m.value("gpuscope_gpu_utilization_ratio", gpu="1") == 1.0
    assert m.value("gpuscope_gpu_graphics_engine_active_ratio", gpu="1") == pytest.approx(1.0)
    assert m.value("gpuscope_gpu_sm_active_ratio", gpu="1") == pytest.approx(0.1)  # ... idly
    assert m.value("gpuscope_gpu_sm_occupancy_ratio", gpu="1") == pytest.approx(0.05)
    assert m.value("gpuscope_gpu_dram_active_ratio", gpu="1") == pytest.approx(0.02)
    assert m.by_label("gpuscope_gpu_pipe_active_ratio", "pipe", gpu="1") == pytest.approx(
        {"fp64": 0.0, "fp32": 0.08, "fp16": 0.0, "integer": 0.03}
    )


def test_mig_instances_have_their_own_gpm_series(inprocess) -> None:
    h = inprocess("dgx-h100-mig", "--metrics-detail", "full")
    start = h.fake.now
    h.fake.set_utilization_pattern(6, PATTERN)
    devices = h.fake.mig_devices(6)
    for n, gi in enumerate(sorted({d["gpu_instance_id"] for d in devices})):
        h.fake.set_gpm_activity(6, sm_active=0.2 * (n + 1), tensor=0.1 * n, mig_instance=gi)
    h.advance(12, step=0.5)
    m = h.scrape()
    uuid = h.fake.gpu_uuid(6)
    for d in devices:
        labels = {"gpu": "6", "uuid": uuid, "mig_uuid": d["uuid"]}
        gi = d["gpu_instance_id"]
        truth = h.fake.true_gpm_seconds(6, "sm_active", start, h.fake.now, mig_instance=gi)
        assert m.value("gpuscope_mig_sm_active_seconds_total", **labels) == pytest.approx(
            truth, rel=1e-6
        )
        assert 0 <= m.value("gpuscope_mig_sm_active_ratio", **labels) <= 1
    whole = h.fake.true_gpm_seconds(6, "sm_active", start, h.fake.now)
    assert m.value("gpuscope_gpu_sm_active_seconds_total", gpu="6") == pytest.approx(
        whole, rel=1e-6
    )
    # NVML has no utilization samples on a MIG GPU: GPM is what the instances have.
    assert m.get("gpuscope_gpu_busy_seconds_total", gpu="6") is None
    assert not m.series("gpuscope_mig_sm_active_ratio", gpu="0")


@pytest.mark.parametrize("profile", ["hgx-a100-mig", "pcie-l40s"])
def test_gpus_without_gpm_export_none_of_the_families(inprocess, profile: str) -> None:
    h = inprocess(profile, "--metrics-detail", "full")
    h.fake.set_utilization(0, 80)
    h.advance(3)
    m = h.scrape()
    for suffix in GPM_FAMILIES:
        assert not m.series(f"gpuscope_gpu_{suffix}"), suffix
        assert not m.series(f"gpuscope_mig_{suffix}"), suffix
    assert h.gpu.nvml.errors == {}  # "not supported" is not an error


def test_mixed_node_has_gpm_on_the_hoppers_only(inprocess) -> None:
    h = inprocess("mixed", "--metrics-detail", "full")
    h.advance(3)
    m = h.scrape()
    hopper = set(m.by_label("gpuscope_gpu_info", "gpu", architecture="hopper"))
    assert hopper == {"0", "1"}
    assert set(m.by_label("gpuscope_gpu_sm_active_seconds_total", "gpu")) == hopper


def test_a_driver_before_r520_has_no_gpm_and_no_error(inprocess) -> None:
    h = inprocess("dgx-h100", setup=lambda fake: fake.set_driver("515.105.01"))
    h.advance(3)
    m = h.scrape()
    assert not m.series("gpuscope_gpu_sm_active_seconds_total")
    assert m.value("gpuscope_gpu_up", gpu="0") == 1
    assert h.gpu.nvml.errors == {}


def test_an_error_storm_loses_no_gpm_time_and_touches_no_other_gpu(inprocess, caplog) -> None:
    h = inprocess("dgx-h100")
    start = h.fake.now
    h.fake.set_utilization_pattern(2, PATTERN)
    h.fake.set_utilization_pattern(3, PATTERN)
    h.advance(5)
    with caplog.at_level(logging.WARNING, logger="gpuscope.gpu.nvml"):
        h.fake.error_storm(999, function="nvmlGpmMetricsGet", gpu=2, count=4)
        h.advance(6)  # 4 ticks fail, then the window since the last good sample counts
        h.fake.error_storm(999, function="nvmlGpmSampleGet", gpu=2, count=3)
        h.advance(6)
    m = h.scrape()
    for gpu in (2, 3):
        truth = h.fake.true_gpm_seconds(gpu, "sm_active", start, h.fake.now)
        got = m.value("gpuscope_gpu_sm_active_seconds_total", gpu=str(gpu))
        assert got == pytest.approx(truth, rel=1e-6)
    assert m.value("gpuscope_gpu_up", gpu="2") == 1
    lines = [r.getMessage() for r in caplog.records if "nvmlGpm" in r.getMessage()]
    assert len(lines) == 2, lines  # one line per failing call, not one per tick


def test_a_hung_gpm_call_holds_its_gpu_alone_and_loses_nothing(inprocess) -> None:
    h = inprocess("dgx-h100", "--gpu-read-deadline", DEADLINE)
    start = h.fake.now
    h.fake.set_utilization_pattern(5, PATTERN)
    h.fake.set_utilization_pattern(4, PATTERN)
    h.advance(3)
    h.fake.hang_call("nvmlGpmSampleGet", gpu=5)
    h.advance(1)  # the sampler's tick gives up on GPU 5 after the deadline
    h.fake.wait_blocked(count=1, function="nvmlGpmSampleGet", gpu=5)
    h.advance(4)
    m = h.scrape()
    assert m.value("gpuscope_gpu_up", gpu="5") == 0
    assert m.series("gpuscope_gpu_stuck_call_info", gpu="5", function="nvmlGpmSampleGet")
    truth4 = h.fake.true_gpm_seconds(4, "sm_active", start, h.fake.now)
    assert m.value("gpuscope_gpu_sm_active_seconds_total", gpu="4") == pytest.approx(
        truth4, rel=1e-6
    )
    h.fake.release_calls()
    wait_for(lambda: not h.gpu.gates.gate(5).busy(), what="the blocked call to return")
    h.advance(2)
    back = h.scrape()
    assert back.value("gpuscope_gpu_up", gpu="5") == 1
    # The blocked sample was taken when the call returned: the windows around it are whole.
    truth5 = h.fake.true_gpm_seconds(5, "sm_active", start, h.fake.now)
    assert back.value("gpuscope_gpu_sm_active_seconds_total", gpu="5") == pytest.approx(
        truth5, rel=1e-6
    )


def test_bindings_without_gpm_wrappers_still_get_gpm(inprocess, monkeypatch) -> None:
    """The agent lays out the GPM structs itself: bindings that lack the wrappers, metric ids
    or struct classes (older nvidia-ml-py) change nothing."""
    import pynvml

    for name in [n for n in dir(pynvml) if "Gpm" in n or n.startswith("NVML_GPM")]:
        monkeypatch.delattr(pynvml, name)
    h = inprocess("dgx-h100")
    h.advance(3)
    assert len(h.scrape().series("gpuscope_gpu_sm_active_seconds_total")) == 8


def test_mig_instances_get_busy_and_idle_time_from_gpm(inprocess) -> None:
    """The records the attribution stage builds MIG busy time and allocated-but-idle on."""
    h = inprocess("dgx-h100-mig")
    start = h.fake.now
    h.fake.set_utilization_pattern(7, PATTERN)
    instances = sorted({d["gpu_instance_id"] for d in h.fake.mig_devices(7)})
    idle_gi = instances[-1]
    h.fake.set_gpm_activity(7, graphics=0.0, mig_instance=idle_gi)  # holds the slice, runs nothing
    h.advance(10, step=0.5)
    [reading] = [r for r in h.gpu.read().gpus if r.identity.index == 7]
    assert nvidia(reading).mig_instances
    for mig in nvidia(reading).mig_instances:
        assert mig.integrals is not None and mig.gpm is not None
        gi = mig.gpu_instance
        busy = h.fake.true_gpm_seconds(7, "graphics", start, h.fake.now, mig_instance=gi)
        assert mig.integrals.busy_seconds == pytest.approx(busy, rel=1e-6)
        if gi == idle_gi:
            assert mig.integrals.busy_seconds == 0
            assert mig.integrals.idle_seconds == pytest.approx(10.0)
        else:  # the pattern idles 0.5 s of every 2.6 s; ticks every 0.5 s see some of it
            assert mig.integrals.busy_seconds > 2
            assert mig.integrals.idle_seconds < 10.0
