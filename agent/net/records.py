"""Immutable records of the network source (eBPF, per pod)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field


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
class PodName:
    """What the Kubernetes API says of a pod UID; the attribution stage fills these in."""

    namespace: str
    pod: str
    workload_kind: str
    workload: str
    containers: Mapping[str, str] = field(default_factory=dict)  # runtime id -> name


@dataclass(frozen=True, slots=True)
class NetSnapshot:
    pods: tuple[PodNetwork, ...]
    probes: Mapping[str, str]  # probe -> mode (tracepoint, cgroup_skb, absent)
    map_full: Mapping[str, int]  # failed inserts per map since load
    map_entries: Mapping[str, int]
    map_max_entries: Mapping[str, int]
    # By pod UID, from the attribution stage (one mapping per pod list, shared by scrapes);
    # empty until the Kubernetes API has named the pods. Pods it lacks keep only `pod_uid`.
    names: Mapping[str, PodName] = field(default_factory=dict)
