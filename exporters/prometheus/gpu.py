"""NVIDIA's GPU records (the accelerator contract with NVIDIA's extension) -> Prometheus
samples. Device series carry `gpu` and `uuid` only; everything
else about a GPU is on `gpuscope_gpu_info`, so device series stay stable while pods churn.

At the default detail level (exporters/prometheus/detail.py) the families declared
`at_default="some"` are rendered in part: the exceptions a healthy GPU does not have (a link
down or erroring, a throttle reason that applies, a stuck or fenced GPU) and per-GPU sums;
`out.full(name)` says when to render them whole."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

from gpuscope.agent.gpu import fields
from gpuscope.agent.gpu.collector import GPU, GpuOptions
from gpuscope.agent.gpu.records import (
    GpmActivity,
    GpuSnapshot,
    MigInstance,
    NvidiaGpu,
    NvidiaReading,
    NvLink,
    node,
    nvidia,
)
from gpuscope.exporters.prometheus.catalog_gpu import GPU_METRICS
from gpuscope.exporters.prometheus.devices import (
    DeviceLabels,
    add_labelled,
    add_link_states,
    add_scalars,
    add_stuck,
    add_unsampled,
    device_labels,
)
from gpuscope.exporters.prometheus.render import RenderContext, Renderer

if TYPE_CHECKING:
    from gpuscope.exporters.prometheus.families import Families


def render_gpu(
    snapshot: GpuSnapshot, out: Families, ctx: RenderContext[GpuOptions] | None = None
) -> None:
    """Every GPU's samples into `out`; within a family they are emitted in the order added."""
    for reading in snapshot.gpus:
        _render_one(snapshot, reading, out)


# The clocks and throttle reasons served at the default level (all of them at full detail):
# DCGM's default counters have the SM and memory clocks; "idle" is not a slowdown.
DEFAULT_CLOCKS = frozenset({"sm", "memory"})
NOT_A_SLOWDOWN = frozenset({"idle"})


def _render_one(snapshot: GpuSnapshot, r: NvidiaGpu, out: Families) -> None:
    """One GPU. A GPU that is down keeps its info, `up` and XID series, so alerts on it
    still have their labels, and gets nothing else."""
    dev = device_labels(r)
    x = nvidia(r)
    _render_info(snapshot, r, x, dev, out)
    out.add("gpuscope_gpu_up", dev, 1 if r.up else 0)
    _render_blocked(r, x, dev, out)
    for xid, count in sorted(x.xid_errors.items()):
        out.add("gpuscope_gpu_xid_errors_total", (*dev, str(xid)), count)
    xid_watched = node(snapshot).xid_watched
    if xid_watched is not None:
        watched = dev[1] in xid_watched
        if not watched or out.full("gpuscope_gpu_xid_events_watched"):
            out.add("gpuscope_gpu_xid_events_watched", dev, 1 if watched else 0)
    if dev[1] in snapshot.processes_refused:
        out.add("gpuscope_gpu_processes_refused", dev, 1)
    if not r.up:
        return
    _render_scalars(r, x, dev, out)
    _render_labelled(r, x, dev, out)
    _render_nvlinks(r.links, dev, out)
    _render_gpm("gpuscope_gpu_", dev, x.gpm, _GpuCounters(r, x), out)
    _render_mig(x.mig_instances, dev, out)


def _render_blocked(r: NvidiaGpu, x: NvidiaReading, dev: DeviceLabels, out: Families) -> None:
    """Why a GPU is not being read: stuck in a call, or fenced after a fatal XID. At full
    detail the two gauges are on every GPU (0 when it answers); at the default level, and
    the info series always, only while they apply."""
    add_stuck(out, dev, r)
    if x.fenced_xid is not None or out.full("gpuscope_gpu_fenced"):
        out.add("gpuscope_gpu_fenced", dev, 1 if x.fenced_xid is not None else 0)
    if x.fenced_xid is not None:
        out.add("gpuscope_gpu_fatal_xid_info", (*dev, str(x.fenced_xid)), 1)


def _render_info(
    snapshot: GpuSnapshot, r: NvidiaGpu, x: NvidiaReading, dev: DeviceLabels, out: Families
) -> None:
    """`gpuscope_gpu_info`: everything descriptive about a GPU, kept off the device series."""
    ident = r.identity
    out.add(
        "gpuscope_gpu_info",
        (
            *dev,
            ident.model,
            ident.pci_bus_id,
            ident.serial,
            ident.architecture,
            x.compute_capability,
            str(ident.numa_node) if ident.numa_node is not None else "",
            snapshot.driver_version,
            node(snapshot).cuda_driver_version,
            x.mig_mode or "",
            snapshot.vendor,
        ),
        1,
    )


def _render_scalars(r: NvidiaGpu, x: NvidiaReading, dev: DeviceLabels, out: Families) -> None:
    """One sample per family with only the device labels; a value NVML lacked is left out
    rather than exported as 0."""
    scalars: tuple[tuple[str, float | int | bool | None], ...] = (
        ("gpuscope_gpu_utilization_ratio", r.utilization_ratio),
        ("gpuscope_gpu_memory_utilization_ratio", r.memory_utilization_ratio),
        ("gpuscope_gpu_busy_seconds_total", r.busy_seconds),
        ("gpuscope_gpu_last_active_timestamp_seconds", r.last_active_timestamp),
        ("gpuscope_gpu_memory_used_bytes", r.memory_used_bytes),
        ("gpuscope_gpu_memory_total_bytes", r.memory_total_bytes),
        ("gpuscope_gpu_memory_reserved_bytes", r.memory_reserved_bytes),
        ("gpuscope_gpu_power_watts", r.power_watts),
        ("gpuscope_gpu_power_limit_watts", r.power_limit_watts),
        ("gpuscope_gpu_energy_joules_total", r.energy_joules),
        ("gpuscope_gpu_pcie_transmit_bytes_total", r.pcie_transmit_bytes),
        ("gpuscope_gpu_pcie_receive_bytes_total", r.pcie_receive_bytes),
        ("gpuscope_gpu_pcie_replay_errors_total", r.pcie_replay_errors),
        ("gpuscope_gpu_nvlink_transmit_bytes_total", r.link_transmit_bytes),
        ("gpuscope_gpu_nvlink_receive_bytes_total", r.link_receive_bytes),
        ("gpuscope_gpu_row_remap_pending", x.row_remap_pending),
        ("gpuscope_gpu_row_remap_failure", x.row_remap_failure),
    )
    add_scalars(out, dev, scalars)
    add_unsampled(out, dev, r)
    if x.recovery_action is not None:
        action = fields.recovery_action_name(x.recovery_action)
        code = str(x.recovery_action)
        out.add("gpuscope_gpu_recovery_action_info", (*dev, action, code), 1)


def _render_labelled(r: NvidiaGpu, x: NvidiaReading, dev: DeviceLabels, out: Families) -> None:
    """Families with one extra label (sensor, clock, reason, current/max, error kind), one
    sample per key the reading has, in the reading's own key order; at the default level
    the SM and memory clocks and the reasons that hold the clocks down."""
    labelled: tuple[tuple[str, Mapping[str, float] | Mapping[str, int] | Mapping[str, bool]], ...]
    clocks, reasons = r.clocks_hertz, r.throttle_reasons
    if not out.full("gpuscope_gpu_clock_hertz"):
        clocks = {k: v for k, v in clocks.items() if k in DEFAULT_CLOCKS}
    if not out.full("gpuscope_gpu_throttle_reasons"):
        reasons = {k: v for k, v in reasons.items() if v and k not in NOT_A_SLOWDOWN}
    labelled = (
        ("gpuscope_gpu_temperature_celsius", r.temperatures_celsius),
        ("gpuscope_gpu_clock_hertz", clocks),
        ("gpuscope_gpu_clock_max_hertz", r.clocks_max_hertz),
        ("gpuscope_gpu_throttle_reasons", reasons),
        ("gpuscope_gpu_pcie_link_generation", r.pcie_link_generation),
        ("gpuscope_gpu_pcie_link_width", r.pcie_link_width),
        ("gpuscope_gpu_ecc_errors_total", r.ecc_errors),
        ("gpuscope_gpu_remapped_rows_total", x.remapped_rows),
    )
    add_labelled(out, dev, labelled)


def _render_nvlinks(links: Sequence[NvLink], dev: DeviceLabels, out: Families) -> None:
    """Per GPU: how many links are up and down, errors summed over the links by type, and
    the throughput totals (a scalar above). Per link: state and errors of the links that are
    down or have errors at the default level (every link at full detail), throughput only
    at full detail or with --nvlink-per-link (18 series per H100 each)."""
    if not links:
        return
    add_link_states(out, dev, "gpuscope_gpu_nvlink_links", links)
    totals: dict[str, int] = {}
    for link in links:
        for kind, count in link.errors.items():
            totals[kind] = totals.get(kind, 0) + count
    for kind, count in totals.items():
        out.add("gpuscope_gpu_nvlink_errors_total", (*dev, kind), count)
    every_up = out.full("gpuscope_gpu_nvlink_link_up")
    every_errors = out.full("gpuscope_gpu_nvlink_link_errors_total")
    for link in links:
        link_id = str(link.link)
        troubled = link.up is False or any(link.errors.values())
        if link.up is not None and (every_up or troubled):
            out.add("gpuscope_gpu_nvlink_link_up", (*dev, link_id), 1 if link.up else 0)
        if every_errors or troubled:
            for kind, count in link.errors.items():
                out.add("gpuscope_gpu_nvlink_link_errors_total", (*dev, link_id, kind), count)
        if link.transmit_bytes is not None:
            out.add(
                "gpuscope_gpu_nvlink_link_transmit_bytes_total",
                (*dev, link_id),
                link.transmit_bytes,
            )
        if link.receive_bytes is not None:
            out.add(
                "gpuscope_gpu_nvlink_link_receive_bytes_total", (*dev, link_id), link.receive_bytes
            )


def _render_mig(instances: Sequence[MigInstance], dev: DeviceLabels, out: Families) -> None:
    """MIG instances: `gpuscope_mig_info` joins a MIG UUID to its GPU, profile and instance
    ids, so the memory series carry the MIG UUID alone."""
    for mig in instances:
        out.add(
            "gpuscope_mig_info",
            (*dev, mig.mig_uuid, mig.profile, str(mig.gpu_instance), str(mig.compute_instance)),
            1,
        )
        if mig.memory_used_bytes is not None:
            out.add("gpuscope_mig_memory_used_bytes", (mig.mig_uuid,), mig.memory_used_bytes)
        if mig.memory_total_bytes is not None:
            out.add("gpuscope_mig_memory_total_bytes", (mig.mig_uuid,), mig.memory_total_bytes)
    for mig in instances:
        if mig.integrals is not None:
            _render_gpm("gpuscope_mig_", (*dev, mig.mig_uuid), mig.gpm, mig.integrals, out)
    for mig in instances:  # a device fact: served whether or not the kubelet answers
        if mig.integrals is not None and mig.integrals.busy_seconds is not None:
            out.add(
                "gpuscope_mig_busy_seconds_total", (*dev, mig.mig_uuid), mig.integrals.busy_seconds
            )


class _GpmCounters(Protocol):
    @property
    def sm_active_seconds(self) -> float | None: ...
    @property
    def tensor_active_seconds(self) -> float | None: ...
    @property
    def dram_active_seconds(self) -> float | None: ...


class _GpuCounters:
    """A GPU's GPM counters: SM-active seconds are the contract's, the rest NVIDIA's."""

    def __init__(self, r: NvidiaGpu, x: NvidiaReading) -> None:
        self.sm_active_seconds = r.sm_active_seconds
        self.tensor_active_seconds = x.tensor_active_seconds
        self.dram_active_seconds = x.dram_active_seconds


def _render_gpm(
    prefix: str,
    labels: tuple[str, ...],
    gpm: GpmActivity | None,
    counters: _GpmCounters,
    out: Families,
) -> None:
    """GPM ratios of the last window and the seconds counters, for a GPU or a MIG device;
    nothing where the GPU has no GPM (the counters are None), never zeros."""
    if gpm is not None:
        ratios = (
            ("sm_active_ratio", gpm.sm_active),
            ("sm_occupancy_ratio", gpm.sm_occupancy),
            ("graphics_engine_active_ratio", gpm.graphics_engine_active),
            ("tensor_active_ratio", gpm.tensor_active),
            ("dram_active_ratio", gpm.dram_active),
        )
        for suffix, value in ratios:
            if value is not None:
                out.add(prefix + suffix, labels, value)
        for pipe, value in gpm.pipes.items():
            out.add(prefix + "pipe_active_ratio", (*labels, pipe), value)
    seconds = (
        ("sm_active_seconds_total", counters.sm_active_seconds),
        ("tensor_active_seconds_total", counters.tensor_active_seconds),
        ("dram_active_seconds_total", counters.dram_active_seconds),
    )
    for suffix, total in seconds:
        if total is not None:
            out.add(prefix + suffix, labels, total)


RENDERER: Renderer[GpuSnapshot, GpuOptions] = Renderer(GPU, GPU_METRICS, render_gpu)
