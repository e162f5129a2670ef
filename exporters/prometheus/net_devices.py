"""NIC and RDMA records -> Prometheus samples. Device series carry `device` (and `port`)
only; what describes a device is on its `_info` series, so device series stay stable."""

from __future__ import annotations

from collections.abc import Mapping

from gpuscope.agent.hostfs import Reason
from gpuscope.agent.net.collector import NIC, RDMA
from gpuscope.agent.net.records import (
    NicReading,
    NicSnapshot,
    RdmaDevice,
    RdmaPort,
    RdmaSnapshot,
)
from gpuscope.agent.runtime.options import NoOptions
from gpuscope.exporters.prometheus.catalog_nic import NIC_METRICS, RDMA_METRICS
from gpuscope.exporters.prometheus.families import Families
from gpuscope.exporters.prometheus.render import RenderContext, Renderer


def render_nic(
    snapshot: NicSnapshot, out: Families, _ctx: RenderContext[NoOptions] | None = None
) -> None:
    for nic in snapshot.nics:
        _render_nic(nic, out)
    _render_dropped("nic", snapshot.dropped, out)


def _render_nic(n: NicReading, out: Families) -> None:
    dev = (n.device,)
    numa = str(n.numa_node) if n.numa_node is not None else ""
    out.add(
        "gpuscope_nic_info",
        (n.device, n.driver, n.pci_bus_id, numa, "true" if n.rdma else "false"),
        1,
    )
    scalars: tuple[tuple[str, int | None], ...] = (
        ("gpuscope_nic_transmit_bytes_total", n.transmit_bytes),
        ("gpuscope_nic_receive_bytes_total", n.receive_bytes),
        ("gpuscope_nic_transmit_packets_total", n.transmit_packets),
        ("gpuscope_nic_receive_packets_total", n.receive_packets),
        ("gpuscope_nic_speed_bytes_per_second", n.speed_bytes_per_second),
        ("gpuscope_nic_mtu_bytes", n.mtu_bytes),
    )
    for name, value in scalars:
        if value is not None:
            out.add(name, dev, value)
    by_direction: tuple[tuple[str, str, int | None], ...] = (
        ("gpuscope_nic_errors_total", "transmit", n.transmit_errors),
        ("gpuscope_nic_errors_total", "receive", n.receive_errors),
        ("gpuscope_nic_dropped_total", "transmit", n.transmit_dropped),
        ("gpuscope_nic_dropped_total", "receive", n.receive_dropped),
    )
    for name, direction, value in by_direction:
        if value is not None:
            out.add(name, (n.device, direction), value)
    if n.operstate is not None:
        out.add("gpuscope_nic_up", dev, 1 if n.operstate == "up" else 0)


def render_rdma(
    snapshot: RdmaSnapshot, out: Families, _ctx: RenderContext[NoOptions] | None = None
) -> None:
    for device in snapshot.devices:
        for port in device.ports:
            _render_port(device, port, out)
    if snapshot.devices or any(snapshot.dropped.values()):  # a node without RDMA: nothing
        _render_dropped("rdma", snapshot.dropped, out)


def _render_dropped(stage: str, dropped: Mapping[Reason, int], out: Families) -> None:
    """Files under --sysfs this collector left out (a loop, unreadable, over the cap)."""
    for reason, count in dropped.items():
        out.add("gpuscope_inputs_dropped_total", (stage, reason), count)


def _render_port(d: RdmaDevice, p: RdmaPort, out: Families) -> None:
    key = (d.name, str(p.port))
    out.add(
        "gpuscope_rdma_port_info",
        (*key, p.link_layer, d.hca_type, d.fw_version, d.node_guid, p.netdev),
        1,
    )
    scalars: tuple[tuple[str, int | None], ...] = (
        ("gpuscope_rdma_port_transmit_bytes_total", p.transmit_bytes),
        ("gpuscope_rdma_port_receive_bytes_total", p.receive_bytes),
        ("gpuscope_rdma_port_transmit_packets_total", p.transmit_packets),
        ("gpuscope_rdma_port_receive_packets_total", p.receive_packets),
        ("gpuscope_rdma_port_state", p.state),
        ("gpuscope_rdma_port_rate_bytes_per_second", p.rate_bytes_per_second),
    )
    for name, value in scalars:
        if value is not None:
            out.add(name, key, value)
    for counter, value in p.errors.items():
        out.add("gpuscope_rdma_port_errors_total", (*key, counter), value)
    for counter, value in p.congestion.items():
        out.add("gpuscope_rdma_port_congestion_total", (*key, counter), value)


NIC_RENDERER: Renderer[NicSnapshot, NoOptions] = Renderer(NIC, NIC_METRICS, render_nic)
RDMA_RENDERER: Renderer[RdmaSnapshot, NoOptions] = Renderer(RDMA, RDMA_METRICS, render_rdma)
