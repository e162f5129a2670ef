"""Metrics of the `nic` (class/net) and `rdma` (class/infiniband) collectors.

Kernel counters are exported as the kernel keeps them: monotonic since the driver was
loaded (or the device reset), never reset by the agent, so rate() works across agent
restarts. Device series carry `device` (and `port`) only; driver, PCI bus id, NUMA node,
firmware and the RDMA-to-netdev link are on the `_info` series, to join on.

At the default detail level every device serves its summary (info, state, speed, bytes and
its errors summed: `at_default="all"`) and only a device with errors serves its detail
(packets, MTU, and the per-counter series that have counted: "some"); which, and why, is
in exporters/prometheus/net_devices.py.
"""

from __future__ import annotations

from gpuscope.exporters.prometheus.spec import MetricSpec

NIC = ("device",)
PORT = ("device", "port")

# When the default level serves a detail family ("some"): the same rule for both collectors.
NIC_DETAIL = (
    "At the default level, NICs with errors (gpuscope_nic_errors_summed_total above 0); "
    "every NIC at full detail."
)
NIC_COUNTER_DETAIL = (
    "At the default level, the directions that have counted (not 0) of NICs with errors "
    "(gpuscope_nic_errors_summed_total above 0); both directions of every NIC at full detail."
)
PORT_DETAIL = (
    "At the default level, ports with errors (gpuscope_rdma_port_errors_summed_total above "
    "0); every port at full detail."
)
PORT_COUNTER_DETAIL = (
    "At the default level, the counters that have counted (not 0) of ports with errors "
    "(gpuscope_rdma_port_errors_summed_total above 0); every counter the device has at "
    "full detail"
)

NIC_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "gpuscope_nic_info",
        "gauge",
        "Always 1; labels describe the NIC: driver, PCI bus id, NUMA node (empty when the "
        'platform has none), and rdma="true" when an RDMA device sits on it.',
        ("device", "driver", "pci_bus_id", "numa_node", "rdma"),
        "nic",
        "Every physical netdev: those with a parent device (`class/net/<dev>/device`). "
        "Loopback, veth, bridges, bonds, VLANs, tun/tap and vxlan are never reported.",
    ),
    MetricSpec(
        "gpuscope_nic_transmit_bytes_total",
        "counter",
        "Bytes sent through the netdev (statistics/tx_bytes). RDMA traffic bypasses the "
        "netdev: see gpuscope_rdma_port_transmit_bytes_total.",
        NIC,
        "nic",
    ),
    MetricSpec(
        "gpuscope_nic_receive_bytes_total",
        "counter",
        "Bytes received through the netdev (statistics/rx_bytes).",
        NIC,
        "nic",
    ),
    MetricSpec(
        "gpuscope_nic_transmit_packets_total",
        "counter",
        "Packets sent through the netdev (statistics/tx_packets).",
        NIC,
        "nic",
        NIC_DETAIL,
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_nic_receive_packets_total",
        "counter",
        "Packets received through the netdev (statistics/rx_packets).",
        NIC,
        "nic",
        NIC_DETAIL,
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_nic_errors_summed_total",
        "counter",
        "Packets with errors in either direction (statistics/tx_errors + rx_errors): "
        "gpuscope_nic_errors_total summed over the directions. Every NIC has it at every "
        "detail level, 0 included: alert on it. Above 0 (since the driver was loaded), the "
        "NIC serves its detail at the default level too.",
        NIC,
        "nic",
        "Where the kernel has both counters and both were read (a scrape missing one leaves "
        "the series out, rather than dip like a counter reset).",
    ),
    MetricSpec(
        "gpuscope_nic_errors_total",
        "counter",
        "Packets with errors, by direction (transmit, receive): statistics/tx_errors, rx_errors.",
        ("device", "direction"),
        "nic",
        NIC_COUNTER_DETAIL,
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_nic_dropped_total",
        "counter",
        "Packets dropped, by direction (transmit, receive): statistics/tx_dropped, rx_dropped. "
        "Not errors: most NICs drop a few received frames they have no use for (an unknown "
        "protocol, a VLAN not configured).",
        ("device", "direction"),
        "nic",
        NIC_COUNTER_DETAIL,
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_nic_speed_bytes_per_second",
        "gauge",
        "Negotiated link speed (the kernel's Mb/s x 125000).",
        NIC,
        "nic",
        "While the link is up (the kernel reports no speed on a down link).",
    ),
    MetricSpec(
        "gpuscope_nic_up",
        "gauge",
        '1 if the netdev\'s operstate is "up", else 0 (down, lowerlayerdown, dormant, ...).',
        NIC,
        "nic",
    ),
    MetricSpec(
        "gpuscope_nic_mtu_bytes",
        "gauge",
        "The netdev's MTU.",
        NIC,
        "nic",
        NIC_DETAIL,
        at_default="some",
    ),
)

RDMA_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "gpuscope_rdma_port_info",
        "gauge",
        "Always 1; labels describe the RDMA port: link layer (InfiniBand, Ethernet = RoCE), "
        "HCA type, firmware, node GUID and the netdev it carries (empty if none).",
        ("device", "port", "link_layer", "hca_type", "fw_version", "node_guid", "netdev"),
        "rdma",
        "Every port of every device in class/infiniband. `hca_type` is empty where the "
        "driver has none (irdma).",
    ),
    MetricSpec(
        "gpuscope_rdma_port_transmit_bytes_total",
        "counter",
        "Bytes sent by the port, RDMA included (counters/port_xmit_data x 4).",
        PORT,
        "rdma",
        "Devices with the PortCounters set (mlx5; not irdma).",
    ),
    MetricSpec(
        "gpuscope_rdma_port_receive_bytes_total",
        "counter",
        "Bytes received by the port, RDMA included (counters/port_rcv_data x 4).",
        PORT,
        "rdma",
        "Devices with the PortCounters set (mlx5; not irdma).",
    ),
    MetricSpec(
        "gpuscope_rdma_port_transmit_packets_total",
        "counter",
        "Packets sent by the port (counters/port_xmit_packets).",
        PORT,
        "rdma",
        "Devices with the PortCounters set (mlx5; not irdma). " + PORT_DETAIL,
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_rdma_port_receive_packets_total",
        "counter",
        "Packets received by the port (counters/port_rcv_packets).",
        PORT,
        "rdma",
        "Devices with the PortCounters set (mlx5; not irdma). " + PORT_DETAIL,
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_rdma_port_errors_summed_total",
        "counter",
        "Port errors of every kind, summed: gpuscope_rdma_port_errors_total summed over its "
        "counters (congestion signals not included). Every port has it at every detail "
        "level, 0 included: alert on it. Above 0 (since the driver was loaded), the port "
        "serves its detail at the default level too.",
        PORT,
        "rdma",
        "Ports with at least one error counter, when every one of them was read (a scrape "
        "missing one leaves the series out, rather than dip like a counter reset).",
    ),
    MetricSpec(
        "gpuscope_rdma_port_errors_total",
        "counter",
        "Port errors by counter: the PortCounters error counters under their kernel names "
        "(symbol_error, link_downed, link_error_recovery, port_rcv_errors, port_xmit_discards, "
        "...) and an allow-list of driver hw_counters under normalized names "
        "(out_of_sequence, packet_seq_err, local_ack_timeout_err, roce_adp_retrans, ...). "
        "PortCounters error counters saturate at their maximum rather than wrap.",
        (*PORT, "counter"),
        "rdma",
        PORT_COUNTER_DETAIL + "; the allow-list is in agent/net/rdma.py.",
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_rdma_port_congestion_total",
        "counter",
        "Congestion signals by counter, kept apart from errors because a healthy RoCE fabric "
        "raises them all the time: cnp_sent, cnp_handled, cnp_ignored, ecn_marked_packets "
        "(RoCE, mlx5 and irdma under the same names) and port_xmit_wait (InfiniBand: ticks "
        "with data to send and no credit). Not errors, for the detail level either: every "
        "working port has counted some, so the default level serves them beside a port's "
        "errors only; --metrics-include 'gpuscope_rdma_port_congestion_total' serves every "
        "port's.",
        (*PORT, "counter"),
        "rdma",
        PORT_COUNTER_DETAIL + ": CNP and ECN counters on RoCE ports.",
        at_default="some",
    ),
    MetricSpec(
        "gpuscope_rdma_port_state",
        "gauge",
        "The port's InfiniBand PortState: 0 NOP, 1 DOWN, 2 INIT, 3 ARMED, 4 ACTIVE, "
        "5 ACTIVE_DEFER. Only 4 passes traffic.",
        PORT,
        "rdma",
    ),
    MetricSpec(
        "gpuscope_rdma_port_rate_bytes_per_second",
        "gauge",
        "Negotiated port rate (the kernel's `rate`, e.g. 400 Gb/sec (4X NDR) = 5e10).",
        PORT,
        "rdma",
        "While the physical link is up (phys_state LinkUp).",
    ),
)
