"""AMD SMI's numbers into the contract's: the pure parts of agent/amd, on literal values as
the bindings return them (the whole path runs over the real bindings in
tests/integration/test_amd_collector.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuscope.agent.accelerators.records import DeviceIdentity, Partition
from gpuscope.agent.amd import device as dev
from gpuscope.agent.amd.records import AmdGpuReading, AmdGpus, AmdReading, AmdSnapshot, GpuLink
from gpuscope.agent.amd.sampler import _Sample, _window_ratio
from gpuscope.exporters.labels.amd import interconnect

GIB = 1 << 30


def sample(counter: float | None, acc: float | None, activity: float | None = None) -> _Sample:
    return _Sample(activity, counter, acc, {}, {}, {})


def test_the_window_ratio_is_the_accumulators_mean_activity() -> None:
    # 1,000 firmware samples at 40 %: the accumulator grew by 40,000.
    assert _window_ratio(sample(5_000, 100_000), sample(6_000, 140_000)) == (0.4, "accumulator")


def test_a_counter_that_went_backwards_is_a_reset_not_negative_work() -> None:
    ratio, source = _window_ratio(sample(6_000, 140_000), sample(10, 200))
    assert ratio is None and source == "accumulator"


def test_without_accumulators_the_tick_activity_stands_for_the_window() -> None:
    assert _window_ratio(sample(None, None), sample(None, None, 75)) == (0.75, "sampled")
    assert _window_ratio(sample(None, None), sample(None, None, None)) == (None, "")


@pytest.mark.parametrize(
    ("speed", "generation"),
    [(32000, 5), (16000, 4), (2500, 1), (32, 5), (0, None), ("N/A", None), (1000, None)],
)
def test_pcie_generation_from_the_speed(speed: object, generation: int | None) -> None:
    assert dev._generation(speed) == generation


def device(memory_partition: str, processors: int) -> dev.Device:
    identity = DeviceIdentity(0, "u0", "AMD Instinct MI300X", "0000:05:00.0", "", "cdna3", 0, "amd")
    procs = tuple(
        dev.Processor(None, f"p{i}", "0000:05:00.0", i, 128 + i) for i in range(processors)
    )
    return dev.Device(identity, procs, "gfx942", 0x74A1, 304, "CPX", memory_partition)


def part(used: int | None, total: int | None) -> Partition:
    return Partition("p", "CPX", 0.125, memory_used_bytes=used, memory_total_bytes=total)


def test_a_cpx_nps4_gpu_counts_each_memory_domain_once() -> None:
    """Two XCPs of a CPX/NPS4 MI300X report the same 48 GiB domain."""
    parts = [part(10 * GIB, 48 * GIB)] * 8
    assert dev._gpu_memory(device("NPS4", 8), parts) == (40 * GIB, 192 * GIB)
    assert dev._gpu_memory(device("NPS1", 8), [part(GIB, 192 * GIB)] * 8) == (GIB, 192 * GIB)


def test_a_memory_mode_the_agent_cannot_read_leaves_the_gpu_memory_absent() -> None:
    assert dev._gpu_memory(device("", 8), [part(GIB, 48 * GIB)] * 8) == (None, None)
    assert dev._gpu_memory(device("NPS4", 8), [part(None, 48 * GIB)] * 8)[0] is None


def test_partition_names_come_from_the_drivers_platform_devices(tmp_path: Path) -> None:
    for n, minor in ((0, 129), (1, 130)):
        (tmp_path / "devices/platform" / f"amdgpu_xcp_{n}" / "drm" / f"renderD{minor}").mkdir(
            parents=True
        )
    names = dev.xcp_devices(tmp_path)
    assert names == {129: "amdgpu_xcp_0", 130: "amdgpu_xcp_1"}
    first = dev.Processor(None, "u-0", "0000:05:00.0", 0, 128)
    second = dev.Processor(None, "u-1", "0000:05:00.1", 1, 129)
    assert dev._plugin_ids(first, names) == ("u-0", "0000:05:00.0")
    assert dev._plugin_ids(second, names) == ("u-1", "amdgpu_xcp_0")
    assert dev.xcp_devices(tmp_path / "missing") == {}


def snapshot(links: dict[tuple[int, int], GpuLink], n: int = 4) -> AmdGpus:
    gpus = tuple(
        AmdGpuReading(
            DeviceIdentity(i, f"u{i}", "m", "", "", "cdna3", 0, "amd"), True, AmdReading(socket=i)
        )
        for i in range(n)
    )
    return AmdGpus("amd", "", "", gpus, AmdSnapshot(links=links))


def test_interconnect_is_xgmi_only_when_every_pair_is_directly_linked() -> None:
    pairs = [(i, j) for i in range(4) for j in range(4) if i != j]
    assert interconnect(snapshot({p: GpuLink("xgmi", 1) for p in pairs})) == "xgmi"
    some = {p: GpuLink("xgmi", 1 if p in ((0, 1), (1, 0)) else 2) for p in pairs}
    assert interconnect(snapshot(some)) == "xgmi-partial"
    assert interconnect(snapshot({p: GpuLink("pcie", 2) for p in pairs})) == "pcie"
    assert interconnect(snapshot({})) == "pcie"  # nothing known: no claim of a fabric


def test_partitions_that_share_their_gpus_uuid_get_names_of_their_own() -> None:
    """XCP 0 reports the GPU's UUID, and before ROCm 7.0 every XCP does."""
    shared = [dev.Processor(None, "u", "0000:05:00.0", i, 128 + i) for i in range(3)]
    assert [p.uuid for p in dev.distinct(shared, "u")] == ["u-xcp0", "u-xcp1", "u-xcp2"]
    own = [dev.Processor(None, f"u{i}", "0000:05:00.0", i, 128 + i) for i in range(3)]
    assert [p.uuid for p in dev.distinct(own, "u0")] == ["u0-xcp0", "u1", "u2"]
