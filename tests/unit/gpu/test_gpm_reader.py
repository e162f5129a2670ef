"""GpmReader on a scripted NVML: windows, failures and a driver that refuses the struct.

The fake NVML library covers the real ABI (tests/integration/test_gpm.py); these pin the
reader's own rules on literal numbers: a failed call keeps the older sample so the next
window covers the gap, values that are not measurements are dropped, and a driver that
refuses the struct version turns GPM off with one log line.
"""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import pytest

from gpuscope.agent.gpu import gpm
from gpuscope.agent.gpu.nvml import ARGUMENT_VERSION_MISMATCH

UNKNOWN = 999


class ScriptedNvml:
    """raw_call by function name; every metric answers `percent` unless scripted."""

    def __init__(self) -> None:
        self.percent = 50.0
        self.codes: dict[str, list[int]] = {}  # function -> codes to answer next
        self.calls: list[str] = []
        self.live: set[int] = set()
        self.errors: list[tuple[str, int]] = []
        self._next = 1

    def raw_call(self, function: str, *args: Any, expected: frozenset[int] = frozenset()) -> int:
        self.calls.append(function)
        queued = self.codes.get(function)
        if queued:
            return queued.pop(0)
        if function == "nvmlGpmQueryDeviceSupport":
            args[1]._obj.isSupportedDevice = 1
        elif function == "nvmlGpmSampleAlloc":
            args[0]._obj.value = self._next
            self.live.add(self._next)
            self._next += 1
        elif function == "nvmlGpmSampleFree":
            self.live.discard(args[0].value)
        elif function == "nvmlGpmMetricsGet":
            request = args[0]._obj
            for slot in request.metrics[: request.numMetrics]:
                slot.nvmlReturn, slot.value = 0, self.percent
        return 0

    def query(self, function: str, *args: Any, **kwargs: Any) -> Any:
        return None  # nvmlDeviceGetMigMode: not a MIG GPU

    def record_error(self, function: str, code: int, message: str) -> None:
        self.errors.append((function, code))


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def reader() -> tuple[ScriptedNvml, Clock, gpm.GpmReader]:
    nvml, clock = ScriptedNvml(), Clock()
    return nvml, clock, gpm.GpmReader(nvml, ctypes.c_void_p(1), clock)  # type: ignore[arg-type]


def test_a_failed_metrics_call_keeps_the_older_sample_so_no_time_is_lost() -> None:
    nvml, clock, r = reader()
    assert r.read() == gpm.GpmTick()  # the first sample: no window yet
    clock.t += 1
    first = r.read()
    assert first is not None and first.gpu is not None
    assert first.gpu.sm_active_seconds == pytest.approx(0.5)
    nvml.codes["nvmlGpmMetricsGet"] = [UNKNOWN, UNKNOWN]
    for _ in range(2):
        clock.t += 1
        r.read()
    clock.t += 1
    nvml.percent = 100.0
    later = r.read()
    assert later is not None and later.gpu is not None
    # One window of 3 s at 100 %: the two failed ticks are inside it, not lost.
    assert later.gpu.sm_active_seconds == pytest.approx(0.5 + 3.0)
    assert later.gpu.activity is not None and later.gpu.activity.sm_active == 1.0


def test_a_failed_sample_is_not_a_window() -> None:
    nvml, clock, r = reader()
    r.read()
    clock.t += 1
    nvml.codes["nvmlGpmSampleGet"] = [UNKNOWN]
    got = r.read()
    assert got is not None and got.gpu is None  # nothing measured yet
    clock.t += 1
    got = r.read()
    assert got is not None and got.gpu is not None
    assert got.gpu.sm_active_seconds == pytest.approx(0.5 * 2)


@pytest.mark.parametrize(("percent", "ratio"), [(float("nan"), None), (-1.0, None), (100.5, 1.0)])
def test_values_that_are_not_measurements_are_dropped_or_clamped(
    percent: float, ratio: float | None
) -> None:
    nvml, clock, r = reader()
    r.read()
    clock.t += 1
    nvml.percent = percent
    got = r.read()
    assert got is not None and got.gpu is not None and got.gpu.activity is not None
    assert got.gpu.activity.sm_active == ratio
    assert got.gpu.sm_active_seconds == (0.0 if ratio is None else pytest.approx(ratio))


def test_a_driver_refusing_the_struct_version_turns_gpm_off_once(caplog) -> None:
    nvml, clock, r = reader()
    r.read()
    clock.t += 1
    nvml.codes["nvmlGpmMetricsGet"] = [ARGUMENT_VERSION_MISMATCH]
    with caplog.at_level(logging.WARNING, logger="gpuscope.gpu.gpm"):
        assert r.read() is None
        for _ in range(3):
            clock.t += 1
            assert r.read() is None
    assert len(caplog.records) == 1
    assert nvml.live == set()  # its sample buffers are freed
    assert nvml.calls.count("nvmlGpmMetricsGet") == 1  # and nothing more is asked


def test_a_gpu_without_gpm_is_asked_once() -> None:
    nvml, clock, r = reader()
    nvml.codes["nvmlGpmQueryDeviceSupport"] = [3]  # NOT_SUPPORTED
    for _ in range(3):
        clock.t += 1
        assert r.read() is None
    assert nvml.calls == ["nvmlGpmQueryDeviceSupport"]
