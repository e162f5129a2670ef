"""Tests of the fake NVML library, driven only through the real pynvml bindings.

pynvml loads libnvidia-ml.so.1 once per process, so every test activates its own
fake (a fresh state file) between a full nvmlShutdown and nvmlInit.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml as nv
import pytest

from tests.doubles.fakenvml.control import (
    LIB_DIR,
    NO_INSTANCE,
    FakeNvml,
    ensure_built,
    list_profiles,
    load_profile,
)

T0 = 1_700_000_000.0  # frozen fake clock, epoch seconds
MIB = 1024 * 1024

EXPORTED = {
    "nvmlInit", "nvmlInit_v2", "nvmlInitWithFlags", "nvmlShutdown", "nvmlErrorString",
    "nvmlSystemGetDriverVersion", "nvmlSystemGetNVMLVersion", "nvmlSystemGetCudaDriverVersion",
    "nvmlSystemGetCudaDriverVersion_v2", "nvmlDeviceGetCount", "nvmlDeviceGetCount_v2",
    "nvmlDeviceGetHandleByIndex", "nvmlDeviceGetHandleByIndex_v2", "nvmlDeviceGetHandleByUUID",
    "nvmlDeviceGetHandleByPciBusId_v2", "nvmlDeviceGetIndex", "nvmlDeviceGetMinorNumber",
    "nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetSerial",
    "nvmlDeviceGetBoardPartNumber", "nvmlDeviceGetPciInfo_v3", "nvmlDeviceGetArchitecture",
    "nvmlDeviceGetCudaComputeCapability", "nvmlDeviceGetNumaNodeId", "nvmlDeviceGetPowerUsage",
    "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit",
    "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetTemperature", "nvmlDeviceGetClockInfo",
    "nvmlDeviceGetMaxClockInfo", "nvmlDeviceGetPersistenceMode", "nvmlDeviceGetBrand",
    "nvmlDeviceGetCurrentClocksEventReasons", "nvmlDeviceGetCurrentClocksThrottleReasons",
    "nvmlDeviceGetSamples", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetPcieThroughput",
    "nvmlDeviceGetPcieReplayCounter", "nvmlDeviceGetCurrPcieLinkGeneration",
    "nvmlDeviceGetMaxPcieLinkGeneration", "nvmlDeviceGetGpuMaxPcieLinkGeneration",
    "nvmlDeviceGetCurrPcieLinkWidth", "nvmlDeviceGetMaxPcieLinkWidth", "nvmlDeviceGetNvLinkState",
    "nvmlDeviceGetFieldValues", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetTotalEccErrors", "nvmlDeviceGetRemappedRows", "nvmlDeviceGetSupportedEventTypes",
    "nvmlEventSetCreate", "nvmlDeviceRegisterEvents", "nvmlEventSetWait", "nvmlEventSetWait_v2",
    "nvmlEventSetFree", "nvmlDeviceGetComputeRunningProcesses_v2",
    "nvmlDeviceGetConfComputeMemSizeInfo", "nvmlDeviceGetRunningProcessDetailList",
    "nvmlDeviceGetComputeRunningProcesses_v3", "nvmlDeviceGetProcessUtilization",
    "nvmlDeviceGetMigMode", "nvmlDeviceGetMaxMigDeviceCount", "nvmlDeviceGetMigDeviceHandleByIndex",
    "nvmlDeviceIsMigDeviceHandle", "nvmlDeviceGetGpuInstanceId", "nvmlDeviceGetComputeInstanceId",
    "nvmlDeviceGetDeviceHandleFromMigDeviceHandle",
    "nvmlDeviceGetTopologyCommonAncestor", "nvmlDeviceGetTopologyNearestGpus",
    "nvmlSystemGetTopologyGpuSet", "nvmlDeviceGetNvLinkRemotePciInfo_v2",
    "nvmlDeviceGetNvLinkRemoteDeviceType", "nvmlDeviceGetNvLinkCapability",
    "nvmlDeviceGetGpuFabricInfo", "nvmlDeviceGetGpuFabricInfoV",
    "nvmlGpmQueryDeviceSupport", "nvmlGpmSampleAlloc", "nvmlGpmSampleFree", "nvmlGpmSampleGet",
    "nvmlGpmMigSampleGet", "nvmlGpmMetricsGet",
}  # fmt: skip

NVLINK_CRC_DATA_FIELDS = [*range(39, 45), *range(102, 108)]  # ..._CRC_DATA_ERROR_COUNT_L0..L11


def addr(handle: Any) -> int | None:
    return ctypes.cast(handle, ctypes.c_void_p).value


def lib() -> ctypes.CDLL:
    return ctypes.CDLL(str(ensure_built()))


def err(code: int) -> type[nv.NVMLError]:
    cls: type[nv.NVMLError] = nv.nvmlExceptionClass(code)
    return cls


Make = Callable[..., FakeNvml]


@pytest.fixture
def make_fake(tmp_path: Path) -> Iterator[Make]:
    """Returns make(profile, now=T0): a fake activated in this process with nvmlInit done."""
    active = 0

    def make(
        profile: str = "dgx-h100", now: float | None = T0, driver: str | None = None
    ) -> FakeNvml:
        nonlocal active
        while active:
            nv.nvmlShutdown()
            active -= 1
        fake = FakeNvml(profile, tmp_path / f"{profile}-{time.monotonic_ns()}.state", now=now)
        if driver is not None:
            fake.set_driver(driver)
        fake.activate()
        nv.nvmlInit()
        active += 1
        # Guard against a library left initialized (on another state) by other code.
        handle = nv.nvmlDeviceGetHandleByIndex(0)
        assert nv.nvmlDeviceGetUUID(handle) == fake.gpu_uuid(0), "NVML was already initialized"
        return fake

    yield make
    while active:
        nv.nvmlShutdown()
        active -= 1


def handles(fake: FakeNvml) -> list[Any]:
    return [nv.nvmlDeviceGetHandleByIndex(i) for i in range(fake.gpu_count())]


def fields(handle: Any, ids: list[int | tuple[int, int]]) -> list[Any]:
    return list(nv.nvmlDeviceGetFieldValues(handle, ids))


# ---- build, symbols, lifecycle ---------------------------------------------------------------


def test_exported_symbols_are_exactly_the_documented_set() -> None:
    path = ensure_built()
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True
    ).stdout
    symbols = {line.split()[-1] for line in out.splitlines() if " T " in line}
    assert {s for s in symbols if s.startswith("nvml")} == EXPORTED
    soname = subprocess.run(
        ["objdump", "-p", str(path)], capture_output=True, text=True, check=True
    ).stdout
    assert "SONAME               libnvidia-ml.so.1" in soname


def test_missing_symbol_is_function_not_found(make_fake: Make) -> None:
    make_fake("dgx-h100")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(err(nv.NVML_ERROR_FUNCTION_NOT_FOUND)):
        nv.nvmlDeviceSetPersistenceMode(h, 0)  # a driver for observability has no setters


def test_init_without_state_is_driver_not_loaded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    FakeNvml("pcie-l40s", tmp_path / "s").activate()
    monkeypatch.setenv("FAKENVML_STATE", str(tmp_path / "missing"))
    with pytest.raises(err(nv.NVML_ERROR_DRIVER_NOT_LOADED)):
        nv.nvmlInit()
    monkeypatch.delenv("FAKENVML_STATE")
    with pytest.raises(err(nv.NVML_ERROR_DRIVER_NOT_LOADED)):
        nv.nvmlInit()


def test_shutdown_is_refcounted_and_calls_need_init(make_fake: Make) -> None:
    make_fake("pcie-l40s")
    nv.nvmlInitWithFlags(0)
    nv.nvmlShutdown()
    assert nv.nvmlDeviceGetCount() == 4  # still initialized once
    nv.nvmlShutdown()
    count = ctypes.c_uint()
    assert lib().nvmlDeviceGetCount_v2(ctypes.byref(count)) == nv.NVML_ERROR_UNINITIALIZED
    assert lib().nvmlShutdown() == nv.NVML_ERROR_UNINITIALIZED
    nv.nvmlInit()  # the fixture shuts down once more at teardown


def test_error_strings() -> None:
    assert nv.nvmlErrorString(nv.NVML_ERROR_NOT_SUPPORTED) == "Not Supported"
    assert nv.nvmlErrorString(nv.NVML_ERROR_GPU_IS_LOST) == "GPU is lost"
    assert nv.nvmlErrorString(nv.NVML_ERROR_INSUFFICIENT_SIZE) == "Insufficient Size"
    assert nv.nvmlErrorString(nv.NVML_SUCCESS) == "Success"
    assert nv.nvmlErrorString(12345) == "Unknown Error"


# ---- identity --------------------------------------------------------------------------------


@pytest.mark.parametrize("profile", list_profiles())
def test_identity_matches_profile(make_fake: Make, profile: str) -> None:
    fake = make_fake(profile)
    spec = load_profile(profile)
    assert nv.nvmlDeviceGetCount() == len(spec["gpus"]) == fake.gpu_count()
    assert nv.nvmlSystemGetDriverVersion() == spec["driver_version"]
    assert nv.nvmlSystemGetNVMLVersion() == spec["nvml_version"]
    assert nv.nvmlSystemGetCudaDriverVersion() == spec["cuda_driver_version"]
    assert nv.nvmlSystemGetCudaDriverVersion_v2() == spec["cuda_driver_version"]
    archs = {"hopper": nv.NVML_DEVICE_ARCH_HOPPER, "ampere": nv.NVML_DEVICE_ARCH_AMPERE,
             "ada": nv.NVML_DEVICE_ARCH_ADA,
             "blackwell": nv.NVML_DEVICE_ARCH_BLACKWELL}  # fmt: skip
    for i, (h, g) in enumerate(zip(handles(fake), spec["gpus"], strict=True)):
        assert nv.nvmlDeviceGetIndex(h) == i
        assert nv.nvmlDeviceGetMinorNumber(h) == i
        assert nv.nvmlDeviceGetName(h) == g["name"]
        assert nv.nvmlDeviceGetUUID(h) == g["uuid"]
        assert nv.nvmlDeviceGetSerial(h) == g["serial"]
        assert nv.nvmlDeviceGetBoardPartNumber(h) == g["board_part_number"]
        pci = nv.nvmlDeviceGetPciInfo(h)
        assert pci.busId == g["pci_bus_id"]
        assert pci.busIdLegacy == g["pci_bus_id"][4:]
        assert pci.bus == int(g["pci_bus_id"].split(":")[1], 16)
        assert pci.pciDeviceId == int(g["pci_device_id"], 16)
        assert pci.pciSubSystemId == int(g["pci_subsystem_id"], 16)
        assert nv.nvmlDeviceGetArchitecture(h) == archs[g["architecture"]]
        assert list(nv.nvmlDeviceGetCudaComputeCapability(h)) == g["cuda_compute_capability"]
        if int(spec["driver_version"].split(".")[0]) >= 550:
            assert nv.nvmlDeviceGetNumaNodeId(h) == g["numa_node"]
        else:  # nvmlDeviceGetNumaNodeId is R550+
            with pytest.raises(err(nv.NVML_ERROR_FUNCTION_NOT_FOUND)):
                nv.nvmlDeviceGetNumaNodeId(h)
        assert nv.nvmlDeviceGetBrand(h) == nv.NVML_BRAND_NVIDIA
        assert nv.nvmlDeviceGetPersistenceMode(h) == nv.NVML_FEATURE_ENABLED
        assert nv.nvmlDeviceGetMemoryInfo(h).total == g["memory_total_mib"] * MIB
        assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == g["power_limit_w"] * 1000
        assert nv.nvmlDeviceGetPowerManagementLimit(h) == g["power_limit_w"] * 1000
        clocks = g["clocks_mhz"]
        assert nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM) == clocks["sm_max"]
        assert nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_GRAPHICS) == clocks["graphics_max"]
        assert nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM) == clocks["memory"]
        assert nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM) == clocks["memory"]
        assert nv.nvmlDeviceGetMaxPcieLinkGeneration(h) == g["pcie"]["max_generation"]
        assert nv.nvmlDeviceGetMaxPcieLinkWidth(h) == g["pcie"]["max_width"]
        assert addr(nv.nvmlDeviceGetHandleByUUID(g["uuid"])) == addr(h)
        assert addr(nv.nvmlDeviceGetHandleByPciBusId(g["pci_bus_id"])) == addr(h)
        assert addr(nv.nvmlDeviceGetHandleByPciBusId(g["pci_bus_id"][4:].lower())) == addr(h)
    with pytest.raises(err(nv.NVML_ERROR_NOT_FOUND)):
        nv.nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-000000000000")
    with pytest.raises(err(nv.NVML_ERROR_INVALID_ARGUMENT)):
        nv.nvmlDeviceGetHandleByIndex(fake.gpu_count())


def test_dgx_h100_specifics(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    hs = handles(fake)
    assert [nv.nvmlDeviceGetPciInfo(h).busId[9:11] for h in hs] == [
        "18", "2A", "3A", "5D", "9A", "AB", "BA", "DB"
    ]  # fmt: skip
    assert [nv.nvmlDeviceGetNumaNodeId(h) for h in hs] == [0, 0, 0, 0, 1, 1, 1, 1]
    h = hs[0]
    assert nv.nvmlDeviceGetName(h) == "NVIDIA H100 80GB HBM3"
    assert nv.nvmlDeviceGetMemoryInfo(h).total == 81559 * MIB
    assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == 700_000
    assert nv.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
    assert nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_SM) == 1980
    assert nv.nvmlDeviceGetMaxClockInfo(h, nv.NVML_CLOCK_MEM) == 2619
    assert nv.nvmlDeviceGetMaxPcieLinkGeneration(h) == 5
    assert nv.nvmlDeviceGetGpuMaxPcieLinkGeneration(h) == 5
    assert fields(h, [nv.NVML_FI_DEV_NVLINK_LINK_COUNT])[0].value.uiVal == 18
    assert len({nv.nvmlDeviceGetUUID(x) for x in hs}) == len(
        {nv.nvmlDeviceGetSerial(x) for x in hs}
    )


def test_mixed_profile_has_two_models(make_fake: Make) -> None:
    fake = make_fake("mixed")
    names = [nv.nvmlDeviceGetName(h) for h in handles(fake)]
    assert len(set(names)) == 2
    link_counts = [fields(h, [nv.NVML_FI_DEV_NVLINK_LINK_COUNT])[0] for h in handles(fake)]
    not_supported = nv.NVML_ERROR_NOT_SUPPORTED
    assert [f.nvmlReturn for f in link_counts] == [0, 0, not_supported, not_supported]
    assert [f.value.uiVal for f in link_counts[:2]] == [18, 18]


# ---- utilization samples ---------------------------------------------------------------------


def test_samples_protocol(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    period = round(fake.sample_period * 1e6)
    now_us = round(fake.now * 1e6)

    vtype, samples = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert vtype == nv.NVML_VALUE_TYPE_UNSIGNED_INT
    assert len(samples) == 120  # ring buffer, the fake has been up for an hour
    stamps = [s.timeStamp for s in samples]
    assert all(ts % period == 0 for ts in stamps)
    assert all(b - a == period for a, b in itertools.pairwise(stamps))
    assert now_us - period < stamps[-1] <= now_us
    assert {s.sampleValue.uiVal for s in samples} == {0}

    with pytest.raises(err(nv.NVML_ERROR_NOT_FOUND)):
        nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, stamps[-1])

    fake.set_utilization(0, 60, 25)
    fake.advance(1.0)
    _, new = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, stamps[-1])
    assert len(new) in (5, 6) and new[0].timeStamp == stamps[-1] + period
    assert new[-1].sampleValue.uiVal == 60
    _, mem = nv.nvmlDeviceGetSamples(h, nv.NVML_MEMORY_UTILIZATION_SAMPLES, stamps[-1])
    assert mem[-1].sampleValue.uiVal == 25
    rates = nv.nvmlDeviceGetUtilizationRates(h)
    assert (rates.gpu, rates.memory) == (60, 25)

    # The raw two-call protocol: NULL buffer -> count; a short buffer gets the oldest samples.
    fn = lib().nvmlDeviceGetSamples
    vt, count = ctypes.c_uint(), ctypes.c_uint(0)
    last = ctypes.c_ulonglong(stamps[-1])
    assert fn(h, 1, last, ctypes.byref(vt), ctypes.byref(count), None) == nv.NVML_SUCCESS
    assert count.value == len(new)
    buf = (nv.c_nvmlSample_t * 2)()
    count.value = 2
    assert fn(h, 1, last, ctypes.byref(vt), ctypes.byref(count), buf) == nv.NVML_SUCCESS
    assert count.value == 2 and buf[0].timeStamp == new[0].timeStamp
    assert fn(h, 7, last, ctypes.byref(vt), ctypes.byref(count), None) == 3  # clock samples

    _, power = nv.nvmlDeviceGetSamples(h, nv.NVML_TOTAL_POWER_SAMPLES, stamps[-1])
    assert power[-1].sampleValue.uiVal == nv.nvmlDeviceGetPowerUsage(h)


def test_sample_integral_matches_true_busy_time(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    h = nv.nvmlDeviceGetHandleByIndex(2)
    period = round(fake.sample_period * 1e6)
    _, initial = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, 0)
    last_seen = initial[-1].timeStamp
    # An irregular training-like pattern whose segments do not align with samples.
    fake.set_utilization_pattern(2, [(0.7, 100, 60), (1.3, 35, 10), (0.45, 0, 0), (0.2, 87, 40)])
    collected = []
    for _ in range(120):  # 60 frozen seconds in 0.5 s steps
        fake.advance(0.5)
        try:
            _, samples = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, last_seen)
        except nv.NVMLError_NotFound:
            continue
        collected.extend(samples)
        last_seen = samples[-1].timeStamp
    stamps = [s.timeStamp for s in collected]
    assert all(b - a == period for a, b in itertools.pairwise(stamps))  # no gaps
    measured = sum(s.sampleValue.uiVal / 100 * period / 1e6 for s in collected)
    truth = fake.true_busy_seconds(2, (stamps[0] - period) / 1e6, stamps[-1] / 1e6)
    assert truth > 20
    assert measured == pytest.approx(truth, rel=0.01)
    window = fake.true_busy_seconds(2, T0, T0 + 60)
    assert measured == pytest.approx(window, rel=0.01)


def test_true_busy_seconds_integrates_patterns(tmp_path: Path) -> None:
    fake = FakeNvml("pcie-l40s", tmp_path / "s", now=T0)
    fake.set_utilization_pattern(1, [(1.0, 100, 0), (3.0, 0, 0)])  # 25 % duty cycle
    assert fake.true_busy_seconds(1, T0, T0 + 40) == pytest.approx(10.0)
    assert fake.true_busy_seconds(1, T0 + 0.5, T0 + 1.5) == pytest.approx(0.5)
    fake.advance(10)
    fake.set_utilization_pattern(1, [(2.0, 50, 0), (1.0, 20, 0)], repeat=False)  # holds 20 %
    assert fake.true_busy_seconds(1, T0 + 10, T0 + 20) == pytest.approx(1.0 + 0.2 + 7 * 0.2)
    assert fake.true_busy_seconds(1, T0, T0 + 20) == pytest.approx(3.0 + 2.6)
    assert fake.true_busy_seconds(1, T0 - 100, T0) == 0.0


# ---- power, energy, clocks, thermals ---------------------------------------------------------


def test_power_clocks_temperature_and_reasons_follow_utilization(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    model = load_profile("dgx-h100")["gpus"][0]
    assert nv.nvmlDeviceGetPowerUsage(h) == model["power_idle_w"] * 1000
    assert nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) == model["clocks_mhz"]["sm_idle"]
    assert nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU) == model["temperature"]["base_c"]
    idle = nv.nvmlClocksEventReasonGpuIdle
    assert nv.nvmlDeviceGetCurrentClocksEventReasons(h) == idle
    assert nv.nvmlDeviceGetCurrentClocksThrottleReasons(h) == idle

    fake.set_utilization(0, 100, 70)
    fake.advance(0.5)
    assert nv.nvmlDeviceGetPowerUsage(h) == model["power_max_draw_w"] * 1000
    assert nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM) == 1980
    assert nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_GRAPHICS) == 1980
    assert nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU) == round(33 + 0.42 * 100)
    assert nv.nvmlDeviceGetCurrentClocksEventReasons(h) == 0
    mask = nv.nvmlClocksEventReasonSwPowerCap | nv.nvmlClocksEventReasonHwSlowdown
    fake.set_throttle_reasons(0, mask)
    assert nv.nvmlDeviceGetCurrentClocksEventReasons(h) == mask
    assert nv.nvmlDeviceGetCurrentClocksThrottleReasons(h) == mask

    fake.set_power(0, 123.4)
    fake.set_temperature(0, 91)
    assert nv.nvmlDeviceGetPowerUsage(h) == 123_400
    assert nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU) == 91
    fake.set_power(0, None)
    fake.set_temperature(0, None)
    assert nv.nvmlDeviceGetPowerUsage(h) == 690_000
    assert nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU) == 75
    with pytest.raises(err(nv.NVML_ERROR_INVALID_ARGUMENT)):
        nv.nvmlDeviceGetTemperature(h, 7)


def test_energy_is_the_exact_and_monotonic_integral_of_power(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    h = nv.nvmlDeviceGetHandleByIndex(1)
    e0 = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    assert e0 == pytest.approx(70 * 3600 * 1000, abs=1)  # idle since boot, one hour ago
    fake.set_utilization(1, 50)
    fake.advance(10)
    e1 = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    assert e1 - e0 == pytest.approx(10 * (70 + (690 - 70) * 0.5) * 1000, abs=2)
    fake.set_power(1, 500)
    fake.advance(10)
    e2 = nv.nvmlDeviceGetTotalEnergyConsumption(h)
    assert e2 - e1 == pytest.approx(5_000_000, abs=2)
    fake.set_power(1, None)
    seen = [e2]
    for i in range(40):
        fake.set_utilization_pattern(1, [(0.05, (i * 37) % 101, 0), (0.1, 0, 0)])
        fake.advance(0.033)
        seen.append(nv.nvmlDeviceGetTotalEnergyConsumption(h))
    assert seen == sorted(seen)
    field = fields(h, [nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])[0]
    assert field.nvmlReturn == nv.NVML_SUCCESS
    assert field.valueType == nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert field.value.ullVal == seen[-1]


# ---- NVLink, PCIe and field values -----------------------------------------------------------


def test_field_values_on_h100(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    tx, rx = nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX
    ids: list[int | tuple[int, int]] = [
        nv.NVML_FI_DEV_NVLINK_LINK_COUNT,
        *[(tx, link) for link in range(18)],
        *[(rx, link) for link in range(18)],
        (nv.NVML_FI_DEV_NVLINK_GET_STATE, 3),
        (nv.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, 4),
        (nv.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, 0),
        (nv.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 1),
        *NVLINK_CRC_DATA_FIELDS,
        nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
        nv.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
        nv.NVML_FI_DEV_MEMORY_TEMP,
        nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        (tx, 18),  # no such link
        100_000,  # no such field
    ]
    pcie_counters = (53, 54)  # R555+ fields; dgx-h100 runs R550
    before = fields(h, ids)
    assert all(v.timestamp == round(T0 * 1e6) for v in before)
    assert [v.nvmlReturn for i, v in enumerate(before[:-2]) if i not in pcie_counters] == [
        nv.NVML_SUCCESS
    ] * (len(ids) - 4)
    assert [before[i].nvmlReturn for i in pcie_counters] == [nv.NVML_ERROR_NOT_SUPPORTED] * 2
    assert before[-2].nvmlReturn == nv.NVML_ERROR_INVALID_ARGUMENT
    assert before[-1].nvmlReturn == nv.NVML_ERROR_NOT_SUPPORTED
    assert before[0].valueType == nv.NVML_VALUE_TYPE_UNSIGNED_INT and before[0].value.uiVal == 18
    assert before[1].valueType == nv.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG
    assert before[37].value.uiVal == nv.NVML_NVLINK_STATE_ACTIVE

    fake.set_utilization(0, 100)
    fake.set_nvlink_up(0, 3, False)
    fake.add_nvlink_errors(0, 4, "replay", 2)
    fake.add_nvlink_errors(0, 0, "recovery", 1)
    fake.add_nvlink_errors(0, 1, "crc_flit", 3)
    fake.add_nvlink_errors(0, 2, "crc_data", 5)
    fake.add_nvlink_errors(0, 11, "crc_data", 7)
    fake.add_pcie_replays(0, 9)
    fake.advance(1.0)
    after = fields(h, ids)
    link_rate = 24414062  # KiB/s per link per direction at 100 %
    assert after[1].value.ullVal - before[1].value.ullVal == pytest.approx(link_rate, abs=1)
    assert after[19].value.ullVal - before[19].value.ullVal == pytest.approx(link_rate, abs=1)
    assert after[4].value.ullVal == before[4].value.ullVal  # link 3 is down: no traffic
    assert nv.nvmlDeviceGetNvLinkState(h, 3) == 0 and nv.nvmlDeviceGetNvLinkState(h, 2) == 1
    assert after[37].value.uiVal == nv.NVML_NVLINK_STATE_INACTIVE
    assert [after[i].value.ullVal for i in (38, 39, 40)] == [2, 1, 3]
    crc = [after[41 + i].value.ullVal for i in range(12)]
    assert crc == [0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 0, 7]
    assert after[55].value.ullVal == 9 == nv.nvmlDeviceGetPcieReplayCounter(h)
    assert after[56].value.uiVal > before[56].value.uiVal  # memory temperature rose

    fake.set_nvlink_up(0, 3, True)
    fake.advance(1.0)
    assert fields(h, [(tx, 3)])[0].value.ullVal == after[4].value.ullVal + link_rate
    with pytest.raises(err(nv.NVML_ERROR_INVALID_ARGUMENT)):
        nv.nvmlDeviceGetNvLinkState(h, 18)


def test_l40s_reports_not_supported_per_field(make_fake: Make) -> None:
    fake = make_fake("pcie-l40s")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    ids = [
        nv.NVML_FI_DEV_NVLINK_LINK_COUNT,
        (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0),
        (nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX, 0),
        (nv.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY, 0),
        (nv.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY, 0),
        (nv.NVML_FI_DEV_NVLINK_ERROR_DL_CRC, 0),
        (nv.NVML_FI_DEV_NVLINK_GET_STATE, 0),
        *NVLINK_CRC_DATA_FIELDS,
        nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES,
        nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES,
        nv.NVML_FI_DEV_MEMORY_TEMP,
        nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION,
        nv.NVML_FI_DEV_PCIE_REPLAY_COUNTER,
    ]
    values = fields(h, ids)
    assert [v.nvmlReturn for v in values[:-2]] == [nv.NVML_ERROR_NOT_SUPPORTED] * (len(ids) - 2)
    assert [v.nvmlReturn for v in values[-2:]] == [nv.NVML_SUCCESS] * 2
    with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
        nv.nvmlDeviceGetNvLinkState(h, 0)
    with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
        nv.nvmlDeviceGetRemappedRows(h)
    with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
        nv.nvmlDeviceGetMigMode(h)
    assert nv.nvmlDeviceGetMaxMigDeviceCount(h) == 0
    fake.add_ecc_errors(0, corrected=3)
    assert nv.nvmlDeviceGetTotalEccErrors(h, 0, nv.NVML_VOLATILE_ECC) == 3
    assert nv.nvmlDeviceGetCurrPcieLinkGeneration(h) == 4
    with pytest.raises(ValueError):
        fake.set_nvlink_up(0, 0, False)


def test_pcie_link_and_throughput(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    h = nv.nvmlDeviceGetHandleByIndex(5)
    assert nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES) == 0
    fake.set_utilization(5, 50)
    half = pytest.approx(53710937 / 2, abs=1)
    assert nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES) == half
    assert nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES) == half
    assert (nv.nvmlDeviceGetCurrPcieLinkGeneration(h), nv.nvmlDeviceGetCurrPcieLinkWidth(h)) == (
        5,
        16,
    )
    fake.set_pcie_link(5, generation=3)
    assert (nv.nvmlDeviceGetCurrPcieLinkGeneration(h), nv.nvmlDeviceGetCurrPcieLinkWidth(h)) == (
        3,
        16,
    )
    fake.set_pcie_link(5, width=8)
    assert (nv.nvmlDeviceGetCurrPcieLinkGeneration(h), nv.nvmlDeviceGetCurrPcieLinkWidth(h)) == (
        3,
        8,
    )
    assert (nv.nvmlDeviceGetMaxPcieLinkGeneration(h), nv.nvmlDeviceGetMaxPcieLinkWidth(h)) == (
        5,
        16,
    )
    with pytest.raises(ValueError):
        fake.set_pcie_link(5, generation=6)


# ---- memory, ECC, row remapping --------------------------------------------------------------


def test_memory_ecc_and_row_remapping(make_fake: Make) -> None:
    fake = make_fake("hgx-a100-mig")
    h = nv.nvmlDeviceGetHandleByIndex(1)
    total, reserved = 81920 * MIB, 655 * MIB
    fake.set_memory_used(1, 30 * 1024**3)
    v1 = nv.nvmlDeviceGetMemoryInfo(h)  # v1 used = reserved + allocated (nvml.h)
    used = reserved + 30 * 1024**3
    assert (v1.total, v1.used, v1.free) == (total, used, total - used)
    v2 = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    assert (v2.total, v2.reserved, v2.used) == (total, reserved, 30 * 1024**3)
    assert v2.free == total - reserved - 30 * 1024**3
    bad = nv.c_nvmlMemory_v2_t()
    bad.version = 1
    assert lib().nvmlDeviceGetMemoryInfo_v2(h, ctypes.byref(bad)) == 25  # version mismatch
    with pytest.raises(ValueError):
        fake.set_memory_used(1, total)

    fake.add_ecc_errors(1, corrected=5, uncorrected=1)
    fake.add_ecc_errors(1, corrected=2)
    ecc = nv.nvmlDeviceGetTotalEccErrors
    corr, unc = nv.NVML_MEMORY_ERROR_TYPE_CORRECTED, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
    assert ecc(h, corr, nv.NVML_VOLATILE_ECC) == 7 == ecc(h, corr, nv.NVML_AGGREGATE_ECC)
    assert ecc(h, unc, nv.NVML_VOLATILE_ECC) == 1 == ecc(h, unc, nv.NVML_AGGREGATE_ECC)
    assert nv.nvmlDeviceGetRemappedRows(h) == (0, 0, 0, 0)
    fake.set_remapped_rows(1, 2, 1, pending=True, failure=False)
    assert nv.nvmlDeviceGetRemappedRows(h) == (2, 1, 1, 0)


# ---- XID events ------------------------------------------------------------------------------


def test_xid_events_are_delivered_once_in_order(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    hs = handles(fake)
    fake.inject_xid(0, 13)  # before the set exists: never delivered
    es = nv.nvmlEventSetCreate()
    for h in hs[:7]:  # GPU 7 is not registered
        supported = nv.nvmlDeviceGetSupportedEventTypes(h)
        assert supported & nv.nvmlEventTypeXidCriticalError
        nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, es)
    with pytest.raises(err(nv.NVML_ERROR_TIMEOUT)):
        nv.nvmlEventSetWait_v2(es, 0)

    with fake.batch():
        fake.inject_xid(3, 79)
        fake.inject_xid(7, 48)  # unregistered GPU
        fake.inject_xid(1, 94)
        fake.inject_xid(3, 31, gpu_instance_id=1, compute_instance_id=0)
    got = []
    for _ in range(3):
        data = nv.nvmlEventSetWait_v2(es, 100)
        assert data.eventType == nv.nvmlEventTypeXidCriticalError
        got.append((addr(data.device), data.eventData, data.gpuInstanceId, data.computeInstanceId))
    assert got == [
        (addr(hs[3]), 79, NO_INSTANCE, NO_INSTANCE),
        (addr(hs[1]), 94, NO_INSTANCE, NO_INSTANCE),
        (addr(hs[3]), 31, 1, 0),
    ]
    start = time.monotonic()
    with pytest.raises(err(nv.NVML_ERROR_TIMEOUT)):
        nv.nvmlEventSetWait_v2(es, 30)
    assert 0.025 < time.monotonic() - start < 1.0

    other = nv.nvmlEventSetCreate()  # a second set only sees what comes after it
    nv.nvmlDeviceRegisterEvents(hs[3], nv.nvmlEventTypeXidCriticalError, other)
    fake.inject_xid(3, 63)
    assert nv.nvmlEventSetWait_v2(other, 100).eventData == 63
    assert nv.nvmlEventSetWait(es, 100).eventData == 63

    with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
        nv.nvmlDeviceRegisterEvents(hs[0], 1 << 40, es)
    nv.nvmlEventSetFree(other)
    with pytest.raises(err(nv.NVML_ERROR_INVALID_ARGUMENT)):
        nv.nvmlEventSetWait_v2(other, 0)
    nv.nvmlEventSetFree(es)


def test_blocking_wait_wakes_up_on_injection(make_fake: Make) -> None:
    fake = make_fake("pcie-l40s")
    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(
        nv.nvmlDeviceGetHandleByIndex(2), nv.nvmlEventTypeXidCriticalError, es
    )
    timer = threading.Timer(0.05, fake.inject_xid, args=(2, 119))
    start = time.monotonic()
    timer.start()
    data = nv.nvmlEventSetWait_v2(es, 5000)
    timer.join()
    assert data.eventData == 119
    assert time.monotonic() - start < 1.0
    nv.nvmlEventSetFree(es)


# ---- lost GPU --------------------------------------------------------------------------------


def test_lost_gpu_is_isolated(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    fake.lose_gpu(3)
    lost = nv.nvmlDeviceGetHandleByIndex(3)  # still succeeds
    ok = nv.nvmlDeviceGetHandleByIndex(2)
    for call in (
        nv.nvmlDeviceGetName,
        nv.nvmlDeviceGetUUID,
        nv.nvmlDeviceGetPowerUsage,
        nv.nvmlDeviceGetMemoryInfo,
        nv.nvmlDeviceGetUtilizationRates,
        nv.nvmlDeviceGetTotalEnergyConsumption,
        lambda h: nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION]),
        lambda h: nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, 0),
        nv.nvmlDeviceGetComputeRunningProcesses,
    ):
        with pytest.raises(err(nv.NVML_ERROR_GPU_IS_LOST)):
            call(lost)
        call(ok)
    assert nv.nvmlDeviceGetCount() == 8
    fake.restore_gpu(3)
    assert nv.nvmlDeviceGetName(lost) == "NVIDIA H100 80GB HBM3"


# ---- MIG -------------------------------------------------------------------------------------


def test_mig_enumeration(make_fake: Make) -> None:
    fake = make_fake("hgx-a100-mig")
    hs = handles(fake)
    assert nv.nvmlDeviceGetMigMode(hs[0]) == [0, 0]
    assert nv.nvmlDeviceGetMaxMigDeviceCount(hs[0]) == 0
    assert nv.nvmlDeviceIsMigDeviceHandle(hs[0]).value == 0
    with pytest.raises(err(nv.NVML_ERROR_INVALID_ARGUMENT)):
        nv.nvmlDeviceGetMigDeviceHandleByIndex(hs[0], 0)

    expected = {
        6: [("3g.40gb", 2, 40192), ("2g.20gb", 3, 19968), ("1g.10gb", 9, 9728),
            ("1g.10gb", 10, 9728)],
        7: [("4g.40gb", 1, 40192), ("3g.40gb", 2, 40192)],
    }  # fmt: skip
    for gpu, instances in expected.items():
        parent = hs[gpu]
        assert nv.nvmlDeviceGetMigMode(parent) == [1, 1]
        assert nv.nvmlDeviceGetMaxMigDeviceCount(parent) == 7
        for index, (profile, gi, mib) in enumerate(instances):
            mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, index)
            assert nv.nvmlDeviceIsMigDeviceHandle(mig).value == 1
            assert nv.nvmlDeviceGetName(mig) == f"NVIDIA A100-SXM4-80GB MIG {profile}"
            uuid = nv.nvmlDeviceGetUUID(mig)
            assert uuid.startswith("MIG-") and uuid == fake.mig_devices(gpu)[index]["uuid"]
            assert addr(nv.nvmlDeviceGetHandleByUUID(uuid)) == addr(mig)
            assert nv.nvmlDeviceGetGpuInstanceId(mig) == gi
            assert nv.nvmlDeviceGetComputeInstanceId(mig) == 0
            assert addr(nv.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(mig)) == addr(parent)
            assert nv.nvmlDeviceGetMemoryInfo(mig).total == mib * MIB
            assert nv.nvmlDeviceGetMemoryInfo(mig, version=nv.nvmlMemory_v2).total == mib * MIB
            with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
                nv.nvmlDeviceGetPowerUsage(mig)
        with pytest.raises(err(nv.NVML_ERROR_NOT_FOUND)):
            nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, len(instances))
        with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
            nv.nvmlDeviceGetUtilizationRates(parent)
        with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
            nv.nvmlDeviceGetSamples(parent, nv.NVML_GPU_UTILIZATION_SAMPLES, 0)
        with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
            nv.nvmlDeviceGetGpuInstanceId(parent)
        assert nv.nvmlDeviceGetPowerUsage(parent) > 0
    assert nv.nvmlDeviceGetUtilizationRates(hs[5]).gpu == 0
    assert nv.nvmlDeviceGetMigMode(nv.nvmlDeviceGetHandleByIndex(0)) == [0, 0]


# ---- processes -------------------------------------------------------------------------------


def test_processes_and_process_utilization(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    h = nv.nvmlDeviceGetHandleByIndex(1)
    assert nv.nvmlDeviceGetComputeRunningProcesses(h) == []
    with pytest.raises(err(nv.NVML_ERROR_NOT_FOUND)):
        nv.nvmlDeviceGetProcessUtilization(h, 0)
    fake.add_process(1, 4242, 10 * 1024**3, sm_util=70, mem_util=30)
    fake.add_process(1, 4343, 2 * 1024**3, sm_util=20, mem_util=5)
    for getter in (
        nv.nvmlDeviceGetComputeRunningProcesses,
        nv.nvmlDeviceGetComputeRunningProcesses_v2,
    ):
        procs = getter(h)
        assert [(p.pid, p.usedGpuMemory) for p in procs] == [
            (4242, 10 * 1024**3), (4343, 2 * 1024**3)
        ]  # fmt: skip
        assert {(p.gpuInstanceId, p.computeInstanceId) for p in procs} == {(NO_INSTANCE,) * 2}
    samples = nv.nvmlDeviceGetProcessUtilization(h, 0)
    assert [(s.pid, s.smUtil, s.memUtil) for s in samples] == [(4242, 70, 30), (4343, 20, 5)]
    with pytest.raises(err(nv.NVML_ERROR_NOT_FOUND)):
        nv.nvmlDeviceGetProcessUtilization(h, samples[0].timeStamp)
    fake.advance(0.5)
    assert len(nv.nvmlDeviceGetProcessUtilization(h, samples[0].timeStamp)) == 2
    fake.remove_process(1, 4242)
    assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(h)] == [4343]
    assert nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(0)) == []


def test_mig_processes(make_fake: Make) -> None:
    fake = make_fake("hgx-a100-mig")
    migs = fake.mig_devices(6)
    fake.add_process(6, 100, 5 * 1024**3, sm_util=50, mig_uuid=migs[0]["uuid"])
    fake.add_process(6, 200, 1 * 1024**3, sm_util=10, mig_uuid=migs[2]["uuid"])
    parent = nv.nvmlDeviceGetHandleByIndex(6)
    procs = nv.nvmlDeviceGetComputeRunningProcesses(parent)
    assert [(p.pid, p.gpuInstanceId, p.computeInstanceId) for p in procs] == [
        (100, 2, 0),
        (200, 9, 0),
    ]
    mig0 = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 0)
    assert [p.pid for p in nv.nvmlDeviceGetComputeRunningProcesses(mig0)] == [100]
    assert nv.nvmlDeviceGetMemoryInfo(mig0).used == 5 * 1024**3
    mig1 = nv.nvmlDeviceGetMigDeviceHandleByIndex(parent, 1)
    assert nv.nvmlDeviceGetComputeRunningProcesses(mig1) == []
    with pytest.raises(ValueError):
        fake.add_process(6, 300, 1, mig_uuid="MIG-nope")


# ---- state file handling ---------------------------------------------------------------------


def used_v2(handle: Any) -> int:
    """Allocated memory alone (v1's used also holds the reservation)."""
    return int(nv.nvmlDeviceGetMemoryInfo(handle, version=nv.nvmlMemory_v2).used)


def test_state_is_reread_after_every_change(make_fake: Make) -> None:
    fake = make_fake("pcie-l40s")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    for i in range(200):  # many writes within the same millisecond, same file size
        fake.set_memory_used(0, (1000 + i) * MIB)
        assert used_v2(h) == (1000 + i) * MIB


def test_broken_or_missing_state_keeps_the_last_good_one(make_fake: Make) -> None:
    fake = make_fake("pcie-l40s")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    fake.set_memory_used(0, 7 * MIB)
    assert used_v2(h) == 7 * MIB
    tmp = fake.state_path.with_suffix(".broken")
    tmp.write_text("fakenvml-state 1\ngpus 4\ng 9 name x\nend\n")
    os.replace(tmp, fake.state_path)
    assert used_v2(h) == 7 * MIB
    fake.state_path.unlink()
    assert used_v2(h) == 7 * MIB
    fake.set_memory_used(0, 8 * MIB)
    assert used_v2(h) == 8 * MIB


def test_batch_writes_once(tmp_path: Path) -> None:
    fake = FakeNvml("dgx-h100", tmp_path / "state", now=T0)
    before = fake.state_path.stat()
    with fake.batch():
        fake.set_utilization(0, 50)
        fake.inject_xid(1, 79)
        with fake.batch():
            fake.advance(3)
        assert fake.state_path.stat().st_ino == before.st_ino
    text = fake.state_path.read_text()
    assert fake.state_path.stat().st_ino != before.st_ino
    assert f"now {round((T0 + 3) * 1e6)}" in text and "ev 1 1 79" in text


def test_real_clock_mode(make_fake: Make) -> None:
    fake = make_fake("pcie-l40s", now=None)
    assert abs(fake.now - time.time()) < 1
    h = nv.nvmlDeviceGetHandleByIndex(0)
    _, samples = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, 0)
    assert abs(samples[-1].timeStamp / 1e6 - time.time()) < 1
    value = fields(h, [nv.NVML_FI_DEV_TOTAL_ENERGY_CONSUMPTION])[0]
    assert abs(value.timestamp / 1e6 - time.time()) < 1


def test_subprocess_uses_env(tmp_path: Path) -> None:
    fake = FakeNvml("mixed", tmp_path / "state", now=T0)
    fake.set_utilization(2, 40, 10)
    fake.advance(1)  # utilization is reported from samples taken after the change
    script = (
        "import json, pynvml as nv\n"
        "nv.nvmlInit()\n"
        "h = nv.nvmlDeviceGetHandleByIndex(2)\n"
        "u = nv.nvmlDeviceGetUtilizationRates(h)\n"
        "print(json.dumps([nv.nvmlDeviceGetCount(), nv.nvmlDeviceGetName(h), u.gpu, u.memory]))\n"
    )
    env = {**os.environ, **fake.env()}
    assert env["LD_LIBRARY_PATH"].split(":")[0] == str(LIB_DIR)
    out = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True
    ).stdout
    assert json.loads(out) == [4, "NVIDIA L40S", 40, 10]


def test_concurrent_callers(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    errors: list[nv.NVMLError] = []
    stop = threading.Event()

    def reader(gpu: int) -> None:
        try:
            h = nv.nvmlDeviceGetHandleByIndex(gpu)
            last = 0
            while not stop.is_set():
                nv.nvmlDeviceGetPowerUsage(h)
                nv.nvmlDeviceGetFieldValues(h, [(nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, 0)])
                try:
                    _, s = nv.nvmlDeviceGetSamples(h, nv.NVML_GPU_UTILIZATION_SAMPLES, last)
                    last = s[-1].timeStamp
                except nv.NVMLError_NotFound:
                    pass
        except nv.NVMLError as e:  # pragma: no cover - reported below
            errors.append(e)

    es = nv.nvmlEventSetCreate()
    nv.nvmlDeviceRegisterEvents(
        nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlEventTypeXidCriticalError, es
    )
    threads = [threading.Thread(target=reader, args=(g,)) for g in range(4)]
    for t in threads:
        t.start()
    for i in range(50):
        fake.set_utilization(i % 4, i * 2)
        fake.advance(0.1)
        if i % 10 == 0:
            fake.inject_xid(0, 43)
    got = [nv.nvmlEventSetWait_v2(es, 1000).eventData for _ in range(5)]
    stop.set()
    for t in threads:
        t.join()
    assert not errors
    assert got == [43] * 5
    nv.nvmlEventSetFree(es)


# ---- topology: PCIe common ancestor, NVLink remote ends, GPU fabric ---------------------------

INTERNAL, SINGLE, MULTIPLE = (
    nv.NVML_TOPOLOGY_INTERNAL,
    nv.NVML_TOPOLOGY_SINGLE,
    nv.NVML_TOPOLOGY_MULTIPLE,
)
PHB, NODE, SYS = nv.NVML_TOPOLOGY_HOSTBRIDGE, nv.NVML_TOPOLOGY_NODE, nv.NVML_TOPOLOGY_SYSTEM


def level_matrix(fake: FakeNvml) -> list[list[int]]:
    hs = handles(fake)
    return [[nv.nvmlDeviceGetTopologyCommonAncestor(a, b) for b in hs] for a in hs]


def indices(devices: list[Any]) -> list[int]:
    return [nv.nvmlDeviceGetIndex(d) for d in devices]


def pair_matrix(
    n: int, pair: int, socket: int, cross: int = SYS, per_socket: int = 2
) -> list[list[int]]:
    """GPUs 2k and 2k+1 at `pair`; the same socket (per_socket pairs) at `socket`; else `cross`."""

    def level(a: int, b: int) -> int:
        if a == b:
            return INTERNAL
        if a // 2 == b // 2:
            return pair
        return socket if a // (2 * per_socket) == b // (2 * per_socket) else cross

    return [[level(a, b) for b in range(n)] for a in range(n)]


def test_dgx_h100_topology_levels(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    # Each GPU has its own PCIe switch (shared with its NIC): no GPU pair shares a switch.
    expected = [
        [INTERNAL, PHB, NODE, NODE, SYS, SYS, SYS, SYS],
        [PHB, INTERNAL, NODE, NODE, SYS, SYS, SYS, SYS],
        [NODE, NODE, INTERNAL, PHB, SYS, SYS, SYS, SYS],
        [NODE, NODE, PHB, INTERNAL, SYS, SYS, SYS, SYS],
        [SYS, SYS, SYS, SYS, INTERNAL, PHB, NODE, NODE],
        [SYS, SYS, SYS, SYS, PHB, INTERNAL, NODE, NODE],
        [SYS, SYS, SYS, SYS, NODE, NODE, INTERNAL, PHB],
        [SYS, SYS, SYS, SYS, NODE, NODE, PHB, INTERNAL],
    ]
    assert level_matrix(fake) == expected == pair_matrix(8, PHB, NODE)
    hs = handles(fake)
    assert indices(nv.nvmlDeviceGetTopologyNearestGpus(hs[5], INTERNAL)) == []
    assert indices(nv.nvmlDeviceGetTopologyNearestGpus(hs[5], SINGLE)) == []
    assert indices(nv.nvmlDeviceGetTopologyNearestGpus(hs[5], PHB)) == [4]
    assert indices(nv.nvmlDeviceGetTopologyNearestGpus(hs[5], NODE)) == [4, 6, 7]
    assert indices(nv.nvmlDeviceGetTopologyNearestGpus(hs[5], SYS)) == [0, 1, 2, 3, 4, 6, 7]
    # CPU sets of the two sockets (56 cores, 2 threads each).
    for cpu, gpus in ((0, [0, 1, 2, 3]), (55, [0, 1, 2, 3]), (56, [4, 5, 6, 7]),
                      (112, [0, 1, 2, 3]), (223, [4, 5, 6, 7])):  # fmt: skip
        assert indices(nv.nvmlSystemGetTopologyGpuSet(cpu)) == gpus
    with pytest.raises(err(nv.NVML_ERROR_INVALID_ARGUMENT)):
        nv.nvmlSystemGetTopologyGpuSet(224)  # no such CPU
    assert fake.numa_cpus()[1][:2] == [56, 57] and len(fake.numa_cpus()[1]) == 112


def test_dgx_h100_topology_matches_the_sysfs_fixture(make_fake: Make) -> None:
    from tests.doubles.make_sysfs import dgx_h100_pairs

    fake = make_fake("dgx-h100")
    nics, gpus = dgx_h100_pairs()
    for i, (nic, gpu) in enumerate(zip(nics, gpus, strict=True)):
        topo = fake.topology(i)
        assert topo is not None
        assert fake.gpu_info(i)["pci_bus_id"].lower() == "0000" + gpu.address  # 00000000:18:00.0
        root_port, switch_up, _downstream = gpu.bridges
        assert (topo["root_port"], topo["switches"]) == (root_port, [switch_up])
        assert nic.pci.bridges[:2] == (root_port, switch_up)  # the NIC shares the switch
        assert topo["nics"] == [nic.pci.address]
        assert gpu.numa_node == nv.nvmlDeviceGetNumaNodeId(nv.nvmlDeviceGetHandleByIndex(i))


def test_topology_levels_of_the_other_profiles(make_fake: Make) -> None:
    # DGX A100-like: a GPU pair shares a top-level switch, each GPU behind its own second one.
    assert level_matrix(make_fake("hgx-a100-mig")) == pair_matrix(8, MULTIPLE, SYS)
    assert level_matrix(make_fake("hgx-nvlink-bridge")) == pair_matrix(4, SINGLE, SYS)
    assert level_matrix(make_fake("pcie-l40s")) == pair_matrix(4, NODE, SYS)
    assert level_matrix(make_fake("mixed")) == pair_matrix(4, NODE, SYS)
    assert level_matrix(make_fake("gb200-nvl")) == pair_matrix(4, NODE, SYS)
    assert indices(nv.nvmlSystemGetTopologyGpuSet(80)) == [2, 3]  # second Grace: CPUs 72-143
    make_fake("hgx-a100-mig")
    # NPS4: CPU 48 is on NUMA node 3 (GPUs 0, 1); node 0 has no GPU.
    assert indices(nv.nvmlSystemGetTopologyGpuSet(48)) == [0, 1]
    assert indices(nv.nvmlSystemGetTopologyGpuSet(0)) == []
    assert indices(
        nv.nvmlDeviceGetTopologyNearestGpus(nv.nvmlDeviceGetHandleByIndex(2), MULTIPLE)
    ) == [3]


def test_topology_errors_and_count_protocol(make_fake: Make) -> None:
    fake = make_fake("hgx-a100-mig")
    hs = handles(fake)
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(hs[6], 0)
    with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
        nv.nvmlDeviceGetTopologyCommonAncestor(mig, hs[0])
    with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
        nv.nvmlDeviceGetTopologyCommonAncestor(hs[0], mig)
    with pytest.raises(err(nv.NVML_ERROR_INVALID_ARGUMENT)):
        nv.nvmlDeviceGetTopologyNearestGpus(hs[0], 35)  # not a level
    level = ctypes.c_uint(99)
    assert lib().nvmlDeviceGetTopologyCommonAncestor(hs[0], None, ctypes.byref(level)) == (
        nv.NVML_ERROR_INVALID_ARGUMENT
    )
    assert lib().nvmlDeviceGetTopologyCommonAncestor(hs[0], hs[1], None) == (
        nv.NVML_ERROR_INVALID_ARGUMENT
    )
    # A non-zero count with a buffer: at most that many handles, count = number written.
    count = ctypes.c_uint(2)
    buf = (nv.c_nvmlDevice_t * 2)()
    assert lib().nvmlDeviceGetTopologyNearestGpus(hs[0], SYS, ctypes.byref(count), buf) == 0
    assert count.value == 2 and [addr(b) for b in buf] == [addr(hs[1]), addr(hs[2])]
    count = ctypes.c_uint(0)
    assert lib().nvmlSystemGetTopologyGpuSet(176, ctypes.byref(count), None) == 0
    assert count.value == 2  # CPU 176 = NUMA 3's second thread of core 48
    fake.lose_gpu(3)
    with pytest.raises(err(nv.NVML_ERROR_GPU_IS_LOST)):
        nv.nvmlDeviceGetTopologyCommonAncestor(hs[3], hs[0])
    with pytest.raises(err(nv.NVML_ERROR_GPU_IS_LOST)):
        nv.nvmlDeviceGetTopologyCommonAncestor(hs[0], hs[3])
    assert nv.nvmlDeviceGetTopologyCommonAncestor(hs[0], hs[1]) == MULTIPLE


def test_topology_absent_from_the_profile_is_not_supported(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, make_fake: Make
) -> None:
    from tests.doubles.fakenvml import control

    spec = json.loads((control.PROFILES_DIR / "pcie-l40s.json").read_text())
    del spec["numa_cpus"]
    del spec["gpus"][1]["topology"]
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "custom.json").write_text(json.dumps(spec))
    monkeypatch.setattr(control, "PROFILES_DIR", profiles)
    fake = make_fake("custom")
    hs = handles(fake)
    assert nv.nvmlDeviceGetTopologyCommonAncestor(hs[0], hs[2]) == SYS
    with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
        nv.nvmlDeviceGetTopologyCommonAncestor(hs[0], hs[1])
    with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
        nv.nvmlDeviceGetTopologyNearestGpus(hs[1], SYS)
    assert indices(nv.nvmlDeviceGetTopologyNearestGpus(hs[0], SYS)) == [2, 3]
    with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
        nv.nvmlSystemGetTopologyGpuSet(0)


def remote_bus_ids(h: Any, links: int) -> list[str]:
    return [nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId for link in range(links)]


def test_dgx_h100_nvlinks_go_to_four_nvswitches(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    switches = [f"00000000:0{k}:00.0" for k in (5, 6, 7, 8)]
    expected = [switches[0]] * 5 + [switches[1]] * 4 + [switches[2]] * 4 + [switches[3]] * 5
    for i, h in enumerate(handles(fake)):
        types = {nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link) for link in range(18)}
        assert types == {nv.NVML_NVLINK_DEVICE_TYPE_SWITCH}
        assert remote_bus_ids(h, 18) == expected
        assert [r["pci_bus_id"] for r in fake.nvlink_remote(i)] == expected
    h = nv.nvmlDeviceGetHandleByIndex(3)
    pci = nv.nvmlDeviceGetNvLinkRemotePciInfo(h, 17)
    assert (pci.domain, pci.bus, pci.device) == (0, 8, 0)
    assert pci.busIdLegacy == "0000:08:00.0"
    assert pci.pciDeviceId == 0x22A310DE
    caps = [nv.nvmlDeviceGetNvLinkCapability(h, 0, c) for c in range(nv.NVML_NVLINK_CAP_COUNT)]
    assert caps == [1, 0, 1, 0, 0, 1]  # P2P, P2P atomics, valid; no sysmem/SLI on x86
    with pytest.raises(err(nv.NVML_ERROR_INVALID_ARGUMENT)):
        nv.nvmlDeviceGetNvLinkCapability(h, 0, nv.NVML_NVLINK_CAP_COUNT)
    for call in (nv.nvmlDeviceGetNvLinkRemoteDeviceType, nv.nvmlDeviceGetNvLinkRemotePciInfo):
        with pytest.raises(err(nv.NVML_ERROR_INVALID_ARGUMENT)):
            call(h, 18)
    fake.set_nvlink_up(3, 17, False)  # the far end of a down link is still known
    assert nv.nvmlDeviceGetNvLinkRemotePciInfo(h, 17).busId == switches[3]
    fake.lose_gpu(3)
    with pytest.raises(err(nv.NVML_ERROR_GPU_IS_LOST)):
        nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0)


def test_hgx_a100_nvlinks_two_per_nvswitch(make_fake: Make) -> None:
    fake = make_fake("hgx-a100-mig")
    hs = handles(fake)
    expected = [f"00000000:C{1 + link // 2}:00.0" for link in range(12)]
    assert all(remote_bus_ids(h, 12) == expected for h in hs)
    assert nv.nvmlDeviceGetNvLinkRemotePciInfo(hs[0], 0).pciDeviceId == 0x1AF110DE
    mig = nv.nvmlDeviceGetMigDeviceHandleByIndex(hs[7], 0)
    with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
        nv.nvmlDeviceGetNvLinkRemoteDeviceType(mig, 0)


def test_hgx_nvlink_bridge_pairs_are_linked_gpu_to_gpu(make_fake: Make) -> None:
    fake = make_fake("hgx-nvlink-bridge")
    hs = handles(fake)
    for i, h in enumerate(hs):
        partner = i ^ 1
        assert nv.nvmlDeviceGetName(h) == "NVIDIA H100 NVL"
        assert nv.nvmlDeviceGetMemoryInfo(h).total == 95830 * MIB
        assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == 400_000
        assert nv.nvmlDeviceGetCudaComputeCapability(h) == (9, 0)
        assert nv.nvmlDeviceGetArchitecture(h) == nv.NVML_DEVICE_ARCH_HOPPER
        assert fields(h, [nv.NVML_FI_DEV_NVLINK_LINK_COUNT])[0].value.uiVal == 12
        types = {nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link) for link in range(12)}
        assert types == {nv.NVML_NVLINK_DEVICE_TYPE_GPU}
        bus_ids = set(remote_bus_ids(h, 12))
        assert bus_ids == {nv.nvmlDeviceGetPciInfo(hs[partner]).busId}
        assert addr(nv.nvmlDeviceGetHandleByPciBusId(bus_ids.pop())) == addr(hs[partner])
        remote = nv.nvmlDeviceGetNvLinkRemotePciInfo(h, 0)
        assert remote.pciDeviceId == nv.nvmlDeviceGetPciInfo(hs[partner]).pciDeviceId == 0x232110DE
    with pytest.raises(err(nv.NVML_ERROR_INVALID_ARGUMENT)):
        nv.nvmlDeviceGetNvLinkRemoteDeviceType(hs[0], 12)
    for h in hs:
        with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
            nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(nv.c_nvmlGpuFabricInfoV_t()))


def test_mixed_h100s_are_linked_directly(make_fake: Make) -> None:
    fake = make_fake("mixed")
    hs = handles(fake)
    for i in (0, 1):
        partner_bus = nv.nvmlDeviceGetPciInfo(hs[1 - i]).busId
        assert set(remote_bus_ids(hs[i], 18)) == {partner_bus}
        assert nv.nvmlDeviceGetNvLinkRemoteDeviceType(hs[i], 17) == nv.NVML_NVLINK_DEVICE_TYPE_GPU
    for h in hs[2:]:
        with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
            nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0)


def test_pcie_l40s_has_no_nvlink_remote_or_fabric(make_fake: Make) -> None:
    fake = make_fake("pcie-l40s")
    for h in handles(fake):
        for call in (
            lambda h: nv.nvmlDeviceGetNvLinkRemotePciInfo(h, 0),
            lambda h: nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, 0),
            lambda h: nv.nvmlDeviceGetNvLinkCapability(h, 0, nv.NVML_NVLINK_CAP_P2P_SUPPORTED),
            lambda h: nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(nv.c_nvmlGpuFabricInfo_t())),
            lambda h: nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(nv.c_nvmlGpuFabricInfoV_t())),
        ):
            with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
                call(h)
    assert fake.nvlink_remote(0) == []


def test_dgx_h100_has_no_gpu_fabric(make_fake: Make) -> None:
    fake = make_fake("dgx-h100")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
        nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(nv.c_nvmlGpuFabricInfo_t()))
    with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
        nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(nv.c_nvmlGpuFabricInfoV_t()))
    with pytest.raises(ValueError, match="no GPU fabric"):
        fake.set_fabric(0, state="completed")


def health(mask: int, shift: int, width: int) -> int:
    return (mask >> shift) & width


def test_gb200_fabric_info(make_fake: Make) -> None:
    fake = make_fake("gb200-nvl", driver="580.65.06")  # fabric info v3 is R580+
    hs = handles(fake)
    uuid = bytes.fromhex("5f8c2a1e7b3d4c6f9e0a1d2b3c4d5e6f")
    for h in hs:
        assert nv.nvmlDeviceGetName(h) == "NVIDIA GB200"
        assert nv.nvmlDeviceGetArchitecture(h) == nv.NVML_DEVICE_ARCH_BLACKWELL
        assert nv.nvmlDeviceGetCudaComputeCapability(h) == (10, 0)
        assert nv.nvmlDeviceGetEnforcedPowerLimit(h) == 1_200_000
        v1 = nv.c_nvmlGpuFabricInfo_t()
        nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(v1))
        assert bytes(v1.clusterUuid) == uuid
        assert (v1.status, v1.cliqueId, v1.state) == (
            nv.NVML_SUCCESS,
            7,
            nv.NVML_GPU_FABRIC_STATE_COMPLETED,
        )
        v2 = nv.c_nvmlGpuFabricInfoV_t()
        nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(v2))
        assert bytes(v2.clusterUuid) == uuid
        assert (v2.status, v2.cliqueId, v2.state) == (v1.status, v1.cliqueId, v1.state)
        m = v2.healthMask
        assert health(m, nv.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW,
                      nv.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW) == (
            nv.NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_FALSE
        )  # fmt: skip
        assert health(m, nv.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_ROUTE_UNHEALTHY,
                      nv.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_ROUTE_UNHEALTHY) == (
            nv.NVML_GPU_FABRIC_HEALTH_MASK_ROUTE_UNHEALTHY_FALSE
        )  # fmt: skip
        assert health(m, nv.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_GFM_STATE,
                      nv.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_GFM_STATE) == (
            nv.NVML_GPU_FABRIC_HEALTH_MASK_GFM_STATE_CONNECTED
        )  # fmt: skip
        v3 = nv.c_nvmlGpuFabricInfo_v3_t()
        nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(v3))
        assert (v3.healthMask, v3.healthSummary) == (m, nv.NVML_GPU_FABRIC_HEALTH_SUMMARY_HEALTHY)
        # 18 NVLink5 links, one to each NVSwitch chip of the rack's switch trays, which are not
        # PCI devices of this node.
        assert fields(h, [nv.NVML_FI_DEV_NVLINK_LINK_COUNT])[0].value.uiVal == 18
        types = {nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link) for link in range(18)}
        assert types == {nv.NVML_NVLINK_DEVICE_TYPE_SWITCH}
        with pytest.raises(err(nv.NVML_ERROR_NOT_SUPPORTED)):
            nv.nvmlDeviceGetNvLinkRemotePciInfo(h, 0)
    assert len({r["name"] for r in fake.nvlink_remote(0)}) == 18
    bad = nv.c_nvmlGpuFabricInfoV_t()
    bad.version = nv.nvmlGpuFabricInfo_v2 + 1
    with pytest.raises(err(nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)):
        nv.nvmlDeviceGetGpuFabricInfoV(hs[0], ctypes.byref(bad))
    fake.set_fabric(2, state="in_progress", status=nv.NVML_ERROR_NOT_READY,
                    health_summary="unhealthy")  # fmt: skip
    v3 = nv.c_nvmlGpuFabricInfo_v3_t()
    nv.nvmlDeviceGetGpuFabricInfoV(hs[2], ctypes.byref(v3))
    assert (v3.state, v3.status, v3.healthSummary) == (
        nv.NVML_GPU_FABRIC_STATE_IN_PROGRESS,
        nv.NVML_ERROR_NOT_READY,
        nv.NVML_GPU_FABRIC_HEALTH_SUMMARY_UNHEALTHY,
    )
    nv.nvmlDeviceGetGpuFabricInfoV(hs[1], ctypes.byref(v3))
    assert v3.state == nv.NVML_GPU_FABRIC_STATE_COMPLETED


def test_fabric_info_v3_needs_r580(make_fake: Make) -> None:
    """healthSummary (v3) is first in the R580 header: gb200-nvl's R570 refuses it, so a
    caller must fall back to v2, as on such a driver."""
    make_fake("gb200-nvl")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(err(nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)):
        nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(nv.c_nvmlGpuFabricInfo_v3_t()))
    v2 = nv.c_nvmlGpuFabricInfoV_t()
    nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(v2))
    assert v2.state == nv.NVML_GPU_FABRIC_STATE_COMPLETED


def test_v2_fabric_caller_gets_no_bytes_past_its_struct(make_fake: Make) -> None:
    make_fake("gb200-nvl")
    buf = (ctypes.c_ubyte * 40)(*([0xAB] * 40))
    ctypes.c_uint.from_buffer(buf).value = nv.nvmlGpuFabricInfo_v2
    assert lib().nvmlDeviceGetGpuFabricInfoV(nv.nvmlDeviceGetHandleByIndex(0), buf) == 0
    assert bytes(buf[36:]) == b"\xab" * 4


def test_nvlink_remote_must_cover_every_link(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.doubles.fakenvml import control

    spec = json.loads((control.PROFILES_DIR / "hgx-nvlink-bridge.json").read_text())
    spec["gpus"][0]["nvlink_remote"] = [{"links": 11, "gpu": 1}]
    profiles = tmp_path / "profiles"
    profiles.mkdir()
    (profiles / "bad.json").write_text(json.dumps(spec))
    monkeypatch.setattr(control, "PROFILES_DIR", profiles)
    with pytest.raises(ValueError, match="covers 11 links"):
        FakeNvml("bad", tmp_path / "state")


# ---- API and field levels: each profile's driver branch --------------------------------------

BRANCHES = {"hgx-a100-r470": 470, "hgx-a100-mig": 535, "dgx-h100": 550, "mixed": 560,
            "gb200-nvl": 570}  # fmt: skip

# Entry points newer than the oldest branch modelled, with the first branch that has each.
LEVELED_CALLS: list[tuple[str, int, Callable[[Any], Any]]] = [
    ("nvmlDeviceGetComputeRunningProcesses_v3", 510, nv.nvmlDeviceGetComputeRunningProcesses_v3),
    ("nvmlDeviceGetMemoryInfo_v2", 510, lambda h: nv.nvmlDeviceGetMemoryInfo(h, nv.nvmlMemory_v2)),
    ("nvmlDeviceGetGpuMaxPcieLinkGeneration", 525, nv.nvmlDeviceGetGpuMaxPcieLinkGeneration),
    ("nvmlDeviceGetGpuFabricInfo", 525,
     lambda h: nv.nvmlDeviceGetGpuFabricInfo(h, ctypes.byref(nv.c_nvmlGpuFabricInfo_t()))),
    ("nvmlDeviceGetCurrentClocksEventReasons", 535, nv.nvmlDeviceGetCurrentClocksEventReasons),
    ("nvmlDeviceGetGpuFabricInfoV", 550,
     lambda h: nv.nvmlDeviceGetGpuFabricInfoV(h, ctypes.byref(nv.c_nvmlGpuFabricInfoV_t()))),
    ("nvmlDeviceGetNumaNodeId", 550, nv.nvmlDeviceGetNumaNodeId),
    ("nvmlGpmQueryDeviceSupport", 520, nv.nvmlGpmQueryDeviceSupport),
]  # fmt: skip


def present(call: Callable[[], Any]) -> bool:
    """False when the call raises FUNCTION_NOT_FOUND; any other answer means the driver has it."""
    try:
        call()
    except nv.NVMLError_FunctionNotFound:
        return False
    except nv.NVMLError:
        return True  # NOT_SUPPORTED (no fabric, say): the entry point exists
    return True


def test_every_profile_has_a_known_branch() -> None:
    # dgx-h100-realistic is dgx-h100 (550) in realistic-timing mode (test_fakenvml_timing.py)
    # dgx-h100-mig is dgx-h100 with MIG GPUs (test_fakenvml_gpm.py)
    others = {"hgx-nvlink-bridge", "pcie-l40s", "dgx-h100-realistic", "dgx-h100-mig"}
    assert set(BRANCHES) | others == set(list_profiles())
    for profile, branch in BRANCHES.items():
        assert int(load_profile(profile)["driver_version"].split(".")[0]) == branch


@pytest.mark.parametrize("profile", list(BRANCHES))
def test_entry_points_exist_from_their_branch_on(make_fake: Make, profile: str) -> None:
    fake = make_fake(profile)
    branch = BRANCHES[profile]
    h = nv.nvmlDeviceGetHandleByIndex(0)
    got = {name: present(lambda call=call: call(h)) for name, _, call in LEVELED_CALLS}
    assert got == {name: branch >= first for name, first, _ in LEVELED_CALLS}
    # FUNCTION_NOT_FOUND comes before any argument is looked at, as a missing symbol does.
    code = lib().nvmlDeviceGetNumaNodeId(None, None)
    assert code == (nv.NVML_ERROR_INVALID_ARGUMENT if branch >= 550 else 13)
    # The older names always answer.
    assert nv.nvmlDeviceGetCurrentClocksThrottleReasons(h) & nv.nvmlClocksThrottleReasonGpuIdle
    assert nv.nvmlDeviceGetComputeRunningProcesses_v2(h) == []
    total = load_profile(profile)["gpus"][0]["memory_total_mib"] * MIB
    assert nv.nvmlDeviceGetMemoryInfo(h).total == total == fake.gpu_info(0)["mem_total"]


def test_r470_processes_only_through_v2(make_fake: Make) -> None:
    fake = make_fake("hgx-a100-r470")
    h = nv.nvmlDeviceGetHandleByIndex(3)
    fake.add_process(3, 4242, 2 * 1024**3)
    with pytest.raises(err(nv.NVML_ERROR_FUNCTION_NOT_FOUND)):
        nv.nvmlDeviceGetComputeRunningProcesses_v3(h)
    # The unversioned wrapper calls _v3 and turns FUNCTION_NOT_FOUND into a mismatch error,
    # as it does on a real R470 driver.
    with pytest.raises(nv.NVMLLibraryMismatchError):
        nv.nvmlDeviceGetComputeRunningProcesses(h)
    [proc] = nv.nvmlDeviceGetComputeRunningProcesses_v2(h)
    assert (proc.pid, proc.usedGpuMemory) == (4242, 2 * 1024**3)
    assert (proc.gpuInstanceId, proc.computeInstanceId) == (NO_INSTANCE, NO_INSTANCE)


def test_r535_unversioned_process_wrapper_works(make_fake: Make) -> None:
    fake = make_fake("hgx-a100-mig")
    fake.add_process(0, 4242, MIB)
    [proc] = nv.nvmlDeviceGetComputeRunningProcesses(nv.nvmlDeviceGetHandleByIndex(0))
    assert proc.pid == 4242


def test_r470_profile_is_an_hgx_a100_without_mig(make_fake: Make) -> None:
    fake = make_fake("hgx-a100-r470")
    assert nv.nvmlSystemGetDriverVersion() == "470.223.02"
    assert nv.nvmlSystemGetNVMLVersion() == "11.470.223.02"
    assert nv.nvmlSystemGetCudaDriverVersion() == 11040
    for h in handles(fake):
        assert nv.nvmlDeviceGetName(h) == "NVIDIA A100-SXM4-80GB"
        assert nv.nvmlDeviceGetMigMode(h) == [nv.NVML_DEVICE_MIG_DISABLE] * 2
        assert fields(h, [nv.NVML_FI_DEV_NVLINK_LINK_COUNT])[0].value.uiVal == 12
    assert fake.topology(0) == load_profile("hgx-a100-mig")["gpus"][0]["topology"]


def test_memory_v1_used_is_reserved_plus_allocated(make_fake: Make) -> None:
    fake = make_fake("hgx-a100-r470")
    h = nv.nvmlDeviceGetHandleByIndex(2)
    total, reserved, allocated = 81920 * MIB, 655 * MIB, 12 * 1024**3
    fake.set_memory_used(2, allocated)
    v1 = nv.nvmlDeviceGetMemoryInfo(h)
    used = reserved + allocated
    assert (v1.total, v1.used, v1.free) == (total, used, total - used)
    with pytest.raises(err(nv.NVML_ERROR_FUNCTION_NOT_FOUND)):  # R510+: no reserved before
        nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    fake = make_fake("hgx-a100-mig")  # the same GPU on R535 reports the two apart
    fake.set_memory_used(2, allocated)
    h = nv.nvmlDeviceGetHandleByIndex(2)
    v2 = nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2)
    assert (v2.reserved, v2.used, v2.free) == (reserved, allocated, total - reserved - allocated)
    assert nv.nvmlDeviceGetMemoryInfo(h).used == v2.reserved + v2.used


NVLINK_DL_FIELDS = [
    nv.NVML_FI_DEV_NVLINK_ERROR_DL_REPLAY,
    nv.NVML_FI_DEV_NVLINK_ERROR_DL_RECOVERY,
    nv.NVML_FI_DEV_NVLINK_ERROR_DL_CRC,
    nv.NVML_FI_DEV_NVLINK_GET_STATE,
    nv.NVML_FI_DEV_NVLINK_GET_VERSION,
]
RECOVERY_FIELDS = [
    nv.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_SUCCESSFUL_EVENTS,  # 213
    nv.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_FAILED_EVENTS,  # 214
    nv.NVML_FI_DEV_NVLINK_COUNT_LINK_RECOVERY_EVENTS,  # 215
]
PCIE_BYTES = [nv.NVML_FI_DEV_PCIE_COUNT_TX_BYTES, nv.NVML_FI_DEV_PCIE_COUNT_RX_BYTES]


def returns(handle: Any, ids: list[int | tuple[int, int]]) -> list[int]:
    return [v.nvmlReturn for v in fields(handle, ids)]


def test_nvlink_fields_161_to_166_are_r520_and_later(make_fake: Make) -> None:
    ids: list[int | tuple[int, int]] = [(f, 0) for f in NVLINK_DL_FIELDS]
    make_fake("hgx-a100-r470")  # an A100 with 12 NVLinks, but a driver that predates the ids
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert returns(h, ids) == [nv.NVML_ERROR_NOT_SUPPORTED] * 5
    legacy = [nv.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_L0, nv.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX]
    assert returns(h, [legacy[0], (legacy[1], 0)]) == [nv.NVML_SUCCESS] * 2  # R470 has these
    assert nv.nvmlDeviceGetNvLinkState(h, 0) == nv.NVML_FEATURE_ENABLED
    make_fake("hgx-a100-mig")
    assert returns(nv.nvmlDeviceGetHandleByIndex(0), ids) == [nv.NVML_SUCCESS] * 5


def test_pcie_byte_counters_are_r555_and_later(make_fake: Make) -> None:
    make_fake("dgx-h100")  # R550: H100 counts PCIe bytes, but its driver has no field for it
    not_supported = [nv.NVML_ERROR_NOT_SUPPORTED] * 2
    assert returns(nv.nvmlDeviceGetHandleByIndex(0), PCIE_BYTES) == not_supported
    fake = make_fake("mixed")  # R560
    h = nv.nvmlDeviceGetHandleByIndex(0)
    before = fields(h, PCIE_BYTES)
    assert [v.nvmlReturn for v in before] == [nv.NVML_SUCCESS] * 2
    fake.set_utilization(0, 100)
    fake.advance(1.0)
    after = fields(h, PCIE_BYTES)
    pcie = 53710937 * 1024  # max KiB/s at 100 % for one second, in bytes
    for b, a in zip(before, after, strict=True):
        assert a.value.ullVal - b.value.ullVal == pytest.approx(pcie, abs=1024)
    # A GPU without byte counters (the L40S) on the same driver
    assert returns(nv.nvmlDeviceGetHandleByIndex(2), PCIE_BYTES) == not_supported


def test_blackwell_nvlink_errors_are_the_link_recovery_counters(make_fake: Make) -> None:
    fake = make_fake("gb200-nvl")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    dl = [(f, 2) for f in NVLINK_DL_FIELDS[:3]]
    recovery: list[int | tuple[int, int]] = [(f, 2) for f in RECOVERY_FIELDS]
    assert returns(h, dl) == [nv.NVML_ERROR_NOT_SUPPORTED] * 3  # "unsupported for Blackwell+"
    assert [v.value.ullVal for v in fields(h, recovery)] == [0, 0, 0]
    fake.add_nvlink_errors(0, 2, "recovery", 3)  # recovered: the link stayed up
    fake.add_nvlink_errors(0, 2, "replay", 5)  # no NVLink5 counter serves replays
    fake.advance(1.0)
    fake.set_nvlink_up(0, 2, False)  # a recovery that failed: the link is declared down
    fake.advance(1.0)
    values = fields(h, recovery)
    assert [v.nvmlReturn for v in values] == [nv.NVML_SUCCESS] * 3
    assert [v.value.ullVal for v in values] == [3, 1, 4]
    assert returns(h, [(RECOVERY_FIELDS[0], 18)]) == [nv.NVML_ERROR_INVALID_ARGUMENT]
    assert returns(h, [(nv.NVML_FI_DEV_NVLINK_GET_STATE, 2)]) == [nv.NVML_SUCCESS]
    # Hopper (NVLink4), even on a driver that knows the ids, has none of them.
    make_fake("mixed")
    h = nv.nvmlDeviceGetHandleByIndex(0)
    assert returns(h, [(f, 0) for f in RECOVERY_FIELDS]) == [nv.NVML_ERROR_NOT_SUPPORTED] * 3
    assert returns(h, [(f, 0) for f in NVLINK_DL_FIELDS[:3]]) == [nv.NVML_SUCCESS] * 3
