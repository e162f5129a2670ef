"""The fake NVML's GPM (GPU Performance Monitoring) ABI, through the real pynvml bindings.

GPM is what gives profiling-grade activity (SM active, occupancy, tensor, DRAM) without
DCGM; these tests pin what a caller of nvmlGpmMetricsGet sees: Hopper and later only, exact
values over the window between two samples, MIG GPU instances, and the error paths a real
driver takes (wrong versions, freed or foreign samples, an old driver without GPM).
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator
from pathlib import Path

import pynvml as nv
import pytest

from tests.doubles.fakenvml.control import FakeNvml

T0 = 1_700_000_000.0
METRICS = {
    "graphics": nv.NVML_GPM_METRIC_GRAPHICS_UTIL,
    "sm_active": nv.NVML_GPM_METRIC_SM_UTIL,
    "sm_occupancy": nv.NVML_GPM_METRIC_SM_OCCUPANCY,
    "tensor": nv.NVML_GPM_METRIC_ANY_TENSOR_UTIL,
    "dram": nv.NVML_GPM_METRIC_DRAM_BW_UTIL,
    "fp64": nv.NVML_GPM_METRIC_FP64_UTIL,
    "fp32": nv.NVML_GPM_METRIC_FP32_UTIL,
    "fp16": nv.NVML_GPM_METRIC_FP16_UTIL,
    "integer": nv.NVML_GPM_METRIC_INTEGER_UTIL,
}


@pytest.fixture
def make_fake(tmp_path: Path) -> Iterator[object]:
    made: list[FakeNvml] = []

    def make(profile: str = "dgx-h100") -> FakeNvml:
        f = FakeNvml(profile, tmp_path / "state", now=T0)
        f.activate()
        nv.nvmlInit()
        made.append(f)
        return f

    yield make
    for _ in made:
        nv.nvmlShutdown()


def _metrics(s1: object, s2: object, ids: list[int]) -> list[tuple[int, float]]:
    get = nv.c_nvmlGpmMetricsGet_t()
    get.version = nv.NVML_GPM_METRICS_GET_VERSION
    get.numMetrics = len(ids)
    get.sample1, get.sample2 = s1, s2
    for i, metric in enumerate(ids):
        get.metrics[i].metricId = metric
    nv.nvmlGpmMetricsGet(get)
    return [(get.metrics[i].nvmlReturn, get.metrics[i].value) for i in range(len(ids))]


def _code(excinfo: pytest.ExceptionInfo[nv.NVMLError]) -> int:
    return int(excinfo.value.value)


def test_hopper_supports_gpm_and_older_architectures_do_not(make_fake) -> None:
    make_fake("mixed")
    archs = {}
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        archs[i] = (
            nv.nvmlDeviceGetArchitecture(h),
            nv.nvmlGpmQueryDeviceSupport(h).isSupportedDevice,
        )
    assert {a for a, s in archs.values() if s} <= {9, 10}
    assert {a for a, s in archs.values() if not s}, "the mixed profile has a pre-Hopper GPU"
    assert all(s == (a >= 9) for a, s in archs.values())
    old = next(i for i, (a, _) in archs.items() if a < 9)
    sample = nv.nvmlGpmSampleAlloc()
    with pytest.raises(nv.NVMLError) as e:
        nv.nvmlGpmSampleGet(nv.nvmlDeviceGetHandleByIndex(old), sample)
    assert _code(e) == nv.NVML_ERROR_NOT_SUPPORTED
    nv.nvmlGpmSampleFree(sample)


def test_metrics_are_exact_integrals_of_the_scripted_activity(make_fake) -> None:
    fake = make_fake()
    fake.set_utilization_pattern(0, [(0.25, 100, 50), (0.75, 20, 10)])  # 40 % average
    fake.set_gpm_activity(0, sm_active=0.5, sm_occupancy=0.25, tensor=0.75, dram=0.3,
                          fp64=0.0, fp32=0.2, fp16=0.1, integer=0.05)  # fmt: skip
    h = nv.nvmlDeviceGetHandleByIndex(0)
    s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    start = fake.now
    nv.nvmlGpmSampleGet(h, s1)
    fake.advance(2.6)  # not a whole number of cycles
    fake.set_gpm_activity(0, sm_active=0.9)  # changes mid-window count from their start
    fake.advance(1.1)
    nv.nvmlGpmSampleGet(h, s2)
    values = _metrics(s1, s2, list(METRICS.values()))
    window = round(fake.now - start, 6)  # the fake's clock counts microseconds
    for (key, _), (rc, value) in zip(METRICS.items(), values, strict=True):
        assert rc == nv.NVML_SUCCESS
        expected = fake.true_gpm_seconds(0, key, start, fake.now) / window * 100.0
        assert value == pytest.approx(expected, rel=1e-9), key
    by_key = dict(zip(METRICS, (v for _, v in values), strict=True))
    busy = fake.true_busy_seconds(0, start, fake.now) / window * 100.0
    assert by_key["graphics"] == pytest.approx(busy, rel=1e-9)
    assert 0.5 * busy < by_key["sm_active"] < 0.9 * busy
    nv.nvmlGpmSampleFree(s1)
    nv.nvmlGpmSampleFree(s2)


def test_mig_instances_have_their_own_samples_and_the_gpu_is_their_slice_weighted_sum(
    make_fake,
) -> None:
    fake = make_fake("dgx-h100-mig")
    fake.set_utilization(6, 100)
    instances = sorted({m["gpu_instance_id"] for m in fake.mig_devices(6)})
    for n, gi in enumerate(instances):
        fake.set_gpm_activity(6, sm_active=0.1 * (n + 1), mig_instance=gi)
    h = nv.nvmlDeviceGetHandleByIndex(6)
    first = {gi: nv.nvmlGpmSampleAlloc() for gi in instances}
    second = {gi: nv.nvmlGpmSampleAlloc() for gi in instances}
    g1, g2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    start = fake.now
    nv.nvmlGpmSampleGet(h, g1)
    for gi in instances:
        nv.nvmlGpmMigSampleGet(h, gi, first[gi])
    fake.advance(1.0)
    nv.nvmlGpmSampleGet(h, g2)
    for gi in instances:
        nv.nvmlGpmMigSampleGet(h, gi, second[gi])
    for n, gi in enumerate(instances):
        [(rc, value)] = _metrics(first[gi], second[gi], [nv.NVML_GPM_METRIC_SM_UTIL])
        assert rc == nv.NVML_SUCCESS
        assert value == pytest.approx(10.0 * (n + 1), rel=1e-9)
    [(rc, whole)] = _metrics(g1, g2, [nv.NVML_GPM_METRIC_SM_UTIL])
    assert whole == pytest.approx(
        fake.true_gpm_seconds(6, "sm_active", start, fake.now) * 100.0, rel=1e-9
    )
    with pytest.raises(nv.NVMLError) as e:  # a GPU instance that does not exist
        nv.nvmlGpmMigSampleGet(h, 99, g1)
    assert _code(e) == nv.NVML_ERROR_NOT_FOUND
    with pytest.raises(nv.NVMLError) as e:  # a GPU not in MIG mode has no GPU instances
        nv.nvmlGpmMigSampleGet(nv.nvmlDeviceGetHandleByIndex(0), instances[0], g1)
    assert _code(e) == nv.NVML_ERROR_NOT_SUPPORTED
    with pytest.raises(nv.NVMLError) as e:  # samples of two scopes do not make a window
        _metrics(first[instances[0]], g2, [nv.NVML_GPM_METRIC_SM_UTIL])
    assert _code(e) == nv.NVML_ERROR_INVALID_ARGUMENT


def test_error_paths_are_as_strict_as_a_driver(make_fake) -> None:
    fake = make_fake()
    h0, h1 = nv.nvmlDeviceGetHandleByIndex(0), nv.nvmlDeviceGetHandleByIndex(1)
    s1, s2, other = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    sm = [nv.NVML_GPM_METRIC_SM_UTIL]
    with pytest.raises(nv.NVMLError) as e:  # never filled
        _metrics(s1, s2, sm)
    assert _code(e) == nv.NVML_ERROR_INVALID_ARGUMENT
    nv.nvmlGpmSampleGet(h0, s1)
    nv.nvmlGpmSampleGet(h0, s2)
    with pytest.raises(nv.NVMLError) as e:  # no time between the samples
        _metrics(s1, s2, sm)
    assert _code(e) == nv.NVML_ERROR_INVALID_ARGUMENT
    fake.advance(1.0)
    nv.nvmlGpmSampleGet(h0, s2)
    nv.nvmlGpmSampleGet(h1, other)
    with pytest.raises(nv.NVMLError) as e:  # samples of different GPUs
        _metrics(s1, other, sm)
    assert _code(e) == nv.NVML_ERROR_INVALID_ARGUMENT
    with pytest.raises(nv.NVMLError) as e:  # the samples the wrong way round
        _metrics(s2, s1, sm)
    assert _code(e) == nv.NVML_ERROR_INVALID_ARGUMENT
    # Per-metric answers: defined but not modelled, and not defined at all.
    got = _metrics(s1, s2, [nv.NVML_GPM_METRIC_PCIE_TX_PER_SEC, 14, nv.NVML_GPM_METRIC_SM_UTIL])
    assert [rc for rc, _ in got] == [
        nv.NVML_ERROR_NOT_SUPPORTED,
        nv.NVML_ERROR_INVALID_ARGUMENT,
        nv.NVML_SUCCESS,
    ]
    get = nv.c_nvmlGpmMetricsGet_t()
    get.version = nv.NVML_GPM_METRICS_GET_VERSION + 1
    get.numMetrics, get.sample1, get.sample2 = 1, s1, s2
    get.metrics[0].metricId = nv.NVML_GPM_METRIC_SM_UTIL
    with pytest.raises(nv.NVMLError) as e:
        nv.nvmlGpmMetricsGet(get)
    assert _code(e) == nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    support = nv.c_nvmlGpmSupport_t()
    support.version = 2
    fn = nv._nvmlGetFunctionPointer("nvmlGpmQueryDeviceSupport")
    assert fn(h0, ctypes.byref(support)) == nv.NVML_ERROR_ARGUMENT_VERSION_MISMATCH
    nv.nvmlGpmSampleFree(other)
    with pytest.raises(nv.NVMLError) as e:  # freed twice
        nv.nvmlGpmSampleFree(other)
    assert _code(e) == nv.NVML_ERROR_INVALID_ARGUMENT
    with pytest.raises(nv.NVMLError) as e:  # a freed sample cannot be filled
        nv.nvmlGpmSampleGet(h0, other)
    assert _code(e) == nv.NVML_ERROR_INVALID_ARGUMENT
    fake.lose_gpu(0)
    with pytest.raises(nv.NVMLError) as e:
        nv.nvmlGpmSampleGet(h0, s2)
    assert _code(e) == nv.NVML_ERROR_GPU_IS_LOST
    nv.nvmlGpmSampleFree(s1)
    nv.nvmlGpmSampleFree(s2)


def test_drivers_before_r520_have_no_gpm(make_fake) -> None:
    fake = make_fake()
    fake.set_driver("515.105.01")
    with pytest.raises(nv.NVMLError) as e:
        nv.nvmlGpmQueryDeviceSupport(nv.nvmlDeviceGetHandleByIndex(0))
    assert _code(e) == nv.NVML_ERROR_FUNCTION_NOT_FOUND
    with pytest.raises(nv.NVMLError) as e:
        nv.nvmlGpmSampleAlloc()
    assert _code(e) == nv.NVML_ERROR_FUNCTION_NOT_FOUND
    fake.set_driver("520.61.05")
    assert nv.nvmlGpmQueryDeviceSupport(nv.nvmlDeviceGetHandleByIndex(0)).isSupportedDevice == 1


def test_gpm_calls_obey_the_fault_controls(make_fake) -> None:
    fake = make_fake()
    h = nv.nvmlDeviceGetHandleByIndex(3)
    s1, s2 = nv.nvmlGpmSampleAlloc(), nv.nvmlGpmSampleAlloc()
    nv.nvmlGpmSampleGet(h, s1)
    fake.advance(1.0)
    nv.nvmlGpmSampleGet(h, s2)
    fake.error_storm(nv.NVML_ERROR_UNKNOWN, count=1, function="nvmlGpmMetricsGet", gpu=3)
    with pytest.raises(nv.NVMLError) as e:  # a rule for GPU 3 matches its samples' call
        _metrics(s1, s2, [nv.NVML_GPM_METRIC_SM_UTIL])
    assert _code(e) == nv.NVML_ERROR_UNKNOWN
    [(rc, _)] = _metrics(s1, s2, [nv.NVML_GPM_METRIC_SM_UTIL])
    assert rc == nv.NVML_SUCCESS
    nv.nvmlGpmSampleFree(s1)
    nv.nvmlGpmSampleFree(s2)
