"""The GPU source: NVML devices -> `GpuSnapshot` records.

Lifecycle: `start` initializes NVML, discovers the GPUs and starts the sampler and XID
threads; `read` (on every scrape) reads each GPU's current state and merges in what the
threads accumulated. One lost GPU yields `up=False` for that GPU alone.

Per-second figures (`NvidiaReading.pcie_transmit_bytes_per_second`, `..._receive_...`,
`nvlink_bytes_per_second`) are the source's own: where a GPU has byte counters (NVLink's
data throughput fields; PCIe's fields 197/198, driver R555+) the counters' increase since
this source's previous read of that GPU, divided by the time between the two reads (the
source's last window: the time between two collections, which scrapes share); where the
sampler integrates PCIe throughput instead, its latest 20 ms reading (`GpuIntegrals`). None
on a GPU's first read, after a counter went back (a driver reload) and without a source;
computed only where `GpuConfig.per_second_figures` asks (--dcgm-compat, their one reader).

Every per-GPU NVML call goes through that GPU's gate (agent/accelerators/gate.py): the GPUs are read
in parallel, each on its own worker thread, and `read` waits for them up to one read
deadline (`GpuConfig.read_deadline`). A GPU whose call is blocked past it reads `up=False`
with its stuck time while the others are fresh; a GPU fenced after a fatal XID reads
`up=False` with that XID and is not called at all (the sampler probes it with backoff).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

from gpuscope.agent.accelerators.gate import DEFAULT_DEADLINE, Blocked, GpuGates, Job
from gpuscope.agent.accelerators.records import unknown_identity
from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.gpu import device as dev
from gpuscope.agent.gpu.nvml import GpuLost, Nvml, NvmlCallError, text
from gpuscope.agent.gpu.processes import ProcessReader
from gpuscope.agent.gpu.records import (
    VENDOR,
    GpuIdentity,
    GpuIntegrals,
    GpuReading,
    GpuSnapshot,
    GpuTopology,
    NvidiaSnapshot,
    nvidia,
)
from gpuscope.agent.gpu.sampler import Sampler
from gpuscope.agent.gpu.topology import read_fabric, read_topology
from gpuscope.agent.gpu.xid import XidWatcher

log = logging.getLogger("gpuscope.gpu")

_Found = tuple[dev.Device, GpuReading]  # a GPU identified late, and its first reading


class _Counters:
    """Each GPU's byte counters at this source's previous read, for the per-second figures
    (module docstring). Each GPU's reads run one at a time on its own worker, so each key
    is written by one thread at a time."""

    def __init__(self) -> None:
        # uuid -> (monotonic, counted PCIe TX, counted PCIe RX, NVLink TX + RX)
        self._last: dict[str, tuple[float, float | None, float | None, float | None]] = {}

    def with_rates(self, reading: GpuReading, integrals: GpuIntegrals, now: float) -> GpuReading:
        uuid = reading.identity.uuid
        if not uuid:
            return reading
        # PCIe totals the sampler integrates are not counters: their per-second figure is
        # the sampler's own latest reading.
        counted_tx = reading.pcie_transmit_bytes if integrals.pcie_transmit_bytes is None else None
        counted_rx = reading.pcie_receive_bytes if integrals.pcie_receive_bytes is None else None
        tx_rx = (reading.link_transmit_bytes, reading.link_receive_bytes)
        nvlink = None if None in tx_rx else float(sum(v for v in tx_rx if v is not None))
        now_values = (counted_tx, counted_rx, nvlink)
        before = self._last.get(uuid)
        self._last[uuid] = (now, *now_values)

        def per_second(i: int) -> float | None:
            value = now_values[i]
            if before is None or value is None or before[i + 1] is None or now <= before[0]:
                return None
            previous = before[i + 1]
            assert previous is not None
            return (value - previous) / (now - before[0]) if value >= previous else None

        x = nvidia(reading)
        tx = integrals.pcie_transmit_rate if counted_tx is None else per_second(0)
        rx = integrals.pcie_receive_rate if counted_rx is None else per_second(1)
        extension = replace(
            x,
            pcie_transmit_bytes_per_second=tx,
            pcie_receive_bytes_per_second=rx,
            nvlink_bytes_per_second=per_second(2),
        )
        return replace(reading, extension=extension)


@dataclass(frozen=True, slots=True)
class GpuConfig:
    """The GPU source's settings, from the `gpu` collector's flags and the host's sysfs
    (agent/gpu/collector.py)."""

    sample_interval: float = 1.0
    idle_threshold: float = 0.0
    sysfs: Path = Path("/sys")
    background: bool = True  # False: tests drive `sampler.tick()` themselves
    read_deadline: float = DEFAULT_DEADLINE  # seconds one GPU's read may take (gate.py)
    # The per-second throughputs (module docstring): about 11 us a GPU a collection, for
    # --dcgm-compat alone, so computed only when it is on.
    per_second_figures: bool = False


class GpuSource:
    name = "gpu"

    def __init__(
        self, config: GpuConfig | None = None, clock: Clock | None = None, nvml: Nvml | None = None
    ) -> None:
        self.config = config or GpuConfig()
        self.clock = clock or SystemClock()
        self.nvml = nvml or Nvml()
        self.gates = GpuGates(self.nvml, self.clock, self.config.read_deadline)
        self.devices: list[dev.Device] = []
        self._undiscovered: list[int] = []
        self.sampler: Sampler | None = None
        self.xid: XidWatcher | None = None
        self.processes = ProcessReader(self.nvml, self.clock)
        self._counters = _Counters()
        self.topology = GpuTopology()
        self.driver_version = ""
        self.cuda_driver_version = ""
        self.nvml_version = ""

    def start(self) -> None:
        # Fresh gates for each session: a stopped source's workers are gone.
        self.gates = GpuGates(self.nvml, self.clock, self.config.read_deadline)
        self.nvml.init()
        try:
            self._discover()
        except Exception:
            self.nvml.shutdown()
            raise
        self.sampler = Sampler(
            self.nvml,
            self.devices,
            self.clock,
            interval=self.config.sample_interval,
            idle_threshold=self.config.idle_threshold,
            gates=self.gates,
        )
        self.xid = XidWatcher(
            self.nvml, self.devices, clock=self.clock, run=self.gates.run, on_fatal=self._fatal
        )
        self.topology = read_topology(self.nvml, self.devices, self.gates.run)
        if self.config.background:
            self.sampler.start()
        else:
            self.sampler.tick()
        self.xid.start()
        log.info(
            "NVML %s, driver %s: %d GPU(s)%s",
            self.nvml_version,
            self.driver_version,
            len(self.devices),
            f", {len(self._undiscovered)} not answering" if self._undiscovered else "",
        )

    def _discover(self) -> None:
        """Identify every GPU, all at once through their gates: one that does not answer
        within the deadline is left for later collections to find."""
        nvml = self.nvml
        self.driver_version = text(nvml.query("nvmlSystemGetDriverVersion") or "")
        self.nvml_version = text(nvml.query("nvmlSystemGetNVMLVersion") or "")
        cuda = nvml.query("nvmlSystemGetCudaDriverVersion")
        self.cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else ""
        count = int(nvml.call("nvmlDeviceGetCount"))
        self.devices = []
        self._undiscovered = []
        deadline_at = self.gates.deadline_at()
        begun = [
            (i, self.gates.gate(i).begin(partial(self._identify, i), deadline_at))
            for i in range(count)
        ]
        for index, job in begun:
            found = job.wait(deadline_at) if isinstance(job, Job) else job
            if isinstance(found, dev.Device):
                self._add(found)
                continue
            why = _blocked_text(found) if isinstance(found, Blocked) else str(found)
            log.warning("GPU %d does not answer: %s", index, why)
            self._undiscovered.append(index)

    def _identify(self, index: int) -> dev.Device | Exception:
        """(On the GPU's worker.) Its identity, or the NVML error that denied it."""
        try:
            return dev.discover(self.nvml, index, self.config.sysfs)
        except (GpuLost, NvmlCallError) as exc:
            return exc

    def _add(self, device: dev.Device) -> None:
        self.gates.of(device)  # the gate learns the UUID it logs
        # A new list, swapped in: the labels thread may be iterating the old one.
        self.devices = sorted([*self.devices, device], key=lambda d: d.identity.index)
        if device.identity.index in self._undiscovered:
            self._undiscovered.remove(device.identity.index)

    def read(self) -> GpuSnapshot:
        integrals = self.sampler.integrals() if self.sampler is not None else {}
        empty = GpuIntegrals()
        deadline_at = self.gates.deadline_at()
        reads = []
        for device in self.devices:
            xids = self.xid.counts(device.identity.uuid) if self.xid is not None else {}
            work = partial(self._read, device, integrals.get(device.identity.uuid, empty), xids)
            reads.append((device, xids, self.gates.of(device).begin(work, deadline_at)))
        finds = [
            (i, self.gates.gate(i).begin(partial(self._find, i), deadline_at))
            for i in list(self._undiscovered)
        ]
        readings: list[GpuReading] = []
        for device, xids, job in reads:
            got = job.wait(deadline_at) if isinstance(job, Job) else job
            if isinstance(got, Blocked):
                got = _blocked_reading(device.down(xids, got.fenced_xid), got)
            readings.append(got)
        readings.extend(self._found(finds, deadline_at))
        readings.sort(key=lambda r: r.identity.index)
        return GpuSnapshot(
            vendor=VENDOR,
            driver_version=self.driver_version,
            library_version=self.nvml_version,
            gpus=tuple(readings),
            extension=NvidiaSnapshot(
                cuda_driver_version=self.cuda_driver_version,
                topology=self.topology,
                xid_watched=frozenset(self.xid.watched) if self.xid is not None else None,
            ),
            processes_refused=frozenset(
                u for u, ok in dict(self.processes.readable).items() if not ok
            ),
        )

    def _read(
        self, device: dev.Device, integrals: GpuIntegrals, xids: Mapping[int, int]
    ) -> GpuReading:
        """(On the GPU's worker.) Everything about one GPU, its processes and per-second
        figures included."""
        now = self.clock.monotonic()
        reading = dev.read(self.nvml, device, integrals, xids)
        if not reading.up:
            return reading
        reading = self._with_processes(device, reading)
        if not self.config.per_second_figures:
            return reading
        return self._counters.with_rates(reading, integrals, now)

    def _find(self, index: int) -> _Found | Exception:
        """(On the GPU's worker.) A GPU that did not answer before: identified, registered
        for XID events and read, or the NVML error that still denies it."""
        found = self._identify(index)
        if isinstance(found, Exception):
            return found
        if self.xid is not None:
            self.xid.watch(found)  # runs inline: we are on this GPU's worker already
        return found, self._read(found, GpuIntegrals(), {})

    def _found(
        self, finds: list[tuple[int, Job[_Found | Exception] | Blocked]], deadline_at: float
    ) -> list[GpuReading]:
        """The readings of GPUs not identified before: found now, or still unknown."""
        readings = []
        added = False
        for index, job in finds:
            got = job.wait(deadline_at) if isinstance(job, Job) else job
            if isinstance(got, tuple):
                device, reading = got
                self._add(device)
                readings.append(reading)
                added = True
            elif isinstance(got, Blocked):
                down = dev.down_reading(_unknown(index), "", {}, got.fenced_xid)
                readings.append(_blocked_reading(down, got))
            else:
                readings.append(GpuReading(identity=_unknown(index), up=False))
        if added:
            if self.sampler is not None:
                self.sampler.set_devices(self.devices)
            # PCIe pairs and NVLink peers of the newcomers (and with them): read at start
            # only for the GPUs that answered then (labels say gpu.interconnect from these).
            self.topology = read_topology(self.nvml, self.devices, self.gates.run)
        return readings

    def lost_devices(self) -> frozenset[str]:
        """(DeviceWatch.) The GPUs the sampler found lost, without an NVML call."""
        sampler = self.sampler
        return sampler.lost() if sampler is not None else frozenset()

    def refresh_topology(self) -> None:
        """(DeviceWatch.) Read every GPU's fabric registration again (the labels loop calls
        this each round): it can complete, or degrade, long after the agent started. A GPU
        that does not answer keeps what was known; before NVML is up, nothing to read."""
        if self.nvml.initialized and self.devices:
            fabric = read_fabric(self.nvml, self.devices, self.gates.run, self.topology.fabric)
            self.topology = replace(self.topology, fabric=fabric)

    def _with_processes(self, device: dev.Device, reading: GpuReading) -> GpuReading:
        try:
            procs = self.processes.read(device, nvidia(reading).mig_instances)
        except GpuLost:
            return device.down(nvidia(reading).xid_errors)
        return replace(reading, processes=procs) if procs else reading

    def _fatal(self, uuid: str, xid: int) -> None:
        """(XID thread.) A fatal XID: stop calling that GPU but for probes."""
        self.gates.fence(uuid, xid)

    def stop(self) -> None:
        if self.xid is not None:
            self.xid.stop()
            self.xid = None
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        self.gates.close_then(self.nvml.shutdown)


def _blocked_reading(down: GpuReading, blocked: Blocked) -> GpuReading:
    """A GPU's down reading, saying how long and in which call it has been blocked."""
    return replace(down, stuck_seconds=blocked.stuck_seconds, stuck_call=blocked.function)


def _blocked_text(blocked: Blocked) -> str:
    if blocked.fenced_xid is not None:
        return f"fenced after XID {blocked.fenced_xid}"
    return f"stuck in {blocked.function or 'a call'} past the read deadline"


def _unknown(index: int) -> GpuIdentity:
    return unknown_identity(index, VENDOR)
