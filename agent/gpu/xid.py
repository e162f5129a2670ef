"""XID error counting from NVML's event stream.

dcgm-exporter exports the *last* XID as a gauge, so two XIDs between scrapes look like one
and a repeated XID looks like nothing. Here a thread blocks in `nvmlEventSetWait` and counts
every XID event as it arrives, so `gpuscope_gpu_xid_errors_total{xid}` is exact: `increase()`
over any window is the number of XIDs in it.

A few XIDs mean the driver can no longer be trusted to answer for that GPU (`FATAL_XIDS`):
after one, the watcher tells its owner (`on_fatal`), which fences the GPU's gate
(agent/accelerators/gate.py) so that no call can block on it, as DCGM stops calling a GPU after
XID 119.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import threading
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from gpuscope.agent.accelerators.gate import Blocked, RunOnGpu, direct
from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.gpu import xid_catalog
from gpuscope.agent.gpu.nvml import TIMEOUT, GpuLost, Nvml, NvmlCallError

if TYPE_CHECKING:
    from gpuscope.agent.gpu.device import Device

log = logging.getLogger("gpuscope.gpu.xid")

NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
WAIT_MS = 500
LOG_EVERY = 60.0  # seconds between log lines for repeats of one XID on one GPU

# XIDs after which the GPU is not called (fenced: a cheap probe with backoff only). Each means
# the driver's link to the GPU itself is gone, so a call may block for as long as the driver's
# own timeout (45 s per GSP RPC) or for ever, and nothing a call returns can be trusted:
#   79  GPU_HAS_FALLEN_OFF_THE_BUS: the GPU is not reachable over PCIe;
#   119 GSP_RPC_TIMEOUT: the GPU System Processor stopped answering the driver's RPCs;
#   120 GSP_ERROR: the GSP firmware faulted.
# DCGM's health check counts others as fatal too (48 double-bit ECC, 74 NVLink, 94/95
# contained/uncontained ECC, 140 unrecovered ECC), but after those the driver still answers,
# and what it answers (ECC counters, row remapping, NVLink state) is what an operator needs
# to decide on the reset: they are counted, not fenced.
FATAL_XIDS: frozenset[int] = xid_catalog.FATAL_XIDS  # the list lives in xid_catalog.py


def handle_address(handle: Any) -> int:
    """An NVML handle is an opaque pointer; its address identifies the device."""
    return int(ctypes.cast(handle, ctypes.c_void_p).value or 0)


class XidWatcher:
    """Counts XID events per GPU. `watched` holds the UUIDs whose registration the driver
    accepted: only those can count XIDs, and the exporter says which they are."""

    def __init__(
        self,
        nvml: Nvml,
        devices: Sequence[Device],
        *,
        clock: Clock | None = None,
        run: RunOnGpu = direct,
        on_fatal: Callable[[str, int], None] | None = None,
    ) -> None:
        self._nvml = nvml
        self._on_gpu = run  # registration calls go through the GPU's gate
        self._on_fatal = on_fatal
        self._by_address: dict[int, str] = {}
        self._counts: dict[str, Counter[int]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._event_set: Any = None
        self._devices = list(devices)
        self._clock = clock or SystemClock()
        self._logged: dict[tuple[str, int], tuple[float, int]] = {}  # (uuid, xid): at, unlogged
        self._wait_error: str | None = None
        self.watched: set[str] = set()

    def start(self) -> None:
        """Register every GPU that supports XID events and start the waiting thread."""
        try:
            self._event_set = self._nvml.call("nvmlEventSetCreate")
        except (NvmlCallError, GpuLost) as exc:
            log.warning("XID events unavailable: %s", exc)
            return
        for device in self._devices:
            self._register(device)
        if not self.watched:
            log.info("no GPU accepted XID events; gpuscope_gpu_xid_errors_total is not exported")
        self._start_thread()

    def watch(self, device: Device) -> None:
        """Register a GPU found after start (one that did not answer at first)."""
        if self._event_set is None or device.identity.uuid in self.watched:
            return
        if self._register(device):
            self._start_thread()

    def _register(self, device: Device) -> bool:
        uuid = device.identity.uuid
        with self._lock:
            self._by_address[handle_address(device.handle)] = uuid
            self._counts.setdefault(uuid, Counter())
        registered = self._on_gpu(device, partial(self._register_calls, device))
        if isinstance(registered, Blocked):
            log.warning(
                "GPU %d: XID events not registered: it does not answer", device.identity.index
            )
            return False
        if registered:
            self.watched.add(uuid)
        return registered

    def _register_calls(self, device: Device) -> bool:
        nvml = self._nvml
        try:
            supported = nvml.query("nvmlDeviceGetSupportedEventTypes", device.handle)
            if supported is not None and not supported & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
                log.info("GPU %d does not report XID events", device.identity.index)
                return False
            nvml.call(
                "nvmlDeviceRegisterEvents",
                device.handle,
                NVML_EVENT_TYPE_XID_CRITICAL_ERROR,
                self._event_set,
            )
        except (NvmlCallError, GpuLost) as exc:
            log.warning("GPU %d: XID events not registered: %s", device.identity.index, exc)
            return False
        return True

    def _start_thread(self) -> None:
        if self._thread is not None or not self.watched:
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
                    self._wait_failed(str(exc))
                    self._stop.wait(1.0)  # e.g. a GPU in the set fell off the bus
                continue
            except GpuLost as exc:
                self._wait_failed(str(exc))
                self._stop.wait(1.0)
                continue
            except Exception as exc:  # noqa: BLE001 - the thread must outlive any error
                self._wait_failed(f"{type(exc).__name__}: {exc}")
                self._stop.wait(1.0)
                continue
            if self._wait_error is not None:
                log.info("XID event wait recovered")
                self._wait_error = None
            self._record(data)

    def _wait_failed(self, error: str) -> None:
        """One line per change of error, not one a second while a GPU stays lost."""
        if error != self._wait_error:
            log.warning("XID event wait: %s (retrying every second)", error)
        self._wait_error = error

    def _record(self, data: Any) -> None:
        if not int(data.eventType) & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
            return
        uuid = self._by_address.get(handle_address(data.device))
        if uuid is None:
            return
        xid = int(data.eventData)
        with self._lock:
            self._counts[uuid][xid] += 1
        self._log_xid(uuid, xid)
        if xid in FATAL_XIDS and self._on_fatal is not None:
            try:
                self._on_fatal(uuid, xid)
            except Exception:
                log.exception("fencing GPU %s after XID %d failed", uuid, xid)

    def _log_xid(self, uuid: str, xid: int) -> None:
        """The first XID of a kind on a GPU is logged at once; the rest at most once per
        LOG_EVERY seconds with how many came since: an XID storm must not flood the log
        (every one is counted in gpuscope_gpu_xid_errors_total)."""
        now = self._clock.monotonic()
        at, unlogged = self._logged.get((uuid, xid), (None, 0))
        if at is not None and now - at < LOG_EVERY:
            self._logged[(uuid, xid)] = (at, unlogged + 1)
            return
        self._logged[(uuid, xid)] = (now, 0)
        more = f" ({unlogged} more since the last line)" if unlogged else ""
        log.warning("XID %d on GPU %s%s", xid, uuid, more, extra={"uuid": uuid, "xid": xid})

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self._event_set is not None:
            with contextlib.suppress(GpuLost):
                self._nvml.query("nvmlEventSetFree", self._event_set)
            self._event_set = None
