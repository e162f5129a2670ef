"""A driver that misbehaves, injected at the pynvml boundary of one process.

Put this directory first on PYTHONPATH of a subprocess and name the misbehaviours in
`GPUSCOPE_MISBEHAVE` (comma-separated); Python imports this module at start-up and wraps
pynvml's functions before any caller (the agent, scripts/gpu-check) uses them. It stands in
for what a real driver might do and the fake NVML library (which behaves) never does, without
touching the fake. Child processes inherit both variables, so they misbehave too.

Misbehaviours:
  util_over_100          GPU utilization samples above 0% read 100 points higher
  timestamps_zero        every utilization sample has timestamp 0
  wrong_clock            utilization sample timestamps on CLOCK_MONOTONIC, not the epoch
  slow_field_values      nvmlDeviceGetFieldValues takes 300 ms more
  fields_invalid_argument  fields the device lacks answer INVALID_ARGUMENT, not NOT_SUPPORTED
  registration_refused   nvmlDeviceRegisterEvents answers NO_PERMISSION
  events_lost            nvmlEventSetWait_v2 never delivers an event (TIMEOUT)
  proc_util_over_100     per-process SM utilization 100 points higher
  proc_samples_sparse    per-process samples refreshed only every 5 s
  procs_need_sys_admin   no compute process listed unless the caller has CAP_SYS_ADMIN

(This shadows the interpreter's own sitecustomize, if any: on Debian that only installs
apport's exception hook.)
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import time
from collections.abc import Callable
from typing import Any

KNOWN = frozenset(
    [
        "util_over_100",
        "timestamps_zero",
        "wrong_clock",
        "slow_field_values",
        "fields_invalid_argument",
        "registration_refused",
        "events_lost",
        "proc_util_over_100",
        "proc_samples_sparse",
        "procs_need_sys_admin",
    ]
)
NOT_SUPPORTED, INVALID_ARGUMENT, NO_PERMISSION, NOT_FOUND, TIMEOUT = 3, 2, 4, 6, 10
GPU_UTILIZATION_SAMPLES = 1
UNION_MEMBERS = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}
SPARSE_S = 5.0


def has_sys_admin() -> bool:
    status = open("/proc/self/status").read()  # noqa: SIM115 - at start-up, tiny
    eff = re.search(r"^CapEff:\s*([0-9a-f]+)$", status, re.M)
    return bool(eff and int(eff.group(1), 16) >> 21 & 1)


def wrap_samples(pynvml: Any, wanted: frozenset[str]) -> None:
    real = pynvml.nvmlDeviceGetSamples
    shift = int((time.time() - time.monotonic()) * 1e6) if "wrong_clock" in wanted else 0

    def samples(handle: Any, sampling_type: int, last_seen: int) -> Any:
        util = int(sampling_type) == GPU_UTILIZATION_SAMPLES
        since = last_seen + shift if util and shift and last_seen else last_seen
        value_type, got = real(handle, sampling_type, since)
        if not util:
            return value_type, got
        member = UNION_MEMBERS.get(int(value_type), "ullVal")
        for s in got:
            v = getattr(s.sampleValue, member)
            if "util_over_100" in wanted and v > 0:
                setattr(s.sampleValue, member, v + 100)
            if "timestamps_zero" in wanted:
                s.timeStamp = 0
            elif shift:
                s.timeStamp = int(s.timeStamp) - shift
        return value_type, got

    pynvml.nvmlDeviceGetSamples = samples


class SparseProcessSamples:
    """A driver that refreshes its per-process samples only every SPARSE_S seconds: every
    caller (the agent, the script's recorder) sees the same stale set in between."""

    def __init__(self, real: Callable[..., Any], pynvml: Any) -> None:
        self.real, self.pynvml = real, pynvml
        self.cache: dict[int, tuple[float, list[Any]]] = {}

    def __call__(self, handle: Any, since: int) -> list[Any]:
        key = ctypes.cast(handle, ctypes.c_void_p).value or 0
        at, samples = self.cache.get(key, (-SPARSE_S, []))
        now = time.monotonic()
        if now - at >= SPARSE_S:
            try:
                samples = list(self.real(handle, 0))
            except self.pynvml.NVMLError:
                samples = []
            self.cache[key] = (now, samples)
        got = [s for s in samples if int(s.timeStamp) > since]
        if not got:
            raise self.pynvml.NVMLError(NOT_FOUND)
        return got


def wrap_processes(pynvml: Any, wanted: frozenset[str]) -> None:
    real = pynvml.nvmlDeviceGetProcessUtilization
    if "proc_samples_sparse" in wanted:
        real = SparseProcessSamples(real, pynvml)

    def utilization(handle: Any, since: int) -> Any:
        got = real(handle, since)
        if "proc_util_over_100" in wanted:
            for s in got:
                s.smUtil += 100
        return got

    pynvml.nvmlDeviceGetProcessUtilization = utilization


def running_processes(fn: Callable[..., int]) -> Callable[..., int]:
    """Without CAP_SYS_ADMIN the list is empty: (handle, *count, entries) -> SUCCESS, 0."""

    def call(handle: Any, count: Any, entries: Any) -> int:
        if has_sys_admin():
            return fn(handle, count, entries)
        getattr(count, "_obj", count).value = 0
        return 0

    return call


def field_values(fn: Callable[..., int], wanted: frozenset[str]) -> Callable[..., int]:
    def call(handle: Any, count: Any, values: Any) -> int:
        if "slow_field_values" in wanted:
            time.sleep(0.3)
        ret = fn(handle, count, values)
        if "fields_invalid_argument" in wanted:
            for v in getattr(values, "_obj", values):
                if v.nvmlReturn == NOT_SUPPORTED:
                    v.nvmlReturn = INVALID_ARGUMENT
        return ret

    return call


def event_wait(_event_set: Any, _data: Any, timeout: Any) -> int:
    time.sleep(min(1.0, getattr(timeout, "value", timeout) / 1000.0))
    return TIMEOUT


def wrap_pointers(pynvml: Any, wanted: frozenset[str]) -> None:
    """Through the C function pointers (`_nvmlGetFunctionPointer`): the agent calls some
    of them itself, and pynvml's own wrappers look the pointer up the same way."""
    real = pynvml._nvmlGetFunctionPointer

    def pointer(name: str) -> Any:
        fn = real(name)
        if name == "nvmlDeviceGetFieldValues":
            return field_values(fn, wanted)
        if name == "nvmlDeviceRegisterEvents" and "registration_refused" in wanted:
            return lambda *_args: NO_PERMISSION
        if name == "nvmlEventSetWait_v2" and "events_lost" in wanted:
            return event_wait
        if name.startswith("nvmlDeviceGetComputeRunningProcesses") and (
            "procs_need_sys_admin" in wanted
        ):
            return running_processes(fn)
        return fn

    pynvml._nvmlGetFunctionPointer = pointer


def install(wanted: frozenset[str]) -> None:
    unknown = wanted - KNOWN
    if unknown:
        sys.stderr.write(f"GPUSCOPE_MISBEHAVE: unknown {sorted(unknown)}; known {sorted(KNOWN)}\n")
        os._exit(2)
    try:
        import pynvml
    except ImportError:
        return
    wrap_samples(pynvml, wanted)
    wrap_processes(pynvml, wanted)
    wrap_pointers(pynvml, wanted)


_wanted = frozenset(w for w in os.environ.get("GPUSCOPE_MISBEHAVE", "").split(",") if w)
if _wanted:
    install(_wanted)
