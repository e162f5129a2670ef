"""AMD's GPU records (the accelerator contract with AMD's extension) -> Prometheus samples,
under the same family names as NVIDIA's where the meaning is the same (catalog_amd.py).

Device series carry `gpu` and `uuid` only, as NVIDIA's; `gpu` is the GPU's position on the
node (AMD SMI's socket order). At the default detail level the families declared
`at_default="some"` are rendered in part, as NVIDIA's are: the exceptions a healthy GPU
does not have (a link down, a throttle reason that applies, a stuck GPU)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

from gpuscope.agent.amd.collector import AMD, AmdOptions
from gpuscope.agent.amd.records import AmdGpus, AmdReading, amd, node
from gpuscope.exporters.prometheus.catalog_amd import AMD_METRICS
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
    from gpuscope.agent.accelerators.records import AcceleratorReading
    from gpuscope.exporters.prometheus.families import Families

# The clocks served at the default level, as for NVIDIA: the compute clock and memory; the
# temperatures: the die, the memory and the board edge (the per-HBM-stack ones at full detail).
DEFAULT_CLOCKS = frozenset({"sm", "memory"})
DEFAULT_SENSORS = frozenset({"gpu", "memory", "edge"})


def render_amd(
    snapshot: AmdGpus, out: Families, ctx: RenderContext[AmdOptions] | None = None
) -> None:
    for reading in snapshot.gpus:
        _render_one(snapshot, reading, out)


def _render_one(snapshot: AmdGpus, r: AcceleratorReading[AmdReading], out: Families) -> None:
    """One GPU. A GPU that is down keeps its info, `up` and event series and gets nothing
    else."""
    dev = device_labels(r)
    x = amd(r)
    ident = r.identity
    out.add(
        "gpuscope_gpu_info",
        (
            *dev,
            ident.model,
            ident.pci_bus_id,
            ident.serial,
            ident.architecture,
            x.gfx_target,
            str(ident.numa_node) if ident.numa_node is not None else "",
            snapshot.driver_version,
            "",
            "",
            snapshot.vendor,
        ),
        1,
    )
    out.add("gpuscope_gpu_up", dev, 1 if r.up else 0)
    add_stuck(out, dev, r)
    for event, count in sorted(x.events.items()):
        out.add("gpuscope_gpu_events_total", (*dev, event), count)
    watched = node(snapshot).events_watched
    if watched is not None:
        is_watched = dev[1] in watched
        if not is_watched or out.full("gpuscope_gpu_events_watched"):
            out.add("gpuscope_gpu_events_watched", dev, 1 if is_watched else 0)
    if dev[1] in snapshot.processes_refused:
        out.add("gpuscope_gpu_processes_refused", dev, 1)
    if x.package is not None:
        out.add("gpuscope_gpu_package_info", (*dev, str(x.package)), 1)
    if not r.up:
        return
    _render_partitions(r, x, dev, out)
    _render_scalars(r, x, dev, out)
    _render_labelled(r, x, dev, out)
    _render_xgmi(r, dev, out)


def _render_partitions(
    r: AcceleratorReading[AmdReading], x: AmdReading, dev: DeviceLabels, out: Families
) -> None:
    modes = (x.compute_partition, x.memory_partition, x.activity_source)
    if not r.partitions:
        out.add("gpuscope_gpu_partition_info", (*dev, "", "", *modes), 1)
        return
    for p in r.partitions:
        plugin_id = next((i for i in p.ids if i != p.uuid), "")
        out.add("gpuscope_gpu_partition_info", (*dev, p.uuid, plugin_id, *modes), 1)
        if p.busy_seconds is not None:
            out.add("gpuscope_partition_busy_seconds_total", (*dev, p.uuid), p.busy_seconds)


def _render_scalars(
    r: AcceleratorReading[AmdReading], x: AmdReading, dev: DeviceLabels, out: Families
) -> None:
    """One sample per family with only the device labels; a value the library lacked is
    left out rather than exported as 0."""
    scalars: tuple[tuple[str, float | int | None], ...] = (
        ("gpuscope_gpu_utilization_ratio", r.utilization_ratio),
        ("gpuscope_gpu_memory_utilization_ratio", r.memory_utilization_ratio),
        ("gpuscope_gpu_busy_seconds_total", r.busy_seconds),
        ("gpuscope_gpu_last_active_timestamp_seconds", r.last_active_timestamp),
        ("gpuscope_gpu_memory_used_bytes", r.memory_used_bytes),
        ("gpuscope_gpu_memory_total_bytes", r.memory_total_bytes),
        ("gpuscope_gpu_power_watts", r.power_watts),
        ("gpuscope_gpu_power_limit_watts", r.power_limit_watts),
        ("gpuscope_gpu_energy_joules_total", r.energy_joules),
        ("gpuscope_gpu_pcie_replay_errors_total", r.pcie_replay_errors),
        ("gpuscope_gpu_pcie_recoveries_total", x.pcie_recoveries),
        ("gpuscope_gpu_xgmi_transmit_bytes_total", r.link_transmit_bytes),
        ("gpuscope_gpu_xgmi_receive_bytes_total", r.link_receive_bytes),
    )
    add_scalars(out, dev, scalars)
    add_unsampled(out, dev, r)


def _render_labelled(
    r: AcceleratorReading[AmdReading], x: AmdReading, dev: DeviceLabels, out: Families
) -> None:
    clocks: Mapping[str, float] = r.clocks_hertz
    if not out.full("gpuscope_gpu_clock_hertz"):
        clocks = {k: v for k, v in clocks.items() if k in DEFAULT_CLOCKS}
    temperatures: Mapping[str, float] = r.temperatures_celsius
    if not out.full("gpuscope_gpu_temperature_celsius"):
        temperatures = {k: v for k, v in temperatures.items() if k in DEFAULT_SENSORS}
    reasons: Mapping[str, bool] = r.throttle_reasons
    if not out.full("gpuscope_gpu_throttle_reasons"):
        reasons = {k: v for k, v in reasons.items() if v}
    labelled = (
        ("gpuscope_gpu_temperature_celsius", temperatures),
        ("gpuscope_gpu_clock_hertz", clocks),
        ("gpuscope_gpu_clock_max_hertz", r.clocks_max_hertz),
        ("gpuscope_gpu_throttle_reasons", reasons),
        ("gpuscope_gpu_throttle_seconds_total", x.throttle_seconds),
        ("gpuscope_gpu_pcie_link_generation", r.pcie_link_generation),
        ("gpuscope_gpu_pcie_link_width", r.pcie_link_width),
        ("gpuscope_gpu_ecc_errors_total", r.ecc_errors),
        ("gpuscope_gpu_retired_pages", x.bad_pages),
    )
    add_labelled(out, dev, labelled)


def _render_xgmi(r: AcceleratorReading[AmdReading], dev: DeviceLabels, out: Families) -> None:
    """Per GPU the links up and down; per link the state of those down (every link at full
    detail) and the throughput at full detail."""
    links = r.links
    add_link_states(out, dev, "gpuscope_gpu_xgmi_links", links)
    every = out.full("gpuscope_gpu_xgmi_link_up")
    for link in links:
        link_id = str(link.link)
        if link.up is not None and (every or link.up is False):
            out.add("gpuscope_gpu_xgmi_link_up", (*dev, link_id), 1 if link.up else 0)
        if link.transmit_bytes is not None:
            out.add(
                "gpuscope_gpu_xgmi_link_transmit_bytes_total", (*dev, link_id), link.transmit_bytes
            )
        if link.receive_bytes is not None:
            out.add(
                "gpuscope_gpu_xgmi_link_receive_bytes_total", (*dev, link_id), link.receive_bytes
            )


RENDERER: Renderer[AmdGpus, AmdOptions] = Renderer(AMD, AMD_METRICS, render_amd)
"""Metrics of the `amd` collector (AMD SMI)."""
