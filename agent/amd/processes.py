"""Processes on AMD GPUs: AMD SMI's process list per processor (a whole GPU, or one XCP of
a partitioned one), with each process's VRAM and its share of the compute engine.

The library reports each process's gfx engine time as a cumulative count of nanoseconds,
so the share over a window is delta(ns) / window; a process seen for the first time has no
share yet (None), never a made-up 0. AMD documents about a second between calls for a
fresh list: a processor asked sooner gets its previous list again, without a call.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscope.agent.accelerators.records import DeviceProcess
from gpuscope.agent.amd.library import NO_PERM, UNAVAILABLE, AmdSmi, AmdSmiCallError, number

if TYPE_CHECKING:
    from gpuscope.agent.amd.device import Device
    from gpuscope.agent.clock import Clock

MIN_INTERVAL = 1.0  # seconds between two process-list calls to one processor


@dataclass(frozen=True, slots=True)
class _Seen:
    """A process at the last list of its processor: when that was (agent clock) and its gfx
    engine nanoseconds then (None: not reported), the start of its next share's window."""

    at: float
    gfx_ns: float | None


class ProcessReader:
    def __init__(self, lib: AmdSmi, clock: Clock) -> None:
        self.lib = lib
        self.clock = clock
        self._lock = threading.Lock()
        self._seen: dict[tuple[str, int], _Seen] = {}  # (processor UUID, pid)
        self._last: dict[str, tuple[float, tuple[DeviceProcess, ...]]] = {}
        self.refused: set[str] = set()  # GPUs whose list the library refused (NO_PERM)

    def read(self, device: Device) -> tuple[DeviceProcess, ...]:
        """(On the GPU's worker.) Every process on the GPU's processors. Partitioned GPUs
        tag each process with the partition (XCP) it runs in."""
        found: list[DeviceProcess] = []
        refused = False
        for p in device.processors:
            got = self._read_processor(p.handle, p.uuid, device.partitioned)
            if got is None:
                refused = True
                continue
            found.extend(got)
        with self._lock:
            if refused:
                self.refused.add(device.identity.uuid)
            else:
                self.refused.discard(device.identity.uuid)
        return tuple(found)

    def _read_processor(
        self, handle: object, uuid: str, partitioned: bool
    ) -> tuple[DeviceProcess, ...] | None:
        now = self.clock.monotonic()
        with self._lock:
            last = self._last.get(uuid)
        if last is not None and now - last[0] < MIN_INTERVAL:
            return last[1]
        try:
            listed = self.lib.call("amdsmi_get_gpu_process_list", handle)
        except AmdSmiCallError as exc:
            if exc.status == NO_PERM:
                return None  # refused: the GPU's per-pod memory is unknown, not zero
            if exc.status not in UNAVAILABLE:
                raise
            listed = []  # the part or release has no process list

        procs = self._convert(listed, uuid, partitioned, now)
        with self._lock:
            self._last[uuid] = (now, procs)
        return procs

    def _convert(
        self, listed: Sequence[dict[str, object]], uuid: str, partitioned: bool, now: float
    ) -> tuple[DeviceProcess, ...]:
        procs = []
        live = set()
        with self._lock:
            for entry in listed:
                pid = number(entry.get("pid"))
                if pid is None:
                    continue
                key = (uuid, int(pid))
                live.add(key)
                memory = entry.get("memory_usage")
                vram = number(memory.get("vram_mem")) if isinstance(memory, dict) else None
                engine = entry.get("engine_usage")
                gfx = number(engine.get("gfx")) if isinstance(engine, dict) else None
                seen = self._seen.get(key)
                share = None
                if seen is not None and seen.gfx_ns is not None and gfx is not None:
                    window = now - seen.at
                    if window > 0 and gfx >= seen.gfx_ns:
                        share = min(1.0, (gfx - seen.gfx_ns) / (window * 1e9))
                self._seen[key] = _Seen(now, gfx)
                procs.append(
                    DeviceProcess(
                        pid=int(pid),
                        used_memory_bytes=int(vram) if vram is not None else None,
                        utilization_ratio=share,
                        partition_uuid=uuid if partitioned else "",
                    )
                )
            for key in [k for k in self._seen if k[0] == uuid and k not in live]:
                del self._seen[key]  # gone: a PID reused later starts afresh
        return tuple(procs)
