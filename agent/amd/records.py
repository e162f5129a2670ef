"""AMD's records: the accelerator contract (agent/accelerators/records.py) filled from AMD
SMI, with what only AMD has in its extensions.

A GPU here is one OAM package (an AMD SMI *socket*): what the node's `lspci`, the power
and the HBM belong to. A compute-partitioned MI300X is several AMD SMI processors (one per
XCP); they are the contract's `partitions` of that GPU, each with the names AMD's device
plugin gives them, as NVIDIA's MIG devices are. An MI250X's two GCDs are two GPUs: each is
its own PCI function and its own device to the OS and to the device plugin.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuscope.agent.accelerators.records import AcceleratorReading, AcceleratorSnapshot

VENDOR = "amd"
INTERCONNECT = "xgmi"


@dataclass(frozen=True, slots=True)
class AmdReading:
    """What only AMD SMI tells about one GPU.

    `package` is the OAM package (asic_info's oam_id): an MI250X's two GCDs, two GPUs to the
    OS, share one. `gfx_target` is the ISA (gfx942), what ROCm builds code for: AMD's
    counterpart of a compute capability. `compute_partition` / `memory_partition` are the
    modes (SPX, CPX; NPS1, NPS4), "" where the library does not say. `bad_pages` counts
    retired pages by status (retired, pending, unreservable): AMD's counterpart of row
    remapping. `events` counts the library's event notifications by type since the agent
    started, losslessly. `throttle_seconds` is time spent throttled by reason, from the
    firmware's residency accumulators (MI300 and later); `activity_source` says how busy
    seconds were measured: "accumulator" (the firmware's own integral) or "sampled"
    (activity read each tick)."""

    socket: int
    gfx_target: str = ""
    device_id: int | None = None
    package: int | None = None
    compute_units: int | None = None
    compute_partition: str = ""
    memory_partition: str = ""
    bad_pages: Mapping[str, int] = field(default_factory=dict)
    events: Mapping[str, int] = field(default_factory=dict)
    throttle_seconds: Mapping[str, float] = field(default_factory=dict)
    activity_source: str = ""
    pcie_recoveries: int | None = None


@dataclass(frozen=True, slots=True)
class GpuLink:
    """How two GPUs reach each other (amdsmi_topo_get_link_type): `kind` xgmi, pcie or
    internal (two partitions of one GPU), and the hops between them (1: a direct link)."""

    kind: str
    hops: int


@dataclass(frozen=True, slots=True)
class AmdSnapshot:
    """What AMD SMI tells about the node: the bindings' version, whether the event
    notifications are being watched (None before the watcher started or where the library
    delivers none), and the GPU x GPU links by (index, index), read at start."""

    bindings_version: str = ""
    events_watched: frozenset[str] | None = None
    links: Mapping[tuple[int, int], GpuLink] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AmdGpuReading(AcceleratorReading[AmdReading]):
    """An AMD GPU's reading as the source builds it: the contract's fields, AMD's in
    `extension`. Code that reads one takes an `AmdGpu` (what `AmdGpus.gpus` holds)."""


AmdGpu = AcceleratorReading[AmdReading]


@dataclass(frozen=True, slots=True)
class AmdGpus(AcceleratorSnapshot[AmdReading, AmdSnapshot]):
    """The AMD GPUs of the node: the contract's snapshot, AMD's facts in `extension`."""


def amd(reading: AcceleratorReading[Any]) -> AmdReading:
    """A reading's AMD extension (a down GPU that was never read has an empty one)."""
    x = reading.extension
    return x if isinstance(x, AmdReading) else AmdReading(socket=-1)


def node(snapshot: AcceleratorSnapshot[Any, Any]) -> AmdSnapshot:
    x = snapshot.extension
    return x if isinstance(x, AmdSnapshot) else AmdSnapshot()
