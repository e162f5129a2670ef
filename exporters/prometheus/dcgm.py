"""`--dcgm-compat`: NVIDIA's GPU records, and the holders the attribution stage found, as
dcgm-exporter's counters (names, types and help texts in catalog_dcgm.py).

Values are unit conversions of what the records carry, nothing kept between scrapes:
% = ratio x 100, MiB = bytes / 2^20, MHz = Hz / 10^6, mJ = J x 1000. The throughputs
(DCGM_FI_PROF_PCIE_TX/RX_BYTES, the older PCIE_TX/RX_THROUGHPUT in KiB/s, NVLINK_BANDWIDTH_TOTAL
in MB/s) are the GPU source's per-second figures (agent/gpu/source.py), the profiling ratios
the last GPM window's (agent/gpu/gpm.py). A field whose source the GPU lacks has no series.

Labels: dcgm-exporter's device labels, `Hostname` and `hostname` both the node's name, and
the holding container's (one series per holder on a time-shared GPU, each with the whole
GPU's value; empty on a free GPU). On MIG-enabled GPUs the fields DCGM has per GPU instance
also get one series per GPU instance, with GPU_I_ID and GPU_I_PROFILE and no holder (the
kubelet's allocations name the parent GPU). A GPU without a UUID gets no series (DCGM could
not name it either); a GPU that is down keeps its XID_ERRORS series only.
"""

from __future__ import annotations

from collections.abc import Iterable
from functools import partial
from typing import TYPE_CHECKING

from gpuscope.agent.gpu.collector import GPU
from gpuscope.agent.gpu.records import GpmActivity, GpuSnapshot, MigInstance, node, nvidia
from gpuscope.exporters.prometheus.catalog_dcgm import BY_NAME, dcgm_metrics
from gpuscope.exporters.prometheus.render import CompatRenderer

if TYPE_CHECKING:
    from gpuscope.agent.attribution.records import Attribution
    from gpuscope.agent.gpu.records import NvidiaGpu
    from gpuscope.exporters.prometheus.families import Families

MIB = 1 << 20
NO_HOLDER = ("", "", "")
NO_INSTANCE = ("", "")
MAX_XID = 999  # XID numbers above (none exist today) are left out, as the docs say

Values = list[tuple[str, float]]


def render_dcgm(
    snapshot: GpuSnapshot, attribution: Attribution | None, out: Families, *, node_name: str
) -> None:
    """Every GPU's dcgm-exporter series into `out`."""
    holders = _holders(attribution)
    watched = node(snapshot).xid_watched
    for r in snapshot.gpus:
        ident = r.identity
        if not ident.uuid:
            continue
        gpu = str(ident.index)
        dev = (
            gpu,
            ident.uuid,
            f"nvidia{gpu}",
            ident.model,
            node_name,
            node_name,
            ident.pci_bus_id,
            snapshot.driver_version,
        )
        values = _xid(r, watched)
        if r.up:
            values += _gpu_values(r)
        for holder in holders.get(ident.uuid) or (NO_HOLDER,):
            for name, value in values:
                extra = NO_INSTANCE if BY_NAME[name].per_gpu_instance else ()
                out.add(name, (*dev, *holder, *extra), value)
        if r.up:
            for instance, values in _gpu_instances(nvidia(r).mig_instances):
                for name, value in values:
                    out.add(name, (*dev, *NO_HOLDER, *instance), value)


def _holders(attribution: Attribution | None) -> dict[str, list[tuple[str, str, str]]]:
    """Each GPU's holding containers, once each (two MIG devices of one GPU held by one
    container are one holder of the GPU)."""
    found: dict[str, dict[tuple[str, str, str], None]] = {}
    if attribution is not None:
        for h in attribution.holdings:
            found.setdefault(h.uuid, {})[(h.namespace, h.pod, h.container)] = None
    return {uuid: list(held) for uuid, held in found.items()}


def _xid(r: NvidiaGpu, watched: frozenset[str] | None) -> Values:
    """DCGM's last-XID gauge: the highest XID number counted on the GPU since the agent
    started; 0 where the driver accepted the agent's XID registration and none came; no
    series where XIDs are not watched (an absent XID proves nothing there)."""
    counted = [xid for xid, n in nvidia(r).xid_errors.items() if n > 0 and 0 < xid <= MAX_XID]
    if counted:
        return [("DCGM_FI_DEV_XID_ERRORS", float(max(counted)))]
    if watched is not None and r.identity.uuid in watched:
        return [("DCGM_FI_DEV_XID_ERRORS", 0.0)]
    return []


def _gpu_values(r: NvidiaGpu) -> Values:
    x = nvidia(r)
    tx, rx = x.pcie_transmit_bytes_per_second, x.pcie_receive_bytes_per_second
    free = _free(r.memory_total_bytes, r.memory_used_bytes, r.memory_reserved_bytes)
    fields: list[tuple[str, float | int | bool | None]] = [
        ("DCGM_FI_DEV_SM_CLOCK", _per(r.clocks_hertz.get("sm"), 1e6)),
        ("DCGM_FI_DEV_MEM_CLOCK", _per(r.clocks_hertz.get("memory"), 1e6)),
        ("DCGM_FI_DEV_MEMORY_TEMP", r.temperatures_celsius.get("memory")),
        ("DCGM_FI_DEV_GPU_TEMP", r.temperatures_celsius.get("gpu")),
        ("DCGM_FI_DEV_POWER_USAGE", r.power_watts),
        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", _scaled(r.energy_joules, 1000)),
        ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", r.pcie_replay_errors),
        ("DCGM_FI_DEV_GPU_UTIL", _scaled(r.utilization_ratio, 100)),
        ("DCGM_FI_DEV_MEM_COPY_UTIL", _scaled(r.memory_utilization_ratio, 100)),
        ("DCGM_FI_DEV_FB_FREE", _per(free, MIB)),
        ("DCGM_FI_DEV_FB_USED", _per(r.memory_used_bytes, MIB)),
        ("DCGM_FI_DEV_FB_RESERVED", _per(r.memory_reserved_bytes, MIB)),
        ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", _per(x.nvlink_bytes_per_second, 1e6)),
        ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", x.remapped_rows.get("uncorrectable")),
        ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", x.remapped_rows.get("correctable")),
        ("DCGM_FI_DEV_ROW_REMAP_FAILURE", x.row_remap_failure),
        ("DCGM_FI_PROF_PCIE_TX_BYTES", tx),
        ("DCGM_FI_PROF_PCIE_RX_BYTES", rx),
        ("DCGM_FI_DEV_PCIE_TX_THROUGHPUT", _per(tx, 1024)),
        ("DCGM_FI_DEV_PCIE_RX_THROUGHPUT", _per(rx, 1024)),
        *_profiling(x.gpm),
    ]
    return [(name, float(v)) for name, v in fields if v is not None]


def _gpu_instances(
    migs: Iterable[MigInstance],
) -> list[tuple[tuple[str, str], Values]]:
    """One entry per MIG GPU instance: (GPU_I_ID, GPU_I_PROFILE) and its values. Several
    compute instances of one GPU instance are one DCGM entity: their MIG devices read the
    same memory and GPM window, merged by max (the profile is the first device's)."""
    by_instance: dict[int, list[MigInstance]] = {}
    for mig in migs:
        by_instance.setdefault(mig.gpu_instance, []).append(mig)
    out = []
    for gpu_instance, devices in sorted(by_instance.items()):
        devices.sort(key=lambda m: m.compute_instance)
        merged: dict[str, float] = {}
        for mig in devices:
            free = _free(mig.memory_total_bytes, mig.memory_used_bytes, None)
            fields: list[tuple[str, float | int | None]] = [
                ("DCGM_FI_DEV_FB_USED", _per(mig.memory_used_bytes, MIB)),
                ("DCGM_FI_DEV_FB_FREE", _per(free, MIB)),
                *_profiling(mig.gpm),
            ]
            for name, v in fields:
                if v is not None:
                    merged[name] = max(merged.get(name, float(v)), float(v))
        out.append(((str(gpu_instance), devices[0].profile), list(merged.items())))
    return out


def _profiling(gpm: GpmActivity | None) -> list[tuple[str, float | None]]:
    if gpm is None:
        return []
    return [
        ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", gpm.graphics_engine_active),
        ("DCGM_FI_PROF_SM_ACTIVE", gpm.sm_active),
        ("DCGM_FI_PROF_SM_OCCUPANCY", gpm.sm_occupancy),
        ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", gpm.tensor_active),
        ("DCGM_FI_PROF_DRAM_ACTIVE", gpm.dram_active),
        ("DCGM_FI_PROF_PIPE_FP64_ACTIVE", gpm.pipes.get("fp64")),
        ("DCGM_FI_PROF_PIPE_FP32_ACTIVE", gpm.pipes.get("fp32")),
        ("DCGM_FI_PROF_PIPE_FP16_ACTIVE", gpm.pipes.get("fp16")),
    ]


def _free(total: int | None, used: int | None, reserved: int | None) -> int | None:
    """NVML's free: total - reserved - used where the driver reports its reservation
    (nvmlDeviceGetMemoryInfo_v2, as DCGM reads it), else total - used."""
    if total is None or used is None:
        return None
    return total - (reserved or 0) - used


def _scaled(value: float | None, factor: float) -> float | None:
    return None if value is None else value * factor


def _per(value: float | None, unit: float) -> float | None:
    """`value` in `unit`s (divided, as the docs write each conversion)."""
    return None if value is None else value / unit


def compat_renderer(variant: str, node_name: str) -> CompatRenderer[GpuSnapshot]:
    """What the exporter is handed for `--dcgm-compat <variant>`."""
    return CompatRenderer(
        name="dcgm-compat",
        records=GPU,
        metrics=dcgm_metrics(variant),
        render=partial(render_dcgm, node_name=node_name),
    )
