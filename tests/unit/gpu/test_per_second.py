"""The GPU source's per-second figures (agent/gpu/source.py): counters' increase over the
source's last window, or the sampler's latest throughput reading where it integrates."""

from __future__ import annotations

from gpuscope.agent.accelerators.records import DeviceIdentity
from gpuscope.agent.gpu.records import GpuIntegrals, GpuReading, NvidiaReading
from gpuscope.agent.gpu.sampler import RateIntegrator
from gpuscope.agent.gpu.source import _Counters

IDENT = DeviceIdentity(0, "GPU-0", "H100", "00000000:18:00.0", "", "hopper", 0, "nvidia")


def reading(pcie: float | None, nvlink: tuple[int, int] | None) -> GpuReading:
    tx, rx = nvlink if nvlink is not None else (None, None)
    return GpuReading(
        identity=IDENT, up=True, extension=NvidiaReading(), pcie_transmit_bytes=pcie,
        pcie_receive_bytes=pcie, link_transmit_bytes=tx, link_receive_bytes=rx,
    )  # fmt: skip


def ext(r: GpuReading) -> NvidiaReading:
    assert r.extension is not None
    return r.extension


def test_counters_increase_over_the_last_window() -> None:
    counters, none = _Counters(), GpuIntegrals()
    first = ext(counters.with_rates(reading(1000.0, (10, 20)), none, 100.0))
    assert first.pcie_transmit_bytes_per_second is None  # no window yet
    assert first.nvlink_bytes_per_second is None
    second = ext(counters.with_rates(reading(5000.0, (110, 220)), none, 102.0))
    assert second.pcie_transmit_bytes_per_second == 2000.0
    assert second.pcie_receive_bytes_per_second == 2000.0
    assert second.nvlink_bytes_per_second == 150.0  # (100 + 200) / 2 s, both directions
    back = ext(counters.with_rates(reading(10.0, (0, 0)), none, 104.0))  # a driver reload
    assert back.pcie_transmit_bytes_per_second is None and back.nvlink_bytes_per_second is None
    absent = ext(counters.with_rates(reading(None, None), none, 106.0))
    assert absent.pcie_transmit_bytes_per_second is None and absent.nvlink_bytes_per_second is None


def test_integrated_pcie_takes_the_samplers_reading_not_a_window() -> None:
    counters = _Counters()
    sampled = GpuIntegrals(pcie_transmit_bytes=500.0, pcie_receive_bytes=500.0,
                           pcie_transmit_rate=4096.0, pcie_receive_rate=None)  # fmt: skip
    got = ext(counters.with_rates(reading(500.0, None), sampled, 100.0))
    assert got.pcie_transmit_bytes_per_second == 4096.0
    assert got.pcie_receive_bytes_per_second is None  # the reading is no longer held


def test_rate_integrator_holds_its_latest_reading_for_max_gap() -> None:
    r = RateIntegrator(max_gap=4.0)
    r.start(0.0)
    assert r.current(0.0) is None
    r.add(1.0, 2048.0)
    assert r.current(5.0) == 2048.0
    assert r.current(5.1) is None


def test_the_source_computes_them_only_when_dcgm_names_are_served() -> None:
    """Their one reader is --dcgm-compat: without it a collection does not pay for them."""
    from gpuscope.agent.app.config import parse
    from gpuscope.agent.clock import SystemClock
    from gpuscope.agent.gpu.collector import GPU
    from gpuscope.agent.gpu.source import GpuSource
    from gpuscope.agent.runtime.spec import BuildContext

    for value, wanted in (("off", False), ("on", True), ("exported-labels", True)):
        config = parse(["--collectors", "gpu", "--dcgm-compat", value], env={})
        source = GPU.build(BuildContext(config.agent, config.of(GPU), SystemClock(), False))
        assert isinstance(source, GpuSource)
        assert source.config.per_second_figures is wanted
