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

from collections import defaultdict
from collections.abc import Mapping

from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.gpu.device import Device
from gpuscope.agent.gpu.nvml import NOT_FOUND, Nvml
from gpuscope.agent.gpu.records import GpuProcess, MigInstance

# The versioned calls, newest first: `_v3` exists from driver 510 (NVML 11.510); before it,
# pynvml's unversioned wrapper raises NVMLLibraryMismatchError, not an NVMLError.
RUNNING_PROCESSES = (
    "nvmlDeviceGetComputeRunningProcesses_v3",
    "nvmlDeviceGetComputeRunningProcesses_v2",
)
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

    def read(self, device: Device, migs: tuple[MigInstance, ...] = ()) -> tuple[GpuProcess, ...]:
        nvml, h = self._nvml, device.handle
        running = nvml.query_versions(RUNNING_PROCESSES, h)
        if not running:
            return ()
        uuid = device.identity.uuid
        utilization: Mapping[int, float] | None = None
        if not migs:
            utilization = self._utilization(h, uuid)
        mig_by_instance = {(m.gpu_instance, m.compute_instance): m.mig_uuid for m in migs}
        memory: dict[int, int | None] = {}
        mig_of: dict[int, str] = {}
        for proc in running:
            pid = int(proc.pid)
            used = getattr(proc, "usedGpuMemory", None)
            # A PID listed twice (one context per MIG instance) holds the sum of both.
            if used is not None:
                memory[pid] = (memory.get(pid) or 0) + int(used)
            else:
                memory.setdefault(pid, None)
            gi = int(getattr(proc, "gpuInstanceId", NO_INSTANCE))
            ci = int(getattr(proc, "computeInstanceId", NO_INSTANCE))
            mig_uuid = mig_by_instance.get((gi, ci))
            if mig_uuid is not None:
                mig_of[pid] = mig_uuid
        return tuple(
            GpuProcess(
                pid=pid,
                used_memory_bytes=used,
                sm_utilization_ratio=(
                    utilization.get(pid, 0.0) if utilization is not None else None
                ),
                mig_uuid=mig_of.get(pid, ""),
            )
            for pid, used in sorted(memory.items())
        )

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
