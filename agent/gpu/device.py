"""Reading one GPU through NVML into records: identity once, state on every collection.

Only NVML's own units appear in this module's arithmetic (mW, MiB, MHz, %, KiB); everything
that leaves it is in base units.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from gpuscope.agent.gpu import fields
from gpuscope.agent.gpu.nvml import NOT_FOUND, GpuLost, Nvml, text
from gpuscope.agent.gpu.partitions import partitions
from gpuscope.agent.gpu.records import (
    VENDOR,
    GpuIdentity,
    GpuIntegrals,
    GpuReading,
    MigInstance,
    NvidiaReading,
    NvLink,
)
from gpuscope.agent.pci import sysfs_pci_address

log = logging.getLogger("gpuscope.gpu")

MHZ = 1_000_000.0

ARCHITECTURES: Mapping[int, str] = {
    2: "kepler",
    3: "maxwell",
    4: "pascal",
    5: "volta",
    6: "turing",
    7: "ampere",
    8: "ada-lovelace",
    9: "hopper",
    10: "blackwell",
    13: "rubin",
}

# Architectures whose NVLinks are NVLink5 or later: their errors are other field ids.
NVLINK5_ARCHITECTURES = frozenset({"blackwell", "rubin"})

# nvmlClocksEventReason* bits -> the `reason` label. Every reason is exported on every
# scrape (0 or 1) so that alerts can tell "not throttled" from "not reported".
THROTTLE_REASONS: tuple[tuple[int, str], ...] = (
    (0x001, "idle"),
    (0x002, "applications_clocks"),
    (0x004, "sw_power_cap"),
    (0x008, "hw_slowdown"),
    (0x010, "sync_boost"),
    (0x020, "sw_thermal"),
    (0x040, "hw_thermal"),
    (0x080, "hw_power_brake"),
    (0x100, "display_clocks"),
)

CLOCKS: tuple[tuple[str, int], ...] = (("graphics", 0), ("sm", 1), ("memory", 2))

NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_MEMORY_V2 = 0x02000028


@dataclass
class Device:
    """A discovered GPU: its handle, identity and what we learned about its capabilities."""

    handle: Any
    identity: GpuIdentity
    compute_capability: str = ""  # "9.0"; "" where NVML does not say
    nvlink_count: int | None = None  # None until probed; 0 = no NVLink

    def down(self, xid_errors: Mapping[int, int], fenced_xid: int | None = None) -> GpuReading:
        """A reading of this GPU that is not answering (`down_reading`)."""
        return down_reading(self.identity, self.compute_capability, xid_errors, fenced_xid)


def down_reading(
    identity: GpuIdentity,
    compute_capability: str,
    xid_errors: Mapping[int, int],
    fenced_xid: int | None = None,
) -> GpuReading:
    """A GPU that is not answering: its identity, and in its NVIDIA extension its XIDs and
    the fatal XID it was fenced after, if any; nothing read."""
    extension = NvidiaReading(
        compute_capability=compute_capability, fenced_xid=fenced_xid, xid_errors=dict(xid_errors)
    )
    return GpuReading(identity=identity, up=False, extension=extension)


def discover(nvml: Nvml, index: int, sysfs: Path) -> Device:
    """Read a GPU's identity. Raises GpuLost if it does not answer."""
    handle = nvml.call("nvmlDeviceGetHandleByIndex", index)
    uuid = text(nvml.call("nvmlDeviceGetUUID", handle))
    model = text(nvml.call("nvmlDeviceGetName", handle))
    pci = nvml.query("nvmlDeviceGetPciInfo", handle)
    bus_id = text(pci.busId) if pci is not None else ""
    serial = nvml.query("nvmlDeviceGetSerial", handle)
    arch = nvml.query("nvmlDeviceGetArchitecture", handle)
    cc = nvml.query("nvmlDeviceGetCudaComputeCapability", handle)
    numa = nvml.query("nvmlDeviceGetNumaNodeId", handle)
    if numa is None or int(numa) < 0:
        numa = numa_node_from_sysfs(sysfs, bus_id)
    identity = GpuIdentity(
        index=index,
        uuid=uuid,
        model=model,
        pci_bus_id=bus_id,
        serial=text(serial) if serial is not None else "",
        architecture=ARCHITECTURES.get(int(arch), "unknown") if arch is not None else "unknown",
        numa_node=int(numa) if numa is not None and int(numa) >= 0 else None,
        vendor=VENDOR,
    )
    capability = f"{cc[0]}.{cc[1]}" if cc is not None else ""
    return Device(handle=handle, identity=identity, compute_capability=capability)


def numa_node_from_sysfs(sysfs: Path, bus_id: str) -> int | None:
    """Older drivers lack nvmlDeviceGetNumaNodeId; the kernel knows the answer too."""
    if not bus_id:
        return None
    path = sysfs / "bus" / "pci" / "devices" / sysfs_pci_address(bus_id) / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def read(
    nvml: Nvml,
    device: Device,
    integrals: GpuIntegrals,
    xid_errors: Mapping[int, int],
) -> GpuReading:
    """Read everything about one GPU. A lost GPU yields a reading with `up=False` only."""
    try:
        return _read(nvml, device, integrals, xid_errors)
    except GpuLost as exc:
        log.debug("GPU %s lost: %s", device.identity.index, exc)
        return device.down(xid_errors)


def _read(
    nvml: Nvml, device: Device, integrals: GpuIntegrals, xid_errors: Mapping[int, int]
) -> GpuReading:
    """One reading from the group readers below, called in the order NVML was always asked
    in (so a GPU that falls off the bus mid-read still fails at the same call)."""
    h = device.handle
    mig_mode = _read_mig_mode(nvml, h)
    util, memory_util = _read_utilization(nvml, h)
    memory_used, memory_total, memory_reserved = _read_memory(nvml, h)
    power, power_limit, energy = _read_power(nvml, h, integrals)
    temp = nvml.query("nvmlDeviceGetTemperature", h, NVML_TEMPERATURE_GPU)
    clocks, clocks_max = _read_clocks(nvml, h)
    throttle = _read_throttle(nvml, h)
    link_gen, link_width = _read_pcie_link(nvml, h)
    ecc = _read_ecc(nvml, h)
    remapped, remap_pending, remap_failure = _read_row_remap(nvml, h)
    batch = _read_fields(nvml, device)
    pcie_tx, pcie_rx, pcie_replay = _read_pcie_counters(nvml, h, batch, integrals)
    migs = _with_gpm(_read_mig(nvml, h), integrals) if mig_mode == "enabled" else ()
    extension = NvidiaReading(
        compute_capability=device.compute_capability,
        mig_mode=mig_mode,
        remapped_rows=remapped,
        row_remap_pending=remap_pending,
        row_remap_failure=remap_failure,
        recovery_action=batch.recovery_action,
        xid_errors=dict(xid_errors),
        mig_instances=migs,
        gpm=integrals.gpm,
        tensor_active_seconds=integrals.tensor_active_seconds,
        dram_active_seconds=integrals.dram_active_seconds,
    )
    return GpuReading(
        identity=device.identity,
        up=True,
        extension=extension,
        utilization_ratio=util,
        memory_utilization_ratio=memory_util,
        busy_seconds=integrals.busy_seconds,
        idle_seconds=integrals.idle_seconds,
        unsampled_seconds=integrals.unsampled_seconds,
        last_active_timestamp=integrals.last_active_timestamp,
        memory_used_bytes=memory_used,
        memory_total_bytes=memory_total,
        memory_reserved_bytes=memory_reserved,
        power_watts=power,
        power_limit_watts=power_limit,
        energy_joules=energy,
        temperatures_celsius=_temperatures(temp, batch),
        clocks_hertz=clocks,
        clocks_max_hertz=clocks_max,
        throttle_reasons=throttle,
        pcie_transmit_bytes=pcie_tx,
        pcie_receive_bytes=pcie_rx,
        pcie_replay_errors=pcie_replay,
        pcie_link_generation=link_gen,
        pcie_link_width=link_width,
        link_transmit_bytes=_sum_present(link.transmit_bytes for link in batch.nvlinks),
        link_receive_bytes=_sum_present(link.receive_bytes for link in batch.nvlinks),
        links=batch.nvlinks,
        ecc_errors=ecc,
        sm_active_seconds=integrals.sm_active_seconds,
        partitions=partitions(device.identity.uuid, device.identity.model, migs),
    )


def _with_gpm(
    instances: tuple[MigInstance, ...], integrals: GpuIntegrals
) -> tuple[MigInstance, ...]:
    """Each MIG device with its GPU instance's GPM activity and counters, where sampled."""
    if not integrals.gpu_instances:
        return instances
    out = []
    for mig in instances:
        got = integrals.gpu_instances.get(mig.gpu_instance)
        out.append(mig if got is None else replace(mig, gpm=got.gpm, integrals=got))
    return tuple(out)


def _read_mig_mode(nvml: Nvml, h: Any) -> str | None:
    """`enabled`/`disabled`, or None on GPUs that cannot do MIG (so labels can tell them apart)."""
    mig = nvml.query("nvmlDeviceGetMigMode", h)
    if mig is None:
        return None
    return "enabled" if int(mig[0]) == 1 else "disabled"


def _read_utilization(nvml: Nvml, h: Any) -> tuple[float | None, float | None]:
    """GPU and memory-controller busy ratios (0..1) over NVML's last sample period."""
    util = nvml.query("nvmlDeviceGetUtilizationRates", h)
    if util is None:
        return None, None
    return util.gpu / 100.0, util.memory / 100.0


def _read_memory(nvml: Nvml, h: Any) -> tuple[int | None, int | None, int | None]:
    """Used, total and reserved framebuffer bytes. The v2 struct is asked first because only
    it reports the driver's reservation; older drivers answer the v1 call alone."""
    q = nvml.query
    memory = q("nvmlDeviceGetMemoryInfo", h, NVML_MEMORY_V2) or q("nvmlDeviceGetMemoryInfo", h)
    if memory is None:
        return None, None, None
    reserved = getattr(memory, "reserved", None)
    return int(memory.used), int(memory.total), int(reserved) if reserved is not None else None


def _read_power(
    nvml: Nvml, h: Any, integrals: GpuIntegrals
) -> tuple[float | None, float | None, float | None]:
    """Power, enforced limit (W) and energy (J); energy falls back to the sampler's integral
    on GPUs without the hardware counter, so the counter exists on every GPU."""
    q = nvml.query
    power = q("nvmlDeviceGetPowerUsage", h)
    power_limit = q("nvmlDeviceGetEnforcedPowerLimit", h)
    energy = q("nvmlDeviceGetTotalEnergyConsumption", h)
    return (
        power / 1000.0 if power is not None else None,
        power_limit / 1000.0 if power_limit is not None else None,
        energy / 1000.0 if energy is not None else integrals.energy_joules,
    )


def _read_clocks(nvml: Nvml, h: Any) -> tuple[dict[str, float], dict[str, float]]:
    """Current and maximum clocks in Hz, by clock name; a clock NVML lacks is left out."""
    q = nvml.query
    clocks: dict[str, float] = {}
    clocks_max: dict[str, float] = {}
    for name, clock_type in CLOCKS:
        current = q("nvmlDeviceGetClockInfo", h, clock_type)
        if current is not None:
            clocks[name] = current * MHZ
        peak = q("nvmlDeviceGetMaxClockInfo", h, clock_type)
        if peak is not None:
            clocks_max[name] = peak * MHZ
    return clocks, clocks_max


def _read_throttle(nvml: Nvml, h: Any) -> dict[str, bool]:
    """Every throttle reason as a bool (see THROTTLE_REASONS), or {} where NVML has no mask.

    Newer drivers call it "clocks event reasons"; older ones only have the throttle name.
    """
    q = nvml.query
    mask = q("nvmlDeviceGetCurrentClocksEventReasons", h)
    if mask is None:
        mask = q("nvmlDeviceGetCurrentClocksThrottleReasons", h)
    if mask is None:
        return {}
    return {name: bool(mask & bit) for bit, name in THROTTLE_REASONS}


def _read_pcie_link(nvml: Nvml, h: Any) -> tuple[dict[str, int], dict[str, int]]:
    """PCIe link generation and width, each as {current, max} with absent values left out,
    so a link trained below its maximum shows up."""
    q = nvml.query
    generation = _present(
        current=q("nvmlDeviceGetCurrPcieLinkGeneration", h),
        max=q("nvmlDeviceGetMaxPcieLinkGeneration", h),
    )
    width = _present(
        current=q("nvmlDeviceGetCurrPcieLinkWidth", h),
        max=q("nvmlDeviceGetMaxPcieLinkWidth", h),
    )
    return generation, width


def _read_pcie_counters(
    nvml: Nvml, h: Any, batch: _FieldBatch, integrals: GpuIntegrals
) -> tuple[float | None, float | None, Any]:
    """PCIe bytes transmitted/received and replay errors. The byte counters come from the
    field batch where the GPU has them, else from the sampler's throughput integrals."""
    tx: float | None = batch.pcie_tx_bytes
    rx: float | None = batch.pcie_rx_bytes
    if tx is None:
        tx = integrals.pcie_transmit_bytes
    if rx is None:
        rx = integrals.pcie_receive_bytes
    return tx, rx, nvml.query("nvmlDeviceGetPcieReplayCounter", h)


def _read_ecc(nvml: Nvml, h: Any) -> dict[str, int]:
    """Volatile (since driver load) ECC error totals, {corrected, uncorrected}; {} without ECC."""
    q = nvml.query
    return _present(
        corrected=q(
            "nvmlDeviceGetTotalEccErrors", h, NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_VOLATILE_ECC
        ),
        uncorrected=q(
            "nvmlDeviceGetTotalEccErrors", h, NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_VOLATILE_ECC
        ),
    )


def _read_row_remap(nvml: Nvml, h: Any) -> tuple[dict[str, int], bool | None, bool | None]:
    """Remapped rows by kind, and the pending/failure flags that make a GPU unhealthy;
    ({}, None, None) on GPUs without row remapping."""
    remap = nvml.query("nvmlDeviceGetRemappedRows", h)
    if remap is None:
        return {}, None, None
    rows = {"correctable": int(remap[0]), "uncorrectable": int(remap[1])}
    return rows, bool(remap[2]), bool(remap[3])


def _temperatures(gpu: Any, batch: _FieldBatch) -> dict[str, float]:
    """Die temperature from NVML's call, memory (HBM) temperature from the field batch."""
    temperatures = {"gpu": float(gpu)} if gpu is not None else {}
    if batch.memory_temperature is not None:
        temperatures["memory"] = float(batch.memory_temperature)
    return temperatures


@dataclass(frozen=True, slots=True)
class _FieldBatch:
    """What one device's batched field request read (`_read_fields`); None where NVML gave no
    value."""

    memory_temperature: float | None
    pcie_tx_bytes: int | None
    pcie_rx_bytes: int | None
    nvlinks: tuple[NvLink, ...]
    recovery_action: int | None


def nvlink_count(nvml: Nvml, device: Device) -> int:
    """The device's NVLink count (0 without NVLink), asked of NVML once and remembered."""
    if device.nvlink_count is None:
        (count,) = nvml.field_values(device.handle, [(fields.NVLINK_LINK_COUNT, 0)])
        device.nvlink_count = int(count) if count is not None else 0
    return device.nvlink_count


def _read_fields(nvml: Nvml, device: Device) -> _FieldBatch:
    """All field values of one device in one nvmlDeviceGetFieldValues call."""
    nvlink5 = device.identity.architecture in NVLINK5_ARCHITECTURES
    request = fields.device_fields(nvlink_count(nvml, device), nvlink5=nvlink5)
    values = nvml.field_values(device.handle, request.ids)
    got = dict(zip(request.keys, values, strict=True))

    links: list[NvLink] = []
    for link in range(nvlink_count(nvml, device)):
        state = got.get(("nvlink_state", link))
        tx_kib = got.get(("nvlink_tx", link))
        rx_kib = got.get(("nvlink_rx", link))
        errors = {
            kind: int(v)
            for kind in fields.NVLINK_ERROR_KINDS
            if (v := got.get((f"nvlink_{kind}", link))) is not None
        }
        if state is None and tx_kib is None and rx_kib is None and not errors:
            continue
        links.append(
            NvLink(
                link=link,
                up=bool(state) if state is not None else None,
                transmit_bytes=int(tx_kib) * 1024 if tx_kib is not None else None,
                receive_bytes=int(rx_kib) * 1024 if rx_kib is not None else None,
                errors=errors,
            )
        )
    tx = got.get(("pcie_tx", 0))
    rx = got.get(("pcie_rx", 0))
    mem_temp = got.get(("memory_temp", 0))
    action = got.get(("recovery_action", 0))
    return _FieldBatch(
        memory_temperature=float(mem_temp) if mem_temp is not None else None,
        pcie_tx_bytes=int(tx) if tx is not None else None,
        pcie_rx_bytes=int(rx) if rx is not None else None,
        nvlinks=tuple(links),
        recovery_action=int(action) if action is not None else None,
    )


def _read_mig(nvml: Nvml, handle: Any) -> tuple[MigInstance, ...]:
    count = nvml.query("nvmlDeviceGetMaxMigDeviceCount", handle) or 0
    instances: list[MigInstance] = []
    for i in range(int(count)):
        mig = nvml.query(  # empty slots answer NOT_FOUND
            "nvmlDeviceGetMigDeviceHandleByIndex", handle, i, absent=frozenset({NOT_FOUND})
        )
        if mig is None:
            continue
        uuid = nvml.query("nvmlDeviceGetUUID", mig)
        if uuid is None:
            continue
        name = text(nvml.query("nvmlDeviceGetName", mig) or "")
        memory = nvml.query("nvmlDeviceGetMemoryInfo", mig)
        gi = nvml.query("nvmlDeviceGetGpuInstanceId", mig)
        ci = nvml.query("nvmlDeviceGetComputeInstanceId", mig)
        instances.append(
            MigInstance(
                mig_uuid=text(uuid),
                profile=mig_profile(name),
                gpu_instance=int(gi) if gi is not None else -1,
                compute_instance=int(ci) if ci is not None else -1,
                memory_used_bytes=int(memory.used) if memory is not None else None,
                memory_total_bytes=int(memory.total) if memory is not None else None,
            )
        )
    return tuple(instances)


def mig_profile(name: str) -> str:
    """`NVIDIA A100-SXM4-80GB MIG 3g.40gb` -> `3g.40gb` (the name nvidia-smi -L shows)."""
    _, sep, profile = name.rpartition("MIG ")
    return profile.strip() if sep else ""


def _present(**values: Any) -> dict[str, int]:
    return {k: int(v) for k, v in values.items() if v is not None}


def _sum_present(values: Any) -> int | None:
    total: int | None = None
    for v in values:
        if v is not None:
            total = (total or 0) + int(v)
    return total
