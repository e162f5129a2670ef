"""Immutable records the GPU source produces.

Values are already in base units (bytes, watts, hertz, joules, seconds, ratios 0-1), so
exporters never convert. `None` means "the device does not support this": exporters omit
the series instead of exporting a misleading 0.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GpuIdentity:
    """What a GPU is. Read once at discovery; it does not change while the driver is loaded."""

    index: int
    uuid: str
    model: str
    pci_bus_id: str
    serial: str
    architecture: str
    compute_capability: str
    numa_node: int | None


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
class NvLink:
    link: int
    up: bool | None
    transmit_bytes: int | None
    receive_bytes: int | None
    errors: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process with a CUDA context on the GPU (a host PID)."""

    pid: int
    used_memory_bytes: int | None  # None where NVML cannot tell (Windows WDDM, some vGPU)
    sm_utilization_ratio: float | None  # mean over the window since the last read; None on MIG
    mig_uuid: str = ""  # the MIG instance it runs in, "" outside MIG


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
    # GPM (Hopper and later; None elsewhere): seconds x ratio integrated over GPM windows,
    # exactly as busy_seconds, and the last window's ratios.
    sm_active_seconds: float | None = None
    tensor_active_seconds: float | None = None
    dram_active_seconds: float | None = None
    gpm: GpmActivity | None = None
    # The same for each MIG GPU instance, by GPU instance id (MIG-enabled GPUs with GPM).
    gpu_instances: Mapping[int, GpuIntegrals] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one collection. Only `identity` and `up` are always present.

    A GPU that is down says why where the agent knows: `stuck_seconds` while a call to it
    has been blocked past the read deadline (`stuck_call` names the NVML function, where
    known), `fenced_xid` after a fatal XID made the agent stop calling it (agent/gpu/gate.py).
    Neither set and `up` False: NVML answered that the GPU is lost or needs a reset."""

    identity: GpuIdentity
    up: bool
    stuck_seconds: float | None = None
    stuck_call: str = ""
    fenced_xid: int | None = None
    mig_mode: str | None = None
    utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    busy_seconds: float | None = None
    idle_seconds: float | None = None  # integral of time at or below --idle-threshold
    unsampled_seconds: float | None = None  # time no utilization sample covered
    last_active_timestamp: float | None = None
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
    nvlink_transmit_bytes: int | None = None
    nvlink_receive_bytes: int | None = None
    nvlinks: tuple[NvLink, ...] = ()
    ecc_errors: Mapping[str, int] = field(default_factory=dict)
    remapped_rows: Mapping[str, int] = field(default_factory=dict)
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    recovery_action: int | None = None  # NVML_GPU_RECOVERY_ACTION_*; None before R570
    xid_errors: Mapping[int, int] = field(default_factory=dict)
    mig_instances: tuple[MigInstance, ...] = ()
    processes: tuple[GpuProcess, ...] = ()
    gpm: GpmActivity | None = None  # the last GPM window; None on GPUs without GPM
    sm_active_seconds: float | None = None
    tensor_active_seconds: float | None = None
    dram_active_seconds: float | None = None


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
    pcie: Mapping[tuple[int, int], str] = field(default_factory=dict)  # (i, j), i < j
    nvlink_peers: Mapping[int, tuple[NvLinkPeer, ...]] = field(default_factory=dict)
    fabric: Mapping[int, Fabric] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class GpuSnapshot:
    """Every GPU on the node plus the driver facts that apply to all of them."""

    driver_version: str
    cuda_driver_version: str
    nvml_version: str
    gpus: tuple[GpuReading, ...]
    topology: GpuTopology = field(default_factory=GpuTopology)
    # UUIDs whose XID event registration the driver accepted; None where events are
    # unavailable altogether (no event set), so nothing is claimed either way.
    xid_watched: frozenset[str] | None = None
    # UUIDs of the GPUs whose process list NVML refused (a MIG GPU without CAP_SYS_ADMIN,
    # through its parent and every MIG device handle): their per-pod memory is missing.
    processes_refused: frozenset[str] = frozenset()

    @property
    def pci_bus_ids(self) -> tuple[str, ...]:
        """Each GPU's PCI address in index order ("" where NVML gave none)."""
        return tuple(g.identity.pci_bus_id for g in self.gpus)
