"""One AMD GPU (an AMD SMI socket) through AMD SMI: its identity, read once, and its state,
read on every collection. Values are converted to base units here.

AMD SMI's units: power in W, memory in MB (MiB: an MI300X's 196,608 MB is 192 GiB),
clocks in MHz, temperatures in degrees C, energy in counts of a resolution in uJ, PCIe
speed in MT/s (GT/s x 1000), XGMI data in KB. The bindings turn the all-ones "not
available" value of many fields into the string "N/A"; `number` reads those as None, so
the series is absent, never 0.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gpuscope.agent.accelerators.records import (
    DeviceIdentity,
    DeviceProcess,
    InterconnectLink,
    Partition,
    unknown_identity,
)
from gpuscope.agent.amd.library import UNAVAILABLE, AmdSmi, AmdSmiCallError, number
from gpuscope.agent.amd.records import VENDOR, AmdGpu, AmdGpuReading, AmdReading
from gpuscope.agent.pci import sysfs_pci_address

log = logging.getLogger("gpuscope.amd")

MIB = 1024 * 1024
KIB = 1024

# AMD's ISA (the gfx target) -> the architecture family, as AMD names them.
FAMILIES: Mapping[str, str] = {
    "gfx908": "cdna",
    "gfx90a": "cdna2",
    "gfx940": "cdna3",
    "gfx941": "cdna3",
    "gfx942": "cdna3",
    "gfx950": "cdna4",
}

# (AmdSmiTemperatureType member, the contract's sensor). The junction (hotspot) is the
# die's hottest point: the counterpart of NVIDIA's "gpu"; VRAM is "memory", as NVIDIA's HBM.
TEMPERATURES: tuple[tuple[str, str], ...] = (
    ("JUNCTION", "gpu"),
    ("VRAM", "memory"),
    ("EDGE", "edge"),
    ("HBM_0", "hbm0"),
    ("HBM_1", "hbm1"),
    ("HBM_2", "hbm2"),
    ("HBM_3", "hbm3"),
)
# (AmdSmiClkType member, the contract's clock). The gfx clock drives the compute units:
# NVIDIA's "sm"; "memory" is the HBM clock on both.
CLOCKS: tuple[tuple[str, str], ...] = (
    ("GFX", "sm"),
    ("MEM", "memory"),
    ("SOC", "soc"),
    ("DF", "fabric"),
    ("VCLK0", "video"),
    ("DCLK0", "decode"),
)
ECC_KINDS: tuple[tuple[str, str], ...] = (
    ("correctable_count", "corrected"),
    ("uncorrectable_count", "uncorrected"),
    ("deferred_count", "deferred"),
)
BAD_PAGE_STATUS: Mapping[str, str] = {
    "RESERVED": "retired",
    "PENDING": "pending",
    "UNRESERVABLE": "unreservable",
}


@dataclass(frozen=True, slots=True)
class Processor:
    """One AMD SMI processor handle: a whole GPU, or one XCP of a partitioned one."""

    handle: Any
    uuid: str
    bdf: str
    partition_id: int  # the XCP number within its GPU (0 unpartitioned)
    render_minor: int | None  # /dev/dri/renderD<minor>: how the device plugin finds it


@dataclass(frozen=True, slots=True)
class Device:
    """A GPU as discovered: its identity and its processors (XCP 0 first, which alone
    has the device-wide metrics of a partitioned MI300X)."""

    identity: DeviceIdentity
    processors: tuple[Processor, ...]
    gfx_target: str
    device_id: int | None
    compute_units: int | None
    compute_partition: str
    memory_partition: str
    partition_ids: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    package: int | None = None  # the OAM package (an MI250X's two GCDs share one)

    @property
    def primary(self) -> Any:
        return self.processors[0].handle

    @property
    def partitioned(self) -> bool:
        return len(self.processors) > 1


def processors_by_socket(lib: AmdSmi) -> list[list[Any]]:
    """Processor handles grouped by socket (OAM package), as the C API gives them: the
    Python `amdsmi_get_processor_handles()` flattens the sockets, and a partitioned GPU's
    XCPs can only be told apart from other GPUs by the socket they are in."""
    m = lib.module
    wrapper = m.amdsmi_wrapper
    import ctypes

    groups = []
    for socket in lib.call("amdsmi_get_socket_handles"):
        count = ctypes.c_uint32()
        null = ctypes.POINTER(wrapper.amdsmi_processor_handle)()
        lib.raw("amdsmi_get_processor_handles", socket, ctypes.byref(count), null)
        handles = (wrapper.amdsmi_processor_handle * count.value)()
        lib.raw("amdsmi_get_processor_handles", socket, ctypes.byref(count), handles)
        groups.append([wrapper.amdsmi_processor_handle(handles[i]) for i in range(count.value)])
    return groups


def discover(
    lib: AmdSmi,
    index: int,
    handles: Sequence[Any],
    sysfs: Path,
    xcp_names: Mapping[int, str] | None = None,
) -> Device:
    """A GPU's identity from its processors (raises AmdSmiCallError if it does not
    answer). Handles are ordered by XCP: the partition id the kernel gives each.
    `xcp_names` (`xcp_devices`) is read from sysfs when not given (once for all GPUs)."""
    ordered = sorted((_processor(lib, h) for h in handles), key=lambda p: p.partition_id)
    gpu_uuid = ordered[0].uuid  # the GPU's: XCP 0's, the whole GPU's when unpartitioned
    processors = distinct(ordered, gpu_uuid) if len(ordered) > 1 else ordered
    h = processors[0].handle
    asic = lib.call("amdsmi_get_gpu_asic_info", h)
    gfx = str(asic.get("target_graphics_version", ""))
    bdf = processors[0].bdf
    numa = lib.query("amdsmi_get_gpu_topo_numa_affinity", h)
    numa_node = int(numa) if isinstance(numa, int) and numa >= 0 else _sysfs_numa(sysfs, bdf)
    model = str(asic.get("market_name") or "")
    identity = DeviceIdentity(
        index=index,
        uuid=gpu_uuid,
        model="" if model == "N/A" else model,
        pci_bus_id=bdf,
        serial=str(asic.get("asic_serial") or ""),
        architecture=FAMILIES.get(gfx, "unknown"),
        numa_node=numa_node,
        vendor=VENDOR,
    )
    compute = lib.query("amdsmi_get_gpu_compute_partition", h) or ""
    memory = lib.query("amdsmi_get_gpu_memory_partition", h) or ""
    if xcp_names is None:
        xcp_names = xcp_devices(sysfs)
    device_id = number(asic.get("device_id"))
    units = number(asic.get("num_compute_units"))
    oam = number(asic.get("oam_id"))
    return Device(
        identity=identity,
        processors=tuple(processors),
        gfx_target=gfx,
        device_id=int(device_id) if device_id is not None else None,
        compute_units=int(units) if units is not None else None,
        compute_partition=str(compute),
        memory_partition=str(memory),
        partition_ids={p.uuid: _plugin_ids(p, xcp_names) for p in processors},
        package=int(oam) if oam is not None else None,
    )


def _processor(lib: AmdSmi, handle: Any) -> Processor:
    uuid = str(lib.call("amdsmi_get_gpu_device_uuid", handle))
    bdf = sysfs_pci_address(str(lib.call("amdsmi_get_gpu_device_bdf", handle)))
    kfd = lib.query("amdsmi_get_gpu_kfd_info", handle) or {}
    partition = number(kfd.get("current_partition_id"))
    enum = lib.query("amdsmi_get_gpu_enumeration_info", handle) or {}
    render = number(enum.get("drm_render"))
    return Processor(
        handle=handle,
        uuid=uuid,
        bdf=bdf,
        partition_id=int(partition) if partition is not None else 0,
        render_minor=int(render) if render is not None else None,
    )


def distinct(processors: Sequence[Processor], gpu_uuid: str) -> list[Processor]:
    """A partitioned GPU's processors with UUIDs of their own, none the GPU's: attribution
    keys GPUs and partitions by UUID, and a partition named as its GPU would be counted as
    both. XCP 0 reports the GPU's UUID, and before ROCm 7.0 every XCP does; such a one is
    named `<uuid>-xcp<N>`. UUIDs the library gives partitions of their own are kept."""
    seen = {gpu_uuid}
    out = []
    for p in processors:
        uuid = p.uuid if p.uuid not in seen else f"{p.uuid}-xcp{p.partition_id}"
        seen.add(uuid)
        out.append(replace(p, uuid=uuid) if uuid != p.uuid else p)
    return out


def xcp_devices(sysfs: Path) -> dict[int, str]:
    """Render minor -> `amdgpu_xcp_<N>`: the platform devices the amdgpu driver makes for
    the partitions beyond the first, which AMD's device plugin reports to the kubelet by
    that name (the first partition keeps its PCI address)."""
    found: dict[int, str] = {}
    platform = sysfs / "devices" / "platform"
    try:
        entries = sorted(platform.glob("amdgpu_xcp_*"))
    except OSError:
        return found
    for entry in entries:
        try:
            renders = [p.name for p in (entry / "drm").iterdir() if p.name.startswith("renderD")]
        except OSError:
            continue
        for name in renders:
            minor = name.removeprefix("renderD")
            if minor.isdigit():
                found[int(minor)] = entry.name
    return found


def _plugin_ids(p: Processor, xcp_names: Mapping[int, str]) -> tuple[str, ...]:
    """Every name a device plugin may give this processor: its UUID, its PCI address (the
    whole GPU, or the first partition), its `amdgpu_xcp_<N>` device."""
    ids = [p.uuid]
    if p.partition_id == 0:
        ids.append(p.bdf)
    if p.render_minor is not None and p.render_minor in xcp_names:
        ids.append(xcp_names[p.render_minor])
    return tuple(i for i in ids if i)


def _sysfs_numa(sysfs: Path, bdf: str) -> int | None:
    try:
        value = int((sysfs / "bus" / "pci" / "devices" / bdf / "numa_node").read_text())
    except (OSError, ValueError):
        return None
    return value if value >= 0 else None


@dataclass(frozen=True, slots=True)
class Integrals:
    """What the sampler accumulated for one GPU (agent/amd/sampler.py)."""

    busy_seconds: float | None = None
    idle_seconds: float | None = None
    unsampled_seconds: float | None = None
    last_active_timestamp: float | None = None
    throttle_seconds: Mapping[str, float] = field(default_factory=dict)
    throttling: Mapping[str, bool] = field(default_factory=dict)
    activity_source: str = ""
    partition_busy: Mapping[str, float] = field(default_factory=dict)  # by partition UUID
    partition_idle: Mapping[str, float] = field(default_factory=dict)
    partition_active: Mapping[str, float] = field(default_factory=dict)  # last window ratio


def unknown_reading(index: int) -> AmdGpu:
    """A GPU AMD SMI enumerates but that has not answered to be identified: its position,
    down, nothing else."""
    identity = unknown_identity(index, VENDOR)
    return AmdGpuReading(identity=identity, up=False, extension=AmdReading(socket=index))


def down_reading(device: Device, events: Mapping[str, int]) -> AmdGpu:
    """A GPU that is not answering: its identity and its events; nothing read."""
    x = AmdReading(socket=device.identity.index, gfx_target=device.gfx_target, events=events)
    return AmdGpuReading(identity=device.identity, up=False, extension=x)


def read(
    lib: AmdSmi,
    device: Device,
    integrals: Integrals,
    events: Mapping[str, int],
    processes: Sequence[DeviceProcess],
) -> AmdGpu:
    """Everything about one GPU now. A GPU whose memory usage cannot be read is down (the
    one reading every part and release answers, a guest's included, from the driver's
    sysfs); any other call that fails leaves its series out."""
    h = device.primary
    try:
        vram = lib.call("amdsmi_get_gpu_vram_usage", h)
    except AmdSmiCallError as exc:
        log.debug("%s: %s", device.identity.pci_bus_id, exc)
        return down_reading(device, events)
    activity = lib.query("amdsmi_get_gpu_activity", h) or {}
    gfx, umc = number(activity.get("gfx_activity")), number(activity.get("umc_activity"))
    power = lib.query("amdsmi_get_power_info", h) or {}
    pcie = lib.query("amdsmi_get_pcie_info", h) or {}
    metric, static = pcie.get("pcie_metric", {}), pcie.get("pcie_static", {})
    links = xgmi_links(lib, h)
    clocks = _clocks(lib, h)
    used, total = number(vram.get("vram_used")), number(vram.get("vram_total"))
    used_bytes = int(used) * MIB if used is not None else None
    total_bytes = int(total) * MIB if total else None
    partitions = _partitions(lib, device, integrals) if device.partitioned else ()
    if partitions:
        used_bytes, total_bytes = _gpu_memory(device, partitions)
    x = AmdReading(
        socket=device.identity.index,
        gfx_target=device.gfx_target,
        device_id=device.device_id,
        package=device.package,
        compute_units=device.compute_units,
        compute_partition=device.compute_partition,
        memory_partition=device.memory_partition,
        bad_pages=_bad_pages(lib, h),
        events=events,
        throttle_seconds=integrals.throttle_seconds,
        activity_source=integrals.activity_source,
        pcie_recoveries=_int(metric.get("pcie_l0_to_recovery_count")),
    )
    return AmdGpuReading(
        identity=device.identity,
        up=True,
        extension=x,
        utilization_ratio=gfx / 100 if gfx is not None and gfx <= 100 else None,
        memory_utilization_ratio=umc / 100 if umc is not None and umc <= 100 else None,
        busy_seconds=integrals.busy_seconds,
        idle_seconds=integrals.idle_seconds,
        unsampled_seconds=integrals.unsampled_seconds,
        last_active_timestamp=integrals.last_active_timestamp,
        memory_used_bytes=used_bytes,
        memory_total_bytes=total_bytes,
        power_watts=_power(power),
        power_limit_watts=_positive(power.get("power_limit")),
        energy_joules=_energy(lib, h),
        temperatures_celsius=_temperatures(lib, h),
        clocks_hertz=clocks.get("clk", {}),
        clocks_max_hertz=clocks.get("max_clk", {}),
        throttle_reasons=integrals.throttling,
        pcie_replay_errors=_int(metric.get("pcie_replay_count")),
        pcie_link_generation=_generations(metric.get("pcie_speed"), static.get("max_pcie_speed")),
        pcie_link_width=_pair(metric.get("pcie_width"), static.get("max_pcie_width")),
        link_transmit_bytes=_sum(link.transmit_bytes for link in links) if links else None,
        link_receive_bytes=_sum(link.receive_bytes for link in links) if links else None,
        links=links,
        ecc_errors=_ecc(lib, h),
        processes=tuple(processes),
        partitions=partitions,
    )


def _gpu_memory(device: Device, partitions: Sequence[Partition]) -> tuple[int | None, int | None]:
    """A partitioned GPU's memory from its partitions'. Each XCP reports the memory
    partition (NPS domain) it lives in, which the XCPs of that domain share: in CPX/NPS4
    two XCPs report the same 48 GiB. So the GPU's figure is the XCPs' sum times the
    domains per XCP (4/8 there); a mode the agent cannot parse leaves it absent."""
    mode = device.memory_partition.upper()
    domains = int(mode[3:]) if mode.startswith("NPS") and mode[3:].isdigit() else 0
    if not domains or len(partitions) % domains:
        return None, None
    factor = domains / len(partitions)
    used = [p.memory_used_bytes for p in partitions]
    total = [p.memory_total_bytes for p in partitions]
    return (
        round(sum(u for u in used if u is not None) * factor) if None not in used else None,
        round(sum(t for t in total if t is not None) * factor) if None not in total else None,
    )


def _int(value: Any) -> int | None:
    n = number(value)
    return int(n) if n is not None else None


def _positive(value: Any) -> float | None:
    n = number(value)
    return n if n is not None and n > 0 else None


def _sum(values: Any) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _power(power: Mapping[str, Any]) -> float | None:
    """MI300 and later report the current socket power; older parts only the average (the
    bindings show 0xFFFF for the one a part lacks). A second MI250X GCD has neither."""
    for key in ("current_socket_power", "average_socket_power"):
        value = number(power.get(key))
        if value is not None and value != 0xFFFF:
            return value
    return None


def _energy(lib: AmdSmi, h: Any) -> float | None:
    got = lib.query("amdsmi_get_energy_count", h)
    if not got:
        return None
    count, resolution = number(got.get("energy_accumulator")), number(got.get("counter_resolution"))
    if count is None or not resolution:
        return None
    return count * resolution / 1e6  # counts x uJ per count


def _temperatures(lib: AmdSmi, h: Any) -> dict[str, float]:
    m = lib.module
    found: dict[str, float] = {}
    for member, sensor in TEMPERATURES:
        value = number(
            lib.query(
                "amdsmi_get_temp_metric",
                h,
                m.AmdSmiTemperatureType[member],
                m.AmdSmiTemperatureMetric.CURRENT,
            )
        )
        if value is not None:
            found[sensor] = value
    return found


def _clocks(lib: AmdSmi, h: Any) -> dict[str, dict[str, float]]:
    """Each clock domain's current ("clk") and maximum ("max_clk") frequency in hertz, one
    call per domain."""
    m = lib.module
    found: dict[str, dict[str, float]] = {"clk": {}, "max_clk": {}}
    for member, clock in CLOCKS:
        info = lib.query("amdsmi_get_clock_info", h, m.AmdSmiClkType[member]) or {}
        for key, values in found.items():
            mhz = number(info.get(key))
            if mhz is not None:
                values[clock] = mhz * 1e6
    return found


def _generation(mts: Any) -> int | None:
    """PCIe generation from a speed in MT/s (2.5 GT/s gen 1 ... 64 GT/s gen 6); a value
    under 100 is taken as GT/s, as some releases report the maximum."""
    speed = number(mts)
    if speed is None or speed <= 0:
        return None
    if speed < 100:
        speed *= 1000
    for gen, floor in ((6, 64000), (5, 32000), (4, 16000), (3, 8000), (2, 5000), (1, 2500)):
        if speed >= floor:
            return gen
    return None


def _generations(current: Any, maximum: Any) -> dict[str, int]:
    return _pair(_generation(current), _generation(maximum))


def _pair(current: Any, maximum: Any) -> dict[str, int]:
    found = {}
    for state, value in (("current", current), ("max", maximum)):
        n = number(value)
        if n is not None and n > 0:
            found[state] = int(n)
    return found


def xgmi_links(lib: AmdSmi, h: Any) -> tuple[InterconnectLink, ...]:
    """XGMI links: state from the link status, cumulative data from the link metrics.
    The 7.0.2 bindings read 8 of the library's 64 link slots: an MI300X has 7 peers plus
    one unused slot, so nothing is lost on today's platforms."""
    status = lib.query("amdsmi_get_gpu_xgmi_link_status", h) or {}
    states = list(status.get("status") or [])
    metrics = _link_metrics(lib, h) or {}
    count = _int(metrics.get("num_links")) or 0
    data = [link for link in (metrics.get("links") or [])[:count]]
    n = max(len(states), len(data))
    links = []
    for i in range(n):
        state = states[i] if i < len(states) else "N/A"
        if state == "X":  # disabled: not a link of this platform
            continue
        up = True if state == "U" else False if state == "D" else None
        entry = data[i] if i < len(data) else {}
        write, read_kb = number(entry.get("write")), number(entry.get("read"))
        links.append(
            InterconnectLink(
                link=i,
                up=up,
                transmit_bytes=int(write) * KIB if write is not None else None,
                receive_bytes=int(read_kb) * KIB if read_kb is not None else None,
            )
        )
    return tuple(links)


def _link_metrics(lib: AmdSmi, h: Any) -> Mapping[str, Any] | None:
    """`amdsmi_get_link_metrics`; the amdsmi 6.4.0 interface lacks the Python function
    though its wrapper binds the C call (with 7.0's layout), so there it is read from the
    struct, as the 7.0.2 function would: N/A for all-ones."""
    if hasattr(lib.module, "amdsmi_get_link_metrics"):
        got = lib.query("amdsmi_get_link_metrics", h)
        return got if isinstance(got, Mapping) else None
    import ctypes

    wrapper = lib.module.amdsmi_wrapper
    raw = wrapper.amdsmi_link_metrics_t()
    try:
        lib.raw("amdsmi_get_link_metrics", h, ctypes.byref(raw))
    except AmdSmiCallError as exc:
        if exc.status in UNAVAILABLE:
            return None
        raise
    count = min(int(raw.num_links), len(raw.links))

    def kb(value: int) -> int | str:
        return "N/A" if value == 0xFFFFFFFFFFFFFFFF else int(value)

    links = [{"read": kb(raw.links[i].read), "write": kb(raw.links[i].write)} for i in range(count)]
    return {"num_links": count, "links": links}


def _ecc(lib: AmdSmi, h: Any) -> dict[str, int]:
    got = lib.query("amdsmi_get_gpu_total_ecc_count", h) or {}
    found = {}
    for key, kind in ECC_KINDS:
        value = _int(got.get(key))
        if value is not None:
            found[kind] = value
    return found


def _bad_pages(lib: AmdSmi, h: Any) -> dict[str, int]:
    """Retired pages by status; {} where the library does not say (a guest, an older
    part), which is not the same as none."""
    pages = lib.query("amdsmi_get_gpu_bad_page_info", h)
    if pages is None:
        return {}
    counts = dict.fromkeys(BAD_PAGE_STATUS.values(), 0)
    for page in pages:
        status = str(page.get("status", "")).rsplit("_", 1)[-1].upper() if page else ""
        kind = BAD_PAGE_STATUS.get(status)
        if kind is not None:
            counts[kind] += 1
    return counts


def _partitions(lib: AmdSmi, device: Device, integrals: Integrals) -> tuple[Partition, ...]:
    """The XCPs of a partitioned GPU, as the contract's partitions: an equal share of the
    GPU each (SPX 1, DPX 1/2, QPX 1/4, CPX 1/8 of the compute), their own memory where
    the library reports it per XCP, their own activity integrals from the firmware's
    per-XCP busy accumulators."""
    share = 1.0 / len(device.processors)
    parts = []
    for p in device.processors:
        vram = lib.query("amdsmi_get_gpu_vram_usage", p.handle) or {}
        used, total = number(vram.get("vram_used")), number(vram.get("vram_total"))
        parts.append(
            Partition(
                uuid=p.uuid,
                profile=device.compute_partition or "partition",
                share=share,
                ids=device.partition_ids.get(p.uuid, (p.uuid,)),
                activity_group=p.uuid,
                memory_used_bytes=int(used) * MIB if used is not None else None,
                memory_total_bytes=int(total) * MIB if total else None,
                busy_seconds=integrals.partition_busy.get(p.uuid),
                idle_seconds=integrals.partition_idle.get(p.uuid),
                active_ratio=integrals.partition_active.get(p.uuid),
            )
        )
    return tuple(parts)
