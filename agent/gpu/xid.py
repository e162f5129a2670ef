"""XID error counting from NVML's event stream.

dcgm-exporter exports the *last* XID as a gauge, so two XIDs between scrapes look like one
and a repeated XID looks like nothing. Here a thread blocks in `nvmlEventSetWait` and counts
every XID event as it arrives, so `gpuscope_gpu_xid_errors_total{xid}` is exact: `increase()`
over any window is the number of XIDs in it.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from gpuscope.agent.gpu.device import Device
from gpuscope.agent.gpu.nvml import TIMEOUT, GpuLost, Nvml, NvmlCallError

log = logging.getLogger("gpuscope.gpu.xid")

NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
WAIT_MS = 500


def handle_address(handle: Any) -> int:
    """An NVML handle is an opaque pointer; its address identifies the device."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class XidWatcher:
    def __init__(self, nvml: Nvml, devices: Sequence[Device]) -> None:
        self._nvml = nvml
        self._by_address = {handle_address(d.handle): d.identity.uuid for d in devices}
        self._devices = list(devices)
        self._counts: dict[str, Counter[int]] = {d.identity.uuid: Counter() for d in devices}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self.watched: set[str] = set()

    def start(self) -> None:
        """Register every GPU that supports XID events and start the waiting thread."""
        nvml = self._nvml
        try:
            self._event_set = nvml.call("nvmlEventSetCreate")
        except (NvmlCallError, GpuLost) as exc:
            log.warning("XID events unavailable: %s", exc)
            return
        for device in self._devices:
            try:
                supported = nvml.query("nvmlDeviceGetSupportedEventTypes", device.handle)
                if supported is not None and not supported & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                    continue
                nvml.query(
                    "nvmlDeviceRegisterEvents",
                    device.handle,
                    NVML_EVENT_TYPE_XID_CRITICAL_ERROR,
                    self._event_set,
                )
            except GpuLost:
                continue
            self.watched.add(device.identity.uuid)
        if not self.watched:
            log.info("no GPU supports XID events; gpuscope_gpu_xid_errors_total is not exported")
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="gpu-xid-events", daemon=True)
        self._thread.start()

    def counts(self, uuid: str) -> Mapping[int, int]:
        with self._lock:
            counter = self._counts.get(uuid)
            return MappingProxyType(dict(counter)) if counter else MappingProxyType({})

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data = self._nvml.call(
                    "nvmlEventSetWait_v2", self._event_set, WAIT_MS, expected=frozenset({TIMEOUT})
                )
            except NvmlCallError as exc:
                if exc.code != TIMEOUT:
                    self._stop.wait(1.0)  # e.g. a GPU in the set fell off the bus
                continue
            except GpuLost as exc:
                log.warning("XID event wait: %s", exc)
                self._stop.wait(1.0)
                continue
            except Exception:
                log.exception("XID event wait failed")
                time.sleep(1.0)
                continue
            self._record(data)

    def _record(self, data: Any) -> None:
        if not int(data.eventType) & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
            return
        uuid = self._by_address.get(handle_address(data.device))
        if uuid is None:
            return
        xid = int(data.eventData)
        with self._lock:
            self._counts[uuid][xid] += 1
        log.warning("XID %d on GPU %s", xid, uuid, extra={"uuid": uuid, "xid": xid})

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._event_set is not None:
            with contextlib.suppress(GpuLost):
                self._nvml.query("nvmlEventSetFree", self._event_set)
            self._event_set = None
