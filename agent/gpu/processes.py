"""Which processes hold each GPU, and how busy each keeps it.

`nvmlDeviceGetComputeRunningProcesses_v3` (`_v2` on drivers before 510) names the processes
with a CUDA context on the GPU and the memory each holds; `nvmlDeviceGetProcessUtilization`
returns per-process SM utilization samples newer than a timestamp we pass back on the next
call. Together they split a time-sliced GPU between the pods sharing it, which the
device-level utilization cannot do.

PIDs are host PIDs (the agent runs with hostPID). A process listed with no utilization
sample since the last read ran no kernel in that window: its utilization is 0, not unknown.
But NVML answers "no sample" (NOT_FOUND) both for an idle GPU and for a read that came
before the next sample period (1/6 s to 1 s) ended; two scrapes a moment apart must not turn
a busy pod idle, so within HOLD_SECONDS of the newest sample the previous figures stand.
On a MIG-enabled GPU NVML reports no per-process utilization; those processes carry `None`.
"""

from __future__ import annotations

import ctypes
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.gpu.nvml import (
    FUNCTION_NOT_FOUND,
    INSUFFICIENT_SIZE,
    NO_PERMISSION,
    NOT_FOUND,
    Nvml,
    text,
)
from gpuscope.agent.gpu.records import GpuProcess, MigInstance

if TYPE_CHECKING:
    from gpuscope.agent.gpu.device import Device

NO_INSTANCE = 0xFFFFFFFF  # gpuInstanceId / computeInstanceId of a process outside MIG
HOLD_SECONDS = 2.0  # longer than the slowest NVML sample period (1 s)


class ProcessReader:
    """Keeps, per GPU, the newest utilization sample seen, so each read covers only the
    window since the previous one (one reader per GPU source; called under its lock)."""

    def __init__(self, nvml: Nvml, clock: Clock | None = None) -> None:
        self._nvml = nvml
        self._clock = clock or SystemClock()
        self._last_seen: dict[str, int] = {}
        self._last_figures: dict[str, dict[int, float]] = {}
        self._supported: dict[str, bool] = {}
        self._layout: Layout | None = None  # decided on the first read, for the session
        self._per_instance: set[str] = set()  # MIG GPUs whose parent handle refused the list
        # Their MIG device handles, by GPU UUID, for the MIG layout they were read for.
        self._mig_handle_cache: dict[str, tuple[tuple[str, ...], list[tuple[str, Any]]]] = {}
        self.readable: dict[str, bool] = {}  # by GPU UUID: did NVML let us list processes?

    def read(self, device: Device, migs: tuple[MigInstance, ...] = ()) -> tuple[GpuProcess, ...]:
        """The GPU's compute processes; `readable[uuid]` says whether NVML let us list them."""
        nvml, h = self._nvml, device.handle
        uuid = device.identity.uuid
        if self._layout is None:
            self._layout = process_layout(nvml, h)
        running = self._list(device, migs)
        if not running:
            return ()
        utilization: Mapping[int, float] | None = None
        if not migs:
            utilization = self._utilization(h, uuid)
        mig_by_instance = {(m.gpu_instance, m.compute_instance): m.mig_uuid for m in migs}
        memory: dict[int, int | None] = {}
        mig_of: dict[int, str] = {}
        for proc in running:
            pid = int(proc.pid)
            used = proc.usedGpuMemory
            # A PID listed twice (one context per MIG instance) holds the sum of both.
            if used is not None:
                memory[pid] = (memory.get(pid) or 0) + int(used)
            else:
                memory.setdefault(pid, None)
            gi, ci = proc.gpuInstanceId, proc.computeInstanceId
            mig_uuid = proc.mig_uuid or mig_by_instance.get((gi, ci))
            if mig_uuid is not None:
                mig_of[pid] = mig_uuid
        return tuple(
            GpuProcess(
                pid=pid,
                used_memory_bytes=used,
                utilization_ratio=(utilization.get(pid, 0.0) if utilization is not None else None),
                partition_uuid=mig_of.get(pid, ""),
            )
            for pid, used in sorted(memory.items())
        )

    def _list(self, device: Device, migs: tuple[MigInstance, ...]) -> Sequence[Process]:
        """The process list; entries read through a MIG device handle carry its MIG UUID.

        In MIG mode the driver lists processes through the parent handle only for a caller
        with CAP_SYS_ADMIN (uid 0 is not enough), which the DaemonSet does not grant; then
        each MIG device handle is asked instead. If that is refused too, `readable` says so
        and the GPU's per-pod memory is missing rather than wrong."""
        assert self._layout is not None
        uuid, h = device.identity.uuid, device.handle
        if not migs or uuid not in self._per_instance:
            running, code = running_processes(self._nvml, h, self._layout)
            if code != NO_PERMISSION or not migs:
                self.readable[uuid] = code != NO_PERMISSION
                return running or ()
            self._per_instance.add(uuid)
        listed: list[Process] = []
        refused = 0
        handles = self._mig_handles_for(uuid, h, migs)
        for mig_uuid, mig_handle in handles:
            running, code = running_processes(self._nvml, mig_handle, self._layout)
            refused += code == NO_PERMISSION
            listed.extend(replace(proc, mig_uuid=mig_uuid) for proc in running or ())
        self.readable[uuid] = not handles or refused < len(handles)
        return listed

    def _mig_handles_for(
        self, uuid: str, handle: Any, migs: tuple[MigInstance, ...]
    ) -> list[tuple[str, Any]]:
        """The MIG device handles, looked up again only when the MIG layout changed (the
        scrape already read the instances; this path must not repeat it every scrape)."""
        layout = tuple(m.mig_uuid for m in migs)
        cached = self._mig_handle_cache.get(uuid)
        if cached is None or cached[0] != layout:
            cached = self._mig_handle_cache[uuid] = (layout, self._mig_handles(handle))
        return cached[1]

    def _mig_handles(self, handle: Any) -> list[tuple[str, Any]]:
        count = self._nvml.query("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
        found = []
        for i in range(int(count)):
            mig = self._nvml.query(
                "nvmlDeviceGetMigDeviceHandleByIndex", handle, i, absent=frozenset({NOT_FOUND})
            )
            if mig is not None:
                found.append((text(self._nvml.query("nvmlDeviceGetUUID", mig) or ""), mig))
        return found

    def _utilization(self, handle: object, uuid: str) -> Mapping[int, float] | None:
        """Mean SM utilization (0-1) per PID over the samples since the last read."""
        supported = self._supported.get(uuid)
        if supported is None:
            supported = self._supported[uuid] = self._nvml.supports(
                "nvmlDeviceGetProcessUtilization", handle, 0
            )
        if not supported:
            return None
        since = self._last_seen.get(uuid, 0)
        samples = self._nvml.query(
            "nvmlDeviceGetProcessUtilization", handle, since, absent=frozenset({NOT_FOUND})
        )
        if samples is None:  # NOT_FOUND: no sample since `since`
            if since and self._clock.time() * 1e6 - since < HOLD_SECONDS * 1e6:
                return self._last_figures.get(uuid, {})  # the next period has not ended yet
            return {}  # a whole period without a sample: no process ran a kernel
        sums: dict[int, float] = defaultdict(float)
        counts: dict[int, int] = defaultdict(int)
        newest = since
        for s in samples:
            ts = int(s.timeStamp)
            if ts <= since:
                continue
            newest = max(newest, ts)
            sums[int(s.pid)] += float(s.smUtil)
            counts[int(s.pid)] += 1
        self._last_seen[uuid] = newest
        figures = {pid: min(1.0, sums[pid] / counts[pid] / 100.0) for pid in sums}
        self._last_figures[uuid] = figures
        return figures


# --- listing the processes, with the struct this driver writes ----------------------------
#
# nvmlDeviceGetComputeRunningProcesses_v3 exists from driver 510, and the entry it fills has
# not always had one size: the R535-R545 headers added usedGpuCcProtectedMemory to
# nvmlProcessInfo_t (32 bytes) and R550 moved it out again, into nvmlProcessDetail_v1_t
# (nvmlDeviceGetRunningProcessDetailList). nvidia-ml-py follows only its own release's
# header: 13.x passes 24-byte entries to an R535 driver that writes 32, and 12.535 passes
# 32 to an R550 driver that writes 24; either way every entry after the first is misread.
# So the agent lays out the entries itself and asks the driver which it writes: a driver
# with nvmlDeviceGetConfComputeMemSizeInfo (R535+) and without
# nvmlDeviceGetRunningProcessDetailList (R550+) writes the 32-byte entry (nvitop, which has
# met those drivers, decides the same way). Presence is probed by calling, so a symbol the
# library lacks and a function answering FUNCTION_NOT_FOUND read the same.


class _ProcessInfoV1(ctypes.Structure):
    _fields_ = [("pid", ctypes.c_uint), ("usedGpuMemory", ctypes.c_ulonglong)]


class _ProcessInfoV2(ctypes.Structure):
    _fields_ = [
        *_ProcessInfoV1._fields_,
        ("gpuInstanceId", ctypes.c_uint),
        ("computeInstanceId", ctypes.c_uint),
    ]


class _ProcessInfoCc(ctypes.Structure):
    """nvmlProcessInfo_t of the R535-R545 headers."""

    _fields_ = [*_ProcessInfoV2._fields_, ("usedGpuCcProtectedMemory", ctypes.c_ulonglong)]


class _ConfComputeMemSizeInfo(ctypes.Structure):
    _fields_ = [
        ("protectedMemSizeKib", ctypes.c_ulonglong),
        ("unprotectedMemSizeKib", ctypes.c_ulonglong),
    ]


class _ProcessDetailList(ctypes.Structure):
    _fields_ = [
        ("version", ctypes.c_uint),
        ("mode", ctypes.c_uint),
        ("numProcArrayEntries", ctypes.c_uint),
        ("procArray", ctypes.c_void_p),
    ]


@dataclass(frozen=True, slots=True)
class Process:
    """One entry of the running-process list, whatever struct the driver filled."""

    pid: int
    usedGpuMemory: int | None  # noqa: N815 - NVML's names, as the rest of the reader expects
    gpuInstanceId: int = NO_INSTANCE  # noqa: N815
    computeInstanceId: int = NO_INSTANCE  # noqa: N815
    mig_uuid: str = ""  # set when listed through a MIG device handle


NOT_AVAILABLE = 0xFFFFFFFFFFFFFFFF  # usedGpuMemory under WDDM


def _exists(nvml: Nvml, function: str, *args: Any) -> bool:
    return nvml.raw_call(function, *args, expected=_PROBE_CODES) != FUNCTION_NOT_FOUND


# Answers that prove a function exists without being failures: 2 is INVALID_ARGUMENT, 4 is
# NO_PERMISSION (a MIG parent without CAP_SYS_ADMIN).
_PROBE_CODES = frozenset({INSUFFICIENT_SIZE, NOT_FOUND, 2, 4})


Layout = tuple[str, type[ctypes.Structure]]  # the function to call, the entry it fills


def process_layout(nvml: Nvml, handle: Any) -> Layout:
    """Which listing call this driver has and which entry it fills (ask once per session)."""
    count = ctypes.c_uint(0)
    found: Layout
    v3 = "nvmlDeviceGetComputeRunningProcesses_v3"
    if _exists(nvml, v3, handle, ctypes.byref(count), None):
        cc = _exists(
            nvml,
            "nvmlDeviceGetConfComputeMemSizeInfo",
            handle,
            ctypes.byref(_ConfComputeMemSizeInfo()),
        )
        detail = _ProcessDetailList(version=ctypes.sizeof(_ProcessDetailList) | 1 << 24)
        has_detail = _exists(
            nvml, "nvmlDeviceGetRunningProcessDetailList", handle, ctypes.byref(detail)
        )
        found = (v3, _ProcessInfoCc if cc and not has_detail else _ProcessInfoV2)
    elif _exists(
        nvml, "nvmlDeviceGetComputeRunningProcesses_v2", handle, ctypes.byref(count), None
    ):
        found = ("nvmlDeviceGetComputeRunningProcesses_v2", _ProcessInfoV2)
    else:
        found = ("nvmlDeviceGetComputeRunningProcesses", _ProcessInfoV1)
    return found


def running_processes(
    nvml: Nvml, handle: Any, layout: Layout
) -> tuple[Sequence[Process] | None, int]:
    """The processes with a compute context on the GPU (None when NVML cannot say), and
    NVML's last answer (NO_PERMISSION: a MIG parent handle without CAP_SYS_ADMIN)."""
    function, entry = layout
    count = ctypes.c_uint(0)
    code = nvml.raw_call(function, handle, ctypes.byref(count), None, expected=_PROBE_CODES)
    for _ in range(3):  # processes can start between the two calls
        if code == 0:
            return (), code
        if code != INSUFFICIENT_SIZE:
            return None, code
        count.value = count.value * 2 + 5
        entries = (entry * count.value)()
        code = nvml.raw_call(function, handle, ctypes.byref(count), entries, expected=_PROBE_CODES)
        if code == 0:
            return tuple(_process(entries[i]) for i in range(count.value)), code
    return None, code


def _process(e: Any) -> Process:
    used = int(e.usedGpuMemory)
    return Process(
        pid=int(e.pid),
        usedGpuMemory=None if used == NOT_AVAILABLE else used,
        gpuInstanceId=int(getattr(e, "gpuInstanceId", NO_INSTANCE)),
        computeInstanceId=int(getattr(e, "computeInstanceId", NO_INSTANCE)),
    )
