"""NVIDIA's records: the accelerator contract (agent/accelerators/records.py) filled from
NVML, with what only NVIDIA has in its extensions.

`GpuReading` and `GpuSnapshot` are the contract's records typed with NVIDIA's extensions
(`NvidiaReading`, `NvidiaSnapshot`): XIDs, GPM, MIG details, row remapping, recovery
actions, compute capability, CUDA and NVML versions, NVLink peers and fabric. Only NVIDIA's
renderers (exporters/prometheus/gpu.py, exporters/labels/nvidia.py) read the extensions.

Values are already in base units (bytes, watts, hertz, joules, seconds, ratios 0-1), so
exporters never convert. `None` means "the device does not support this": exporters omit
the series instead of exporting a misleading 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuscope.agent.accelerators.records import (
    AcceleratorReading,
    AcceleratorSnapshot,
    DeviceIdentity,
    DeviceProcess,
    InterconnectLink,
)

VENDOR = "nvidia"
INTERCONNECT = "nvlink"

# NVIDIA's names for the contract's records (a GPU's identity, a process on it, an NVLink).
GpuIdentity = DeviceIdentity
GpuProcess = DeviceProcess
NvLink = InterconnectLink


@dataclass(frozen=True, slots=True)
class GpmActivity:
    """What a GPU (or MIG GPU instance) did over the last GPM window (NVML GPM, Hopper and
    later): ratios 0-1, `None` where the driver gave no value for that metric.

    `sm_active` is the share of SMs busy (DCGM_FI_PROF_SM_ACTIVE), `sm_occupancy` resident
    warps of the maximum (SM_OCCUPANCY), `graphics_engine_active` the share of time the
    graphics/compute engine was active (GR_ENGINE_ACTIVE, close to NVML utilization),
    `tensor_active` any tensor pipe (PIPE_TENSOR_ACTIVE), `dram_active` DRAM bandwidth used
    of peak (DRAM_ACTIVE); `pipes` the non-tensor pipes by name: fp64, fp32, fp16, integer
    (PIPE_FP64/FP32/FP16_ACTIVE; integer has no DCGM profiling field)."""

    sm_active: float | None = None
    sm_occupancy: float | None = None
    graphics_engine_active: float | None = None
    tensor_active: float | None = None
    dram_active: float | None = None
    pipes: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class MigInstance:
    """One MIG device (a compute instance in a GPU instance). GPM samples GPU instances, so
    the MIG devices of one GPU instance share its `gpm` and `integrals`."""

    mig_uuid: str
    profile: str
    gpu_instance: int
    compute_instance: int
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    gpm: GpmActivity | None = None  # the GPU instance's last GPM window; None without GPM
    # The GPU instance's GPM counters: sm/tensor/dram_active_seconds, and busy_seconds /
    # idle_seconds from GPM's graphics-engine activity (NVML has no utilization samples on
    # MIG; idle = windows at or below --idle-threshold). The other fields stay None.
    integrals: GpuIntegrals | None = None


@dataclass(frozen=True, slots=True)
class GpuIntegrals:
    """Values that only exist as integrals over time; kept by the sampler between scrapes."""

    busy_seconds: float | None = None
    idle_seconds: float | None = None
    unsampled_seconds: float | None = None  # time no utilization sample covered
    last_active_timestamp: float | None = None
    pcie_transmit_bytes: float | None = None
    pcie_receive_bytes: float | None = None
    energy_joules: float | None = None
    # Where the PCIe bytes are integrated (no byte counters): the sampler's latest
    # nvmlDeviceGetPcieThroughput reading in bytes/s (a 20 ms window), while it is held.
    pcie_transmit_rate: float | None = None
    pcie_receive_rate: float | None = None
    # GPM (Hopper and later; None elsewhere): seconds x ratio integrated over GPM windows,
    # exactly as busy_seconds, and the last window's ratios.
    sm_active_seconds: float | None = None
    tensor_active_seconds: float | None = None
    dram_active_seconds: float | None = None
    gpm: GpmActivity | None = None
    # The same for each MIG GPU instance, by GPU instance id (MIG-enabled GPUs with GPM).
    gpu_instances: Mapping[int, GpuIntegrals] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NvidiaReading:
    """What NVML says of a GPU that no other vendor's contract field holds. Present on every
    reading of an NVIDIA GPU the agent has discovered, up or down (its XIDs and fence
    outlive its answers).

    `fenced_xid`: the agent stopped calling the GPU after that fatal XID
    (agent/accelerators/gate.py).
    `mig_instances`: the MIG devices in NVML's terms (the contract's `partitions` are the
    same devices for attribution)."""

    compute_capability: str = ""
    fenced_xid: int | None = None
    mig_mode: str | None = None
    remapped_rows: Mapping[str, int] = field(default_factory=dict)
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    recovery_action: int | None = None  # NVML_GPU_RECOVERY_ACTION_*; None before R570
    xid_errors: Mapping[int, int] = field(default_factory=dict)
    mig_instances: tuple[MigInstance, ...] = ()
    gpm: GpmActivity | None = None  # the last GPM window; None on GPUs without GPM
    tensor_active_seconds: float | None = None
    dram_active_seconds: float | None = None
    # Throughput per second over the source's own last window (GpuSource.read documents it):
    # PCIe bytes each way, and NVLink data bytes both ways over all links. None on the
    # first reading, where the GPU has no such counter, after a counter went back, and
    # unless --dcgm-compat (their one reader) is on.
    pcie_transmit_bytes_per_second: float | None = None
    pcie_receive_bytes_per_second: float | None = None
    nvlink_bytes_per_second: float | None = None


NO_EXTENSION = NvidiaReading()  # what a reading of a GPU never discovered carries


@dataclass(frozen=True, slots=True)
class GpuReading(AcceleratorReading[NvidiaReading]):
    """An NVIDIA GPU's reading as the source builds it: the contract's fields, NVIDIA's in
    `extension`. Code that reads one takes an `NvidiaGpu` (what `GpuSnapshot.gpus` holds)."""


NvidiaGpu = AcceleratorReading[NvidiaReading]


@dataclass(frozen=True, slots=True)
class NvLinkPeer:
    """The far end of some of a GPU's NVLinks: an NVSwitch or another GPU."""

    kind: str  # switch | gpu | ibmnpu | unknown
    pci_bus_id: str  # "" where NVML does not report one (NVL72 switch trays)
    links: int


@dataclass(frozen=True, slots=True)
class Fabric:
    """A GPU's multi-node NVLink registration. Until `completed`, the UUID is empty and the
    clique and status mean nothing; a completed registration with a failing `status` keeps
    its clique but no UUID."""

    cluster_uuid: str
    clique_id: int
    completed: bool
    state: int = 3  # nvmlGpuFabricState_t
    status: int = 0  # an NVML return code, meaningful only when completed
    health_mask: int = 0


@dataclass(frozen=True, slots=True)
class GpuTopology:
    """How the node's GPUs are wired (agent/gpu/topology.py), by GPU index: the PCIe level of
    each pair, each GPU's NVLink peers and its fabric registration; what is not known is absent."""

    pcie: Mapping[tuple[int, int], str] = field(default_factory=dict)  # (i, j), i < j
    nvlink_peers: Mapping[int, tuple[NvLinkPeer, ...]] = field(default_factory=dict)
    fabric: Mapping[int, Fabric] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class NvidiaSnapshot:
    """NVIDIA's node-wide facts beyond the contract: the CUDA driver version, NVLink peers
    and fabric registrations, and which GPUs' XID events are watched."""

    cuda_driver_version: str = ""
    topology: GpuTopology = field(default_factory=lambda: GpuTopology())
    # UUIDs whose XID event registration the driver accepted; None where events are
    # unavailable altogether (no event set), so nothing is claimed either way.
    xid_watched: frozenset[str] | None = None


@dataclass(frozen=True, slots=True)
class GpuSnapshot(AcceleratorSnapshot[NvidiaReading, NvidiaSnapshot]):
    """The NVIDIA GPUs of the node: the contract's snapshot, NVIDIA's facts in `extension`."""


def nvidia(reading: NvidiaGpu) -> NvidiaReading:
    """A reading's NVIDIA extension (the empty one for a GPU never discovered)."""
    return reading.extension if reading.extension is not None else NO_EXTENSION


def node(snapshot: GpuSnapshot) -> NvidiaSnapshot:
    """A snapshot's NVIDIA extension (the empty one where the source gave none)."""
    return snapshot.extension if snapshot.extension is not None else NvidiaSnapshot()
