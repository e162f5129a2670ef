"""NVML GPM (GPU Performance Monitoring): profiling-grade activity without DCGM.

NVML's utilization is "a kernel was running": one tiny kernel in a loop reads 100 %. On
Hopper and later, GPM counts what the SMs, tensor pipes and DRAM actually did: take a GPM
sample (`nvmlGpmSampleGet`, or `nvmlGpmMigSampleGet` for one MIG GPU instance), take another
later, and `nvmlGpmMetricsGet` gives each metric's average over the window between them. So
the sampler takes one sample per scope (the GPU, each MIG GPU instance) every tick and keeps
the previous one: each window's ratios are the latest gauges, and ratio x window length
integrates into seconds counters whose rate() is exact over any range, as for busy time.

Everything goes through `Nvml.raw_call` with ctypes structs of our own (nvml.h's layouts),
so bindings without the GPM wrappers or metric ids (nvidia-ml-py 12.535.77 has them, older
ones may not) read as "not supported", never as an exception. A `GpmReader` belongs to one
GPU and runs only on that GPU's gate worker (agent/accelerators/gate.py), so a hung GPM call holds
that GPU alone; it returns plain `GpmWindow` records and never touches sampler state.

A failed sample or metrics call keeps the older sample: the next success then covers the
longer window, so nothing is lost or counted twice. The reader keeps the running totals
itself and each read returns them whole, so a read whose result the sampler never saw (it
ran past the read deadline, its late result dropped) loses nothing either.
"""

from __future__ import annotations

import ctypes
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from gpuscope.agent.gpu.nvml import (
    ARGUMENT_VERSION_MISMATCH,
    FUNCTION_NOT_FOUND,
    NOT_FOUND,
    NOT_SUPPORTED,
    Nvml,
    text,
)
from gpuscope.agent.gpu.records import GpmActivity

log = logging.getLogger("gpuscope.gpu.gpm")

GPM_SUPPORT_VERSION = 1  # NVML_GPM_SUPPORT_VERSION
GPM_METRICS_GET_VERSION = 1  # NVML_GPM_METRICS_GET_VERSION
# nvmlGpmMetricsGet_t.metrics[] has NVML_GPM_METRIC_MAX entries: 98 in the R520-R535 headers,
# more later with the version unchanged. The library reads only numMetrics of them, so the
# smallest array serves every driver.
GPM_METRIC_MAX = 98

# nvmlGpmMetricId_t values (nvml.h) -> where each lands in GpmActivity.
SM_ACTIVE = 2  # NVML_GPM_METRIC_SM_UTIL: share of SMs busy
SM_OCCUPANCY = 3  # NVML_GPM_METRIC_SM_OCCUPANCY: resident warps of the maximum
GRAPHICS_ACTIVE = 1  # NVML_GPM_METRIC_GRAPHICS_UTIL: the graphics/compute engine active
TENSOR_ACTIVE = 5  # NVML_GPM_METRIC_ANY_TENSOR_UTIL
DRAM_ACTIVE = 10  # NVML_GPM_METRIC_DRAM_BW_UTIL: DRAM bandwidth used of peak
PIPES: Mapping[str, int] = MappingProxyType(
    {"fp64": 11, "fp32": 12, "fp16": 13, "integer": 4}  # NVML_GPM_METRIC_{FP64..}_UTIL
)
METRIC_IDS: tuple[int, ...] = (
    SM_ACTIVE,
    SM_OCCUPANCY,
    GRAPHICS_ACTIVE,
    TENSOR_ACTIVE,
    DRAM_ACTIVE,
    *PIPES.values(),
)

# The GPM calls one tick makes per scope, for scripts/gpu-check's cost census.
TICK_CALLS = ("nvmlGpmSampleGet", "nvmlGpmMetricsGet")
MIG_TICK_CALLS = ("nvmlGpmMigSampleGet", "nvmlGpmMetricsGet")


class _MetricInfo(ctypes.Structure):
    _fields_ = [
        ("shortName", ctypes.c_char_p),
        ("longName", ctypes.c_char_p),
        ("unit", ctypes.c_char_p),
    ]


class GpmMetric(ctypes.Structure):
    """nvmlGpmMetric_t (40 bytes)."""

    _fields_ = [
        ("metricId", ctypes.c_uint),
        ("nvmlReturn", ctypes.c_uint),
        ("value", ctypes.c_double),
        ("metricInfo", _MetricInfo),
    ]


class GpmMetricsGet(ctypes.Structure):
    """nvmlGpmMetricsGet_t with the R520-R535 array size (see GPM_METRIC_MAX)."""

    _fields_ = [
        ("version", ctypes.c_uint),
        ("numMetrics", ctypes.c_uint),
        ("sample1", ctypes.c_void_p),
        ("sample2", ctypes.c_void_p),
        ("metrics", GpmMetric * GPM_METRIC_MAX),
    ]


class GpmSupport(ctypes.Structure):
    """nvmlGpmSupport_t."""

    _fields_ = [("version", ctypes.c_uint), ("isSupportedDevice", ctypes.c_uint)]


def supported(nvml: Nvml, handle: Any) -> bool:
    """Whether nvmlGpmQueryDeviceSupport says the GPU has GPM (Hopper and later, R520+)."""
    support = GpmSupport(version=GPM_SUPPORT_VERSION, isSupportedDevice=0)
    code = nvml.raw_call("nvmlGpmQueryDeviceSupport", handle, ctypes.byref(support))
    return code == 0 and bool(support.isSupportedDevice)


@dataclass(frozen=True, slots=True)
class GpmScopeReading:
    """One scope's GPM so far: seconds counters (ratio x window, summed over every window
    since the scope's first sample) and the last window's ratios."""

    sm_active_seconds: float
    tensor_active_seconds: float
    dram_active_seconds: float
    activity: GpmActivity | None  # None until the first window
    activity_at: float  # agent monotonic time that window ended
    # The graphics/compute engine's active share integrated: GPM's busy time, what a MIG
    # GPU instance has instead of NVML's utilization samples; and the windows at or below
    # the idle threshold (--idle-threshold), its idle time.
    busy_seconds: float = 0.0
    idle_seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class GpmTick:
    """A GPU's GPM after one read: `gpu` the whole GPU, `instances` by MIG GPU instance id;
    a scope is there once it has had its first window."""

    gpu: GpmScopeReading | None = None
    instances: Mapping[int, GpmScopeReading] = field(default_factory=dict)


class _Scope:
    """Two sample buffers of one scope: the last good sample and the one filled next."""

    def __init__(self, nvml: Nvml, gpu_instance: int | None, idle_threshold: float) -> None:
        self.gpu_instance = gpu_instance
        self.idle_threshold = idle_threshold
        self.busy_seconds = 0.0
        self.idle_seconds = 0.0
        self.previous: ctypes.c_void_p | None = None
        self.previous_at = 0.0
        self.spare: ctypes.c_void_p | None = None
        self.dead = False  # answered NOT_SUPPORTED / NOT_FOUND: no more calls
        self.sm_active_seconds = 0.0
        self.tensor_active_seconds = 0.0
        self.dram_active_seconds = 0.0
        self.activity: GpmActivity | None = None
        self.activity_at = 0.0
        self._nvml = nvml

    def add(self, activity: GpmActivity, seconds: float, at: float) -> None:
        """One window: the ratios become the latest, ratio x length goes to the counters."""
        if activity.sm_active is not None:
            self.sm_active_seconds += activity.sm_active * seconds
        if activity.tensor_active is not None:
            self.tensor_active_seconds += activity.tensor_active * seconds
        if activity.dram_active is not None:
            self.dram_active_seconds += activity.dram_active * seconds
        if activity.graphics_engine_active is not None:
            self.busy_seconds += activity.graphics_engine_active * seconds
            if activity.graphics_engine_active <= self.idle_threshold:
                self.idle_seconds += seconds
        self.activity = activity
        self.activity_at = at

    def reading(self) -> GpmScopeReading | None:
        if self.activity is None:
            return None
        return GpmScopeReading(
            sm_active_seconds=self.sm_active_seconds,
            tensor_active_seconds=self.tensor_active_seconds,
            dram_active_seconds=self.dram_active_seconds,
            activity=self.activity,
            activity_at=self.activity_at,
            busy_seconds=self.busy_seconds,
            idle_seconds=self.idle_seconds,
        )

    def allocate(self) -> bool:
        for attr in ("previous", "spare"):
            sample = ctypes.c_void_p()
            if self._nvml.raw_call("nvmlGpmSampleAlloc", ctypes.byref(sample)) != 0:
                self.free()
                return False
            setattr(self, attr, sample)
        self.previous_at = -1.0  # allocated, not filled yet
        return True

    def free(self) -> None:
        for attr in ("previous", "spare"):
            sample = getattr(self, attr)
            if sample is not None:
                self._nvml.raw_call("nvmlGpmSampleFree", sample)
                setattr(self, attr, None)


RESCAN_READS = 60  # reads between two looks at the GPU's MIG GPU instances


class GpmReader:
    """GPM for one GPU: call `read` once per tick, on the GPU's worker only. The first read
    asks nvmlGpmQueryDeviceSupport; the GPU's MIG GPU instances are looked up then, every
    RESCAN_READS reads and whenever one stops answering (MIG reconfigured)."""

    def __init__(
        self, nvml: Nvml, handle: Any, clock: Callable[[], float], idle_threshold: float = 0.0
    ) -> None:
        self._nvml = nvml
        self._idle_threshold = idle_threshold
        self._handle = handle
        self._clock = clock
        self._supported: bool | None = None  # None until the first read asked
        self._reads = 0
        self._scopes: dict[int | None, _Scope] = {}
        self._request = GpmMetricsGet()
        self._request.version = GPM_METRICS_GET_VERSION
        self._request.numMetrics = len(METRIC_IDS)
        for slot, metric in zip(self._request.metrics, METRIC_IDS, strict=False):
            slot.metricId = metric

    def set_scopes(self, gpu_instances: tuple[int, ...] | None) -> None:
        """The scopes to sample: the whole GPU and, on a MIG-enabled GPU, these GPU
        instances (None: not in MIG mode). Scopes that went away are freed."""
        wanted: set[int | None] = {None, *(gpu_instances or ())}
        for key in [k for k in self._scopes if k not in wanted or self._scopes[k].dead]:
            self._scopes.pop(key).free()  # a dead scope is tried afresh (MIG reconfigured)
        for key in wanted:
            if key not in self._scopes:
                self._scopes[key] = _Scope(self._nvml, key, self._idle_threshold)

    def read(self) -> GpmTick | None:
        """Sample every scope; the totals of each that has had a window. None: the GPU has
        no GPM (before Hopper, a driver before R520, or one whose struct version differs)."""
        if self._supported is None:
            self._supported = supported(self._nvml, self._handle)
        if not self._supported:
            return None
        if self._reads % RESCAN_READS == 0 or any(
            s.dead for k, s in self._scopes.items() if k is not None
        ):
            self.set_scopes(gpu_instances(self._nvml, self._handle))
        self._reads += 1
        whole: GpmScopeReading | None = None
        instances: dict[int, GpmScopeReading] = {}
        for key, scope in self._scopes.items():
            self._step(scope)
            if not self._supported:  # refused our struct version: off for good
                self.close()
                return None
            got = scope.reading()
            if got is None:
                continue
            if key is None:
                whole = got
            else:
                instances[key] = got
        return GpmTick(gpu=whole, instances=MappingProxyType(instances))

    def close(self) -> None:
        """Free every sample buffer (best effort: they are host memory)."""
        for scope in self._scopes.values():
            scope.free()
        self._scopes.clear()

    def _step(self, scope: _Scope) -> None:
        """Sample the scope; with a previous sample, add the window between them."""
        if scope.dead:
            return
        if scope.previous is None and not scope.allocate():
            scope.dead = True
            return
        assert scope.previous is not None and scope.spare is not None
        if not self._sample(scope, scope.spare):
            return
        at = self._clock()
        if scope.previous_at < 0 or at <= scope.previous_at:
            scope.previous, scope.spare = scope.spare, scope.previous
            scope.previous_at = at
            return
        activity = self._metrics(scope.previous, scope.spare)
        if activity is None:
            return  # keep the older sample: the next window covers this one too
        scope.add(activity, at - scope.previous_at, at)
        scope.previous, scope.spare = scope.spare, scope.previous
        scope.previous_at = at

    def _sample(self, scope: _Scope, sample: ctypes.c_void_p) -> bool:
        if scope.gpu_instance is None:
            code = self._nvml.raw_call("nvmlGpmSampleGet", self._handle, sample)
        else:
            code = self._nvml.raw_call(
                "nvmlGpmMigSampleGet",
                self._handle,
                ctypes.c_uint(scope.gpu_instance),
                sample,
                expected=frozenset({NOT_FOUND}),
            )
        if code in (NOT_SUPPORTED, FUNCTION_NOT_FOUND, NOT_FOUND):
            scope.dead = True  # a GPU (or instance) without GPM, or an instance destroyed
            scope.free()
        return code == 0

    def _metrics(self, first: ctypes.c_void_p, second: ctypes.c_void_p) -> GpmActivity | None:
        request = self._request
        request.sample1, request.sample2 = first.value, second.value
        code = self._nvml.raw_call("nvmlGpmMetricsGet", ctypes.byref(request))
        if code == ARGUMENT_VERSION_MISMATCH:
            # A driver that wants another nvmlGpmMetricsGet_t: nothing this agent can lay
            # out. Said once, then the GPU reads as one without GPM.
            log.warning("nvmlGpmMetricsGet: the driver refuses struct version 1; GPM is off")
            self._supported = False
        if code != 0:
            return None
        values: dict[int, float | None] = {}
        for slot in request.metrics[: len(METRIC_IDS)]:
            values[int(slot.metricId)] = _ratio(self._nvml, slot)
        return GpmActivity(
            sm_active=values[SM_ACTIVE],
            sm_occupancy=values[SM_OCCUPANCY],
            graphics_engine_active=values[GRAPHICS_ACTIVE],
            tensor_active=values[TENSOR_ACTIVE],
            dram_active=values[DRAM_ACTIVE],
            pipes=MappingProxyType(
                {pipe: v for pipe, metric in PIPES.items() if (v := values[metric]) is not None}
            ),
        )


def gpu_instances(nvml: Nvml, handle: Any) -> tuple[int, ...] | None:
    """The GPU instance ids of a MIG-enabled GPU (None when MIG is off or unsupported)."""
    mode = nvml.query("nvmlDeviceGetMigMode", handle)
    if mode is None or int(mode[0]) != 1:
        return None
    count = nvml.query("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    found: list[int] = []
    for i in range(int(count)):
        mig = nvml.query(
            "nvmlDeviceGetMigDeviceHandleByIndex", handle, i, absent=frozenset({NOT_FOUND})
        )
        gi = nvml.query("nvmlDeviceGetGpuInstanceId", mig) if mig is not None else None
        if gi is not None and int(gi) not in found:
            found.append(int(gi))
    return tuple(found)


def _ratio(nvml: Nvml, slot: GpmMetric) -> float | None:
    """A metric's percentage as a ratio 0-1, or None where the driver gave none."""
    code = int(slot.nvmlReturn)
    if code != 0:
        if code not in (NOT_SUPPORTED, FUNCTION_NOT_FOUND):
            nvml.record_error(f"nvmlGpmMetricsGet[{int(slot.metricId)}]", code, f"error {code}")
        return None
    value = float(slot.value)
    if not value >= 0.0:  # NaN or negative: not a measurement
        return None
    return min(value, 100.0) / 100.0


def metric_name(slot: GpmMetric) -> str:
    """The driver's short name for a metric, where it gave one (for gpu-check reports)."""
    name = slot.metricInfo.shortName
    return text(name) if name else ""
