"""The GPU source: NVML devices -> `GpuSnapshot` records.

Lifecycle: `start` initializes NVML, discovers the GPUs and starts the sampler and XID
threads; `collect` (on every scrape) reads each GPU's current state and merges in what the
threads accumulated. One lost GPU yields `up=False` for that GPU alone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.gpu import device as dev
from gpuscope.agent.gpu.nvml import GpuLost, Nvml, NvmlCallError, text
from gpuscope.agent.gpu.processes import ProcessReader
from gpuscope.agent.gpu.records import (
    GpuIdentity,
    GpuIntegrals,
    GpuReading,
    GpuSnapshot,
    GpuTopology,
)
from gpuscope.agent.gpu.sampler import Sampler
from gpuscope.agent.gpu.topology import read_fabric, read_topology
from gpuscope.agent.gpu.xid import XidWatcher

log = logging.getLogger("gpuscope.gpu")


@dataclass(frozen=True, slots=True)
class GpuConfig:
    sample_interval: float = 1.0
    idle_threshold: float = 0.0
    sysfs: Path = Path("/sys")
    background: bool = True  # False: tests drive `sampler.tick()` themselves


class GpuSource:
    name = "gpu"

    def __init__(
        self, config: GpuConfig | None = None, clock: Clock | None = None, nvml: Nvml | None = None
    ) -> None:
        self.config = config or GpuConfig()
        self.clock = clock or SystemClock()
        self.nvml = nvml or Nvml()
        self.devices: list[dev.Device] = []
        self._undiscovered: list[int] = []
        self.sampler: Sampler | None = None
        self.xid: XidWatcher | None = None
        self.processes = ProcessReader(self.nvml, self.clock)
        self.topology = GpuTopology()
        self.driver_version = ""
        self.cuda_driver_version = ""
        self.nvml_version = ""

    def start(self) -> None:
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
        )
        self.xid = XidWatcher(self.nvml, self.devices, clock=self.clock)
        self.topology = read_topology(self.nvml, self.devices)
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
        nvml = self.nvml
        self.driver_version = text(nvml.query("nvmlSystemGetDriverVersion") or "")
        self.nvml_version = text(nvml.query("nvmlSystemGetNVMLVersion") or "")
        cuda = nvml.query("nvmlSystemGetCudaDriverVersion")
        self.cuda_driver_version = f"{cuda // 1000}.{cuda % 1000 // 10}" if cuda else ""
        count = int(nvml.call("nvmlDeviceGetCount"))
        self.devices = []
        self._undiscovered = []
        for index in range(count):
            self._discover_one(index)

    def _discover_one(self, index: int) -> bool:
        try:
            found = dev.discover(self.nvml, index, self.config.sysfs)
        except (GpuLost, NvmlCallError) as exc:
            if index not in self._undiscovered:
                log.warning("GPU %d does not answer: %s", index, exc)
                self._undiscovered.append(index)
            return False
        self.devices.append(found)
        self.devices.sort(key=lambda d: d.identity.index)
        if index in self._undiscovered:
            self._undiscovered.remove(index)
        return True

    def collect(self) -> GpuSnapshot:
        known = {d.identity.uuid for d in self.devices}
        found = [self._discover_one(i) for i in list(self._undiscovered)]
        if any(found):
            if self.sampler is not None:
                self.sampler.set_devices(self.devices)
            for device in self.devices:
                if self.xid is not None and device.identity.uuid not in known:
                    self.xid.watch(device)
        integrals = self.sampler.integrals() if self.sampler is not None else {}
        empty = GpuIntegrals()
        readings: list[GpuReading] = []
        for device in self.devices:
            uuid = device.identity.uuid
            xids = self.xid.counts(uuid) if self.xid is not None else {}
            reading = dev.read(self.nvml, device, integrals.get(uuid, empty), xids)
            if reading.up:
                reading = self._with_processes(device, reading)
            readings.append(reading)
        for index in self._undiscovered:
            readings.append(GpuReading(identity=_unknown(index), up=False))
        readings.sort(key=lambda r: r.identity.index)
        return GpuSnapshot(
            driver_version=self.driver_version,
            cuda_driver_version=self.cuda_driver_version,
            nvml_version=self.nvml_version,
            gpus=tuple(readings),
            topology=self.topology,
            xid_watched=frozenset(self.xid.watched) if self.xid is not None else None,
            processes_refused=frozenset(u for u, ok in self.processes.readable.items() if not ok),
        )

    def refresh_fabric(self) -> None:
        """Read every GPU's fabric registration again (the labels loop calls this each
        round): it can complete, or degrade, long after the agent started."""
        if self.devices:
            self.topology = replace(self.topology, fabric=read_fabric(self.nvml, self.devices))

    def _with_processes(self, device: dev.Device, reading: GpuReading) -> GpuReading:
        try:
            procs = self.processes.read(device, reading.mig_instances)
        except GpuLost:
            return GpuReading(identity=reading.identity, up=False, xid_errors=reading.xid_errors)
        return replace(reading, processes=procs) if procs else reading

    def stop(self) -> None:
        if self.xid is not None:
            self.xid.stop()
            self.xid = None
        if self.sampler is not None:
            self.sampler.stop()
            self.sampler = None
        self.nvml.shutdown()


def _unknown(index: int) -> GpuIdentity:
    return GpuIdentity(
        index=index,
        uuid="",
        model="",
        pci_bus_id="",
        serial="",
        architecture="unknown",
        compute_capability="",
        numa_node=None,
    )
