"""AMD SMI event notifications (GPU resets, thermal throttling, VM faults), counted per GPU
and type, losslessly, as NVIDIA's XIDs are (agent/gpu/xid.py).

The events are read from the wrapper's C entry point, not through `AmdSmiEventReader`:
in the 7.0.2 bindings `PAGE_FAULT_START` carries END's value, so the reader drops every
event of code 7 as unknown. Codes are named here from amdsmi.h.

The watcher polls with a zero timeout once a `poll_interval`, draining what the kernel
queued since (a batch at a time until the library returns fewer than asked): a call that
waited for events could hold the library's lock against the collection's own calls. The
kernel keeps the events of each registered GPU in a queue until they are read; one second
between drains is far inside what it holds.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gpuscope.agent.amd.library import AmdSmi, status_name

if TYPE_CHECKING:
    from gpuscope.agent.amd.device import Device

log = logging.getLogger("gpuscope.amd.events")

# amdsmi_evt_notification_type_t (amdsmi.h). The health events are watched; the others
# (migrations, queue evictions, process start and end) are the normal life of a job.
EVENT_NAMES: Mapping[int, str] = {
    1: "vm_fault",
    2: "thermal_throttle",
    3: "gpu_pre_reset",
    4: "gpu_post_reset",
    5: "migrate_start",
    6: "migrate_end",
    7: "page_fault_start",
    8: "page_fault_end",
    9: "queue_eviction",
    10: "queue_restore",
    11: "unmap_from_gpu",
    12: "process_start",
    13: "process_end",
}
WATCHED = (1, 2, 3, 4)
BATCH = 64
NO_DATA = (40, 8)  # AMDSMI_STATUS_NO_DATA, TIMEOUT: nothing queued


class EventWatcher:
    def __init__(self, lib: AmdSmi, devices: Sequence[Device], poll_interval: float = 1.0) -> None:
        self.lib = lib
        self.poll_interval = poll_interval
        self._by_handle: dict[int, str] = {}  # processor handle address -> GPU UUID
        for d in devices:
            for p in d.processors:
                address = _address(p.handle)
                if address is not None:
                    self._by_handle[address] = d.identity.uuid
        self._handles = [p.handle for d in devices for p in d.processors]
        self._registered: list[Any] = []
        self._counts: dict[str, Counter[str]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failing = ""
        # GPUs whose events are delivered; None where the library delivers none at all (a
        # release or part without event notification), so nothing is claimed either way.
        self.watched: frozenset[str] | None = None

    def start(self, background: bool = True) -> None:
        """Register every processor for the watched events; a GPU the library refuses is
        left unwatched (its events series say so), the others are watched."""
        wrapper = self.lib.module.amdsmi_wrapper
        mask = 0
        for code in WATCHED:
            mask |= 1 << (code - 1)
        watched = set()
        for handle in self._handles:
            status = int(wrapper.amdsmi_init_gpu_event_notification(handle))
            if status == 0:
                status = int(
                    wrapper.amdsmi_set_gpu_event_notification_mask(handle, ctypes.c_uint64(mask))
                )
                if status == 0:
                    self._registered.append(handle)
                    uuid = self._by_handle.get(_address(handle) or 0)
                    if uuid is not None:
                        watched.add(uuid)
                    continue
                wrapper.amdsmi_stop_gpu_event_notification(handle)
            log.info("AMD SMI events not watched on a processor: %s", status_name(status))
        self.watched = frozenset(watched) if self._registered else None
        if background and self._registered:
            self._thread = threading.Thread(target=self._run, name="amd-events", daemon=True)
            self._thread.start()

    def counts(self, uuid: str) -> Mapping[str, int]:
        with self._lock:
            counted = self._counts.get(uuid)
            return MappingProxyType(dict(counted)) if counted else MappingProxyType({})

    def _run(self) -> None:
        while not self._stop.wait(self.poll_interval):
            self.poll()

    def poll(self) -> int:
        """Drain the queued events; how many were counted."""
        if not self._registered:
            return 0
        wrapper = self.lib.module.amdsmi_wrapper
        total = 0
        while True:
            count = ctypes.c_uint32(BATCH)
            data = (wrapper.amdsmi_evt_notification_data_t * BATCH)()
            status = int(
                wrapper.amdsmi_get_gpu_event_notification(
                    ctypes.c_int(0), ctypes.byref(count), data
                )
            )
            if status in NO_DATA:
                break
            if status != 0:
                if self._failing != status_name(status):
                    self._failing = status_name(status)
                    log.warning("AMD SMI events: %s; retrying each poll", self._failing)
                break
            self._failing = ""
            with self._lock:
                for i in range(min(count.value, BATCH)):
                    entry = data[i]
                    uuid = self._by_handle.get(_address(entry.processor_handle) or 0)
                    if uuid is None:
                        continue
                    name = EVENT_NAMES.get(int(entry.event), f"event_{int(entry.event)}")
                    self._counts.setdefault(uuid, Counter())[name] += 1
                    total += 1
            if count.value < BATCH:
                break
        return total

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.poll_interval + 1)
            self._thread = None
        wrapper = self.lib.module.amdsmi_wrapper if self.lib.initialized else None
        for handle in self._registered:
            if wrapper is not None:
                wrapper.amdsmi_stop_gpu_event_notification(handle)
        self._registered = []


def _address(handle: Any) -> int | None:
    """A processor handle's address: the bindings' handles are c_void_p, the event
    records' a plain int."""
    if handle is None or isinstance(handle, int):
        return handle
    value = getattr(handle, "value", None)
    return value if isinstance(value, int) else None
