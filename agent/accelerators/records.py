"""The accelerator contract: one record for any vendor's GPUs, which attribution, node labels
and the exporters read without knowing whose they are.

Values are in base units (bytes, watts, hertz, joules, seconds, ratios 0-1), so exporters
never convert. `None` (or an empty mapping) means "this device does not report it": the
series is left out, never exported as 0. A vendor's source fills what its library reads;
what only one vendor has (NVIDIA's XIDs, GPM, MIG details, fabric, CUDA versions) travels
in the record's `extension`, typed by the vendor (`NvidiaReading`, agent/gpu/records.py),
and only that vendor's renderers read it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

X = TypeVar("X")  # a vendor's per-device extension
S = TypeVar("S")  # a vendor's per-node extension


@dataclass(frozen=True, slots=True)
class DeviceIdentity:
    """What a device is. Read once at discovery; it does not change while the driver is
    loaded. `index` is the vendor library's index (the `gpu` label); `architecture` the
    vendor's family name (hopper, cdna3)."""

    index: int
    uuid: str
    model: str
    pci_bus_id: str
    serial: str
    architecture: str
    numa_node: int | None
    vendor: str


def unknown_identity(index: int, vendor: str) -> DeviceIdentity:
    """A device the library enumerates but that has not answered to be identified: its
    position and vendor, nothing else."""
    return DeviceIdentity(
        index=index,
        uuid="",
        model="",
        pci_bus_id="",
        serial="",
        architecture="unknown",
        numa_node=None,
        vendor=vendor,
    )


@dataclass(frozen=True, slots=True)
class DeviceProcess:
    """A process with a compute context on the device (a host PID)."""

    pid: int
    used_memory_bytes: int | None  # None where the library cannot tell (WDDM, some vGPU)
    # Mean share of the device's compute the process used since the last read (NVIDIA: SM
    # utilization); None where the library has no per-process figure (MIG).
    utilization_ratio: float | None
    partition_uuid: str = ""  # the partition (MIG device) it runs in; "" outside any


@dataclass(frozen=True, slots=True)
class Partition:
    """A slice of a device that a pod can be given on its own (an NVIDIA MIG device; an AMD
    compute partition next), accounted as a device of its own in attribution.

    `share` is its part of the device (0-1): idle GPU-seconds and energy are weighted by it.
    `ids` are every name a device plugin may give it (its UUID first). The activity
    integrals are the partition's own where the vendor measures them (NVIDIA: its GPU
    instance's GPM), else None; `active_ratio` is the last window's activity. Partitions
    with the same `activity_group` share one measurement (NVIDIA: the MIG devices of one GPU
    instance), so their processes cannot be told apart by it."""

    uuid: str
    profile: str
    share: float
    ids: tuple[str, ...] = ()
    activity_group: str = ""
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    busy_seconds: float | None = None
    idle_seconds: float | None = None
    sm_active_seconds: float | None = None
    active_ratio: float | None = None


@dataclass(frozen=True, slots=True)
class InterconnectLink:
    """One device-to-device link (NVLink, XGMI): state, cumulative bytes, errors by kind."""

    link: int
    up: bool | None
    transmit_bytes: int | None
    receive_bytes: int | None
    errors: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class AcceleratorReading(Generic[X]):
    """One device at one collection. Only `identity` and `up` are always present.

    A device that is down says why where the agent knows: `stuck_seconds` while a call to
    it has been blocked past the read deadline (`stuck_call` names the library function,
    where known); the vendor's extension may say more (NVIDIA: fenced after a fatal XID)."""

    identity: DeviceIdentity
    up: bool
    extension: X | None = None  # the vendor's own data (agent/gpu/records.py NvidiaReading)
    stuck_seconds: float | None = None
    stuck_call: str = ""
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    busy_seconds: float | None = None  # integral of utilization over time
    idle_seconds: float | None = None  # integral of time at or below --idle-threshold
    unsampled_seconds: float | None = None  # time no utilization sample covered
    last_active_timestamp: float | None = None
    sm_active_seconds: float | None = None  # integral of the share of compute units busy
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    energy_joules: float | None = None
    temperatures_celsius: Mapping[str, float] = field(default_factory=dict)
    clocks_hertz: Mapping[str, float] = field(default_factory=dict)
    clocks_max_hertz: Mapping[str, float] = field(default_factory=dict)
    throttle_reasons: Mapping[str, bool] = field(default_factory=dict)
    pcie_transmit_bytes: float | None = None
    pcie_receive_bytes: float | None = None
    pcie_replay_errors: int | None = None
    pcie_link_generation: Mapping[str, int] = field(default_factory=dict)
    pcie_link_width: Mapping[str, int] = field(default_factory=dict)
    link_transmit_bytes: int | None = None  # summed over `links`
    link_receive_bytes: int | None = None
    links: tuple[InterconnectLink, ...] = ()
    ecc_errors: Mapping[str, int] = field(default_factory=dict)
    processes: tuple[DeviceProcess, ...] = ()
    partitions: tuple[Partition, ...] = ()


@dataclass(frozen=True, slots=True)
class AcceleratorSnapshot(Generic[X, S]):
    """Every device of one vendor on the node plus the facts that apply to all of them."""

    vendor: str
    driver_version: str
    library_version: str  # the vendor library's own version (NVML's, amdsmi's)
    gpus: tuple[AcceleratorReading[X], ...]
    extension: S | None = None  # the vendor's node-wide data (NvidiaSnapshot)
    # UUIDs of the devices whose process list the library refused (a MIG GPU without
    # CAP_SYS_ADMIN): their per-pod memory is unknown, not zero.
    processes_refused: frozenset[str] = frozenset()

    @property
    def pci_bus_ids(self) -> tuple[str, ...]:
        """Each device's PCI address in index order ("" where the library gave none)."""
        return tuple(g.identity.pci_bus_id for g in self.gpus)


# What vendor-neutral code takes: any vendor's snapshot, extensions unread.
AnyAccelerators = AcceleratorSnapshot[Any, Any]
AnyReading = AcceleratorReading[Any]
