"""NIC and RDMA records -> Prometheus samples. Device series carry `device` (and `port`)
only; what describes a device is on its `_info` series, so device series stay stable.

Detail levels (exporters/prometheus/detail.py), as the GPU renderers apply them. A node's
NICs and RDMA ports are most of its series when every counter is served (454 of a dgx-h100
node's 970 before #25), and a healthy device's counters say little: its error counters are
0 and stay 0. So at the default level every device serves its **summary**: `_info`, state
(`gpuscope_nic_up`, `gpuscope_rdma_port_state`), speed or rate, bytes each way and its
errors summed (`gpuscope_nic_errors_summed_total`, `gpuscope_rdma_port_errors_summed_total`,
0 included, to alert on); and a device **with errors** also serves its **detail**: packets
(an error ratio's denominator), the NIC's MTU, and the per-counter series that have counted
(errors by counter or direction, the NIC's drops, the port's congestion signals). A counter
at 0 since boot is left out even then: it says nothing, and a troubled mlx5 port has thirty.
`--metrics-detail=full` serves every series of every device; `--metrics-include` a family
whole (`out.full(name)`).

"With errors" means an errors sum above 0 **since the driver was loaded**, the counters'
own origin. It needs no memory between scrapes, and a device's detail appears once, with its
first error, and stays until the driver reloads (a reboot), so series do not come and go
with every burst. A "recently" rule (errors in the last N minutes) would churn series in and
out of the TSDB with every burst and lose the history of a flapping link between bursts.
Congestion signals (CNPs, ECN marks, InfiniBand transmit wait) do not count: every working
RoCE or InfiniBand port has counted some since boot (the fixture node's nine all have), so
they would select every port. Congestion that loses packets (out_of_buffer,
port_xmit_discards, excessive_buffer_overrun_errors) is an error counter and does count.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from gpuscope.agent.net.collector import NIC, RDMA
from gpuscope.exporters.prometheus.catalog_nic import NIC_METRICS, RDMA_METRICS
from gpuscope.exporters.prometheus.render import RenderContext, Renderer

if TYPE_CHECKING:
    from gpuscope.agent.hostfs import Reason
    from gpuscope.agent.net.records import (
        NicReading,
        NicSnapshot,
        RdmaDevice,
        RdmaPort,
        RdmaSnapshot,
    )
    from gpuscope.agent.runtime.options import NoOptions
    from gpuscope.exporters.prometheus.families import Families

Values = Iterable[tuple[str, int | None]]  # (metric or counter, value); None: absent


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
    errors = _summed(n.transmit_errors, n.receive_errors)
    troubled = bool(n.transmit_errors or n.receive_errors)
    summary: Values = (
        ("gpuscope_nic_transmit_bytes_total", n.transmit_bytes),
        ("gpuscope_nic_receive_bytes_total", n.receive_bytes),
        ("gpuscope_nic_speed_bytes_per_second", n.speed_bytes_per_second),
        ("gpuscope_nic_errors_summed_total", errors),
    )
    detail: Values = (
        ("gpuscope_nic_transmit_packets_total", n.transmit_packets),
        ("gpuscope_nic_receive_packets_total", n.receive_packets),
        ("gpuscope_nic_mtu_bytes", n.mtu_bytes),
    )
    _add_values(out, dev, summary)
    _add_detail(out, dev, detail, troubled)
    for name, transmit, receive in (
        ("gpuscope_nic_errors_total", n.transmit_errors, n.receive_errors),
        ("gpuscope_nic_dropped_total", n.transmit_dropped, n.receive_dropped),
    ):
        _add_counters(out, name, dev, (("transmit", transmit), ("receive", receive)), troubled)
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
    troubled = any(p.errors.values())
    errors = sum(p.errors.values()) if p.errors and p.errors_complete else None
    summary: Values = (
        ("gpuscope_rdma_port_transmit_bytes_total", p.transmit_bytes),
        ("gpuscope_rdma_port_receive_bytes_total", p.receive_bytes),
        ("gpuscope_rdma_port_errors_summed_total", errors),
        ("gpuscope_rdma_port_state", p.state),
        ("gpuscope_rdma_port_rate_bytes_per_second", p.rate_bytes_per_second),
    )
    detail: Values = (
        ("gpuscope_rdma_port_transmit_packets_total", p.transmit_packets),
        ("gpuscope_rdma_port_receive_packets_total", p.receive_packets),
    )
    _add_values(out, key, summary)
    _add_detail(out, key, detail, troubled)
    _add_counters(out, "gpuscope_rdma_port_errors_total", key, p.errors.items(), troubled)
    _add_counters(out, "gpuscope_rdma_port_congestion_total", key, p.congestion.items(), troubled)


def _summed(*values: int | None) -> int | None:
    """The sum of counters that are all there; None when one is missing, since a sum that
    drops a part for one scrape dips, and a dip reads as a counter reset (a false rate)."""
    if any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


def _add_values(out: Families, labels: tuple[str, ...], values: Values) -> None:
    """One series per metric with a value, under the device's labels."""
    for name, value in values:
        if value is not None:
            out.add(name, labels, value)


def _add_detail(out: Families, labels: tuple[str, ...], values: Values, troubled: bool) -> None:
    """Detail metrics of one device: a device with errors serves them at the default level;
    every device at full detail, or when the metric is included."""
    _add_values(out, labels, ((name, v) for name, v in values if troubled or out.full(name)))


def _add_counters(
    out: Families, name: str, labels: tuple[str, ...], counters: Values, troubled: bool
) -> None:
    """A per-counter family of one device (the last label says which counter): every
    counter at full detail (or when the family is included), a device with errors' counters
    that are not 0 at the default level, none of a device without errors."""
    every = out.full(name)
    if not (every or troubled):
        return
    for counter, value in counters:
        if value is not None and (every or value):
            out.add(name, (*labels, counter), value)


NIC_RENDERER: Renderer[NicSnapshot, NoOptions] = Renderer(NIC, NIC_METRICS, render_nic)
RDMA_RENDERER: Renderer[RdmaSnapshot, NoOptions] = Renderer(RDMA, RDMA_METRICS, render_rdma)
