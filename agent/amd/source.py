"""The AMD source: AMD SMI processors -> the accelerator contract (`AmdGpus` records).

Lifecycle as NVIDIA's (agent/gpu/source.py): `start` initialises AMD SMI, discovers the
GPUs (one per socket) and starts the sampler and event threads; `read` reads each GPU's
state through its gate, in parallel, and merges in what the threads accumulated. A GPU
whose call blocks past the read deadline reads `up=False` with its stuck time and the
function it is in, and is not called again until that call returns
(agent/accelerators/gate.py); the other GPUs are read as usual.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from gpuscope.agent.accelerators.gate import DEFAULT_DEADLINE, Blocked, GpuGates, Job
from gpuscope.agent.amd import device as dev
from gpuscope.agent.amd.events import EventWatcher
from gpuscope.agent.amd.library import AmdSmi, AmdSmiCallError
from gpuscope.agent.amd.processes import ProcessReader
from gpuscope.agent.amd.records import VENDOR, AmdGpu, AmdGpus, AmdSnapshot, GpuLink
from gpuscope.agent.amd.sampler import Sampler
from gpuscope.agent.clock import Clock, SystemClock

log = logging.getLogger("gpuscope.amd")


@dataclass(frozen=True, slots=True)
class AmdConfig:
    """The AMD source's settings, from the `amd` collector's flags and the host's sysfs
    (agent/amd/collector.py)."""

    sample_interval: float = 1.0
    idle_threshold: float = 0.0
    sysfs: Path = Path("/sys")
    background: bool = True  # False: tests drive `sampler.tick()` and `events.poll()`
    read_deadline: float = DEFAULT_DEADLINE


class AmdSource:
    name = "amd"

    def __init__(
        self, config: AmdConfig | None = None, clock: Clock | None = None, lib: AmdSmi | None = None
    ) -> None:
        self.config = config or AmdConfig()
        self.clock = clock or SystemClock()
        self.lib = lib or AmdSmi()
        self.gates = GpuGates(self.lib, self.clock, self.config.read_deadline)
        self.devices: list[dev.Device] = []
        self.sampler: Sampler | None = None
        self.events: EventWatcher | None = None
        self.processes = ProcessReader(self.lib, self.clock)
        self.driver_version = ""
        self.library_version = ""
        self._lost: set[str] = set()
        # Sockets whose GPU did not answer at discovery: retried on each read until it does.
        self._pending: dict[int, list[Any]] = {}
        self.links: dict[tuple[int, int], GpuLink] = {}

    def start(self) -> None:
        self.gates = GpuGates(self.lib, self.clock, self.config.read_deadline)
        self.lib.init()
        try:
            self._discover()
        except Exception:
            self.lib.shutdown()
            raise
        self.sampler = Sampler(
            self.lib,
            self.devices,
            self.clock,
            self.gates,
            interval=self.config.sample_interval,
            idle_threshold=self.config.idle_threshold,
        )
        self.sampler.tick()  # counters start at the first answer
        self.events = EventWatcher(self.lib, self.devices, self.config.sample_interval)
        self.events.start(background=self.config.background)
        if self.config.background:
            self.sampler.start()
        partitions = sum(len(d.processors) for d in self.devices)
        log.info(
            "AMD SMI %s, driver %s: %d GPU(s)%s",
            self.library_version or "(version unknown)",
            self.driver_version or "(unknown)",
            len(self.devices),
            f", {partitions} partitions" if partitions > len(self.devices) else "",
        )

    def _discover(self) -> None:
        lib = self.lib
        self.library_version = lib.library_version
        self.devices = []
        self._pending = {}
        xcp_names = dev.xcp_devices(self.config.sysfs)
        for index, handles in enumerate(dev.processors_by_socket(lib)):
            if not handles:
                continue
            try:
                found = dev.discover(lib, index, handles, self.config.sysfs, xcp_names)
                self.devices.append(found)
            except AmdSmiCallError as exc:
                log.warning("AMD GPU %d does not answer: %s; retried each collection", index, exc)
                self._pending[index] = handles
        if self.devices:
            driver = lib.query("amdsmi_get_gpu_driver_info", self.devices[0].primary) or {}
            text = str(driver.get("driver_version", ""))
            self.driver_version = "" if text == "N/A" else text
        for d in self.devices:
            self.gates.of(d)
        self.links = read_links(lib, self.devices)

    def read(self) -> AmdGpus:
        self._find_pending()
        integrals = self.sampler.integrals() if self.sampler is not None else {}
        deadline_at = self.gates.deadline_at()
        begun = []
        for d in self.devices:
            events = self.events.counts(d.identity.uuid) if self.events is not None else {}
            got = integrals.get(d.identity.uuid, dev.Integrals())
            work = partial(self._read, d, got, events)
            begun.append((d, events, self.gates.of(d).begin(work, deadline_at)))
        readings: list[AmdGpu] = []
        for d, events, job in begun:
            got_reading: Any = job.wait(deadline_at) if isinstance(job, Job) else job
            if isinstance(got_reading, Blocked):
                down = dev.down_reading(d, events)
                got_reading = replace(
                    down, stuck_seconds=got_reading.stuck_seconds, stuck_call=got_reading.function
                )
            readings.append(got_reading)
        # Not identified yet: its position is known, nothing else (gpu.count stays right).
        readings += [dev.unknown_reading(index) for index in sorted(self._pending)]
        readings.sort(key=lambda r: r.identity.index)
        self._lost = {r.identity.uuid for r in readings if not r.up and r.identity.uuid}
        return AmdGpus(
            vendor=VENDOR,
            driver_version=self.driver_version,
            library_version=self.library_version,
            gpus=tuple(readings),
            extension=AmdSnapshot(
                bindings_version=self.lib.bindings_version,
                events_watched=self.events.watched if self.events is not None else None,
                links=self.links,
            ),
            processes_refused=frozenset(self.processes.refused),
        )

    def _find_pending(self) -> None:
        """Identify, through its gate, each GPU that did not answer before; a found one is
        sampled from now on (its event notifications are not: registered at start only)."""
        if not self._pending:
            return
        deadline_at = self.gates.deadline_at()
        for index, handles in list(self._pending.items()):
            work = partial(dev.discover, self.lib, index, handles, self.config.sysfs)
            job = self.gates.gate(index).begin(work, deadline_at)
            try:
                found = job.wait(deadline_at) if isinstance(job, Job) else job
            except AmdSmiCallError:
                continue
            if isinstance(found, dev.Device):
                del self._pending[index]
                self.devices = sorted([*self.devices, found], key=lambda d: d.identity.index)
                self.gates.of(found)
                if self.sampler is not None:
                    self.sampler.set_devices(self.devices)
                log.info("AMD GPU %d answers: %s", index, found.identity.uuid)

    def _read(self, device: dev.Device, integrals: dev.Integrals, events: Any) -> AmdGpu:
        """(On the GPU's worker.) Everything about one GPU, its processes included."""
        try:
            procs = self.processes.read(device)
        except AmdSmiCallError as exc:
            log.debug("%s processes: %s", device.identity.pci_bus_id, exc)
            procs = ()
        return dev.read(self.lib, device, integrals, events, procs)

    def lost_devices(self) -> frozenset[str]:
        """(DeviceWatch.) The GPUs the last read found down, without a library call."""
        return frozenset(self._lost)

    def refresh_topology(self) -> None:
        """(DeviceWatch.) Nothing changes after start that AMD SMI reports: XGMI links are
        trained at boot (their state is read on every collection)."""

    def stop(self) -> None:
        if self.events is not None:
            self.events.stop()
            self.events = None
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        self.gates.close_then(self.lib.shutdown)


# amdsmi_io_link_type_t (amdsmi.h); the bindings return the number.
LINK_KINDS = {0: "internal", 1: "pcie", 2: "xgmi"}


def read_links(lib: AmdSmi, devices: list[dev.Device]) -> dict[tuple[int, int], GpuLink]:
    """Every ordered pair of GPUs: how they are joined. A pair the library cannot tell is
    left out (the labels then say nothing about it), never guessed."""
    links: dict[tuple[int, int], GpuLink] = {}
    for a in devices:
        for b in devices:
            if a is b:
                continue
            try:
                got = lib.query("amdsmi_topo_get_link_type", a.primary, b.primary)
            except AmdSmiCallError as exc:
                log.debug("link %d-%d: %s", a.identity.index, b.identity.index, exc)
                continue
            if not got:
                continue
            kind = LINK_KINDS.get(_int(got.get("type")), "")
            hops = _int(got.get("hops"))
            if kind and hops >= 0:
                links[(a.identity.index, b.identity.index)] = GpuLink(kind, hops)
    return links


def _int(value: Any) -> int:
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else -1
