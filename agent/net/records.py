"""Immutable records of the network collectors: per-pod traffic (eBPF), NICs and RDMA
devices (sysfs), and the constants the probes and the exporters share."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuscope.agent.hostfs import Reason

PROTOCOLS = ("tcp", "udp")  # traffic_key.proto
DIRECTIONS = ("transmit", "receive")  # traffic_key.dir
RTT_SLOTS = 27  # log2 slots of srtt in microseconds: slot s holds [2^(s-1), 2^s) µs


@dataclass(frozen=True, slots=True)
class PodNetwork:
    """One pod's (or the host's, `pod_uid == ""`) traffic since the agent started.

    `container_id` is set only with --net-per-container. Counters are monotonic: traffic of
    a container that exited stays in its pod's totals until the whole pod is gone.
    """

    pod_uid: str
    container_id: str
    transmit_bytes: Mapping[str, int] = field(default_factory=dict)  # by protocol
    receive_bytes: Mapping[str, int] = field(default_factory=dict)
    transmit_calls: Mapping[str, int] = field(default_factory=dict)
    receive_calls: Mapping[str, int] = field(default_factory=dict)
    tcp_retransmits: int = 0
    connections_opened: int = 0
    connections_closed: int = 0
    rtt_slots: tuple[int, ...] = ()  # count per log2 slot: slot s = srtt in [2^(s-1), 2^s) µs
    rtt_sum_seconds: float = 0.0
    rtt_count: int = 0

    @property
    def connections_active(self) -> int:
        """Connections opened since the agent started and not closed yet."""
        return max(0, self.connections_opened - self.connections_closed)


@dataclass(frozen=True, slots=True)
class NetSnapshot:
    """The `net` collector's records at one collection: every pod's traffic (and the host's),
    the probes' modes and how full their maps are."""

    pods: tuple[PodNetwork, ...]
    probes: Mapping[str, str]  # probe -> mode (tracepoint, cgroup_skb, absent)
    map_full: Mapping[str, int]  # failed inserts per map since load
    map_entries: Mapping[str, int]
    map_max_entries: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class NicReading:
    """One physical netdev at one collection. `None`: the file was absent or unreadable."""

    device: str
    driver: str  # "" when no driver is bound
    pci_bus_id: str  # "" when the parent is not a PCI function (virtio, platform)
    numa_node: int | None
    rdma: bool
    operstate: str | None = None
    speed_bytes_per_second: int | None = None  # None on a down link
    mtu_bytes: int | None = None
    transmit_bytes: int | None = None
    receive_bytes: int | None = None
    transmit_packets: int | None = None
    receive_packets: int | None = None
    transmit_errors: int | None = None
    receive_errors: int | None = None
    transmit_dropped: int | None = None
    receive_dropped: int | None = None


@dataclass(frozen=True, slots=True)
class NicSnapshot:
    """The `nic` collector's records at one collection: every physical netdev's counters."""

    nics: tuple[NicReading, ...]
    # Files under --sysfs left out since start, by reason (agent/hostfs.py REASONS).
    dropped: Mapping[Reason, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class RdmaPort:
    """One port of an RDMA device at one collection. `None`: absent or unreadable."""

    port: int
    link_layer: str = ""  # "InfiniBand" or "Ethernet" (RoCE)
    netdev: str = ""  # the netdev this port carries traffic for; "" for none (IB, no IPoIB)
    state: int | None = None  # PORT_STATES
    state_name: str = ""
    physical_state: int | None = None  # 5 = LinkUp
    physical_state_name: str = ""
    rate_bytes_per_second: int | None = None  # None unless the physical link is up
    transmit_bytes: int | None = None
    receive_bytes: int | None = None
    transmit_packets: int | None = None
    receive_packets: int | None = None
    errors: Mapping[str, int] = field(default_factory=dict)  # allow-listed, normalized
    # False when an error counter the port lists could not be read this time: a sum over
    # `errors` would then dip below the last one and read as a counter reset.
    errors_complete: bool = True
    congestion: Mapping[str, int] = field(default_factory=dict)  # allow-listed, normalized
    counters: Mapping[str, int] = field(default_factory=dict)  # every `counters/*`, raw
    hw_counters: Mapping[str, int] = field(default_factory=dict)  # every `hw_counters/*`, raw


@dataclass(frozen=True, slots=True)
class RdmaDevice:
    """One RDMA device (`<sysfs>/class/infiniband/<name>`): what identifies it, and its ports."""

    name: str  # mlx5_0, irdma0
    node_guid: str = ""
    fw_version: str = ""
    hca_type: str = ""  # MT4129 (ConnectX-7); "" where the driver has none (irdma)
    board_id: str = ""
    ports: tuple[RdmaPort, ...] = ()


@dataclass(frozen=True, slots=True)
class RdmaSnapshot:
    """The `rdma` collector's records at one collection: every RDMA device and its ports."""

    devices: tuple[RdmaDevice, ...]
    # Files under --sysfs left out since start, by reason (agent/hostfs.py REASONS).
    dropped: Mapping[Reason, int] = field(default_factory=dict)
