"""The network probe family: the programs of bpf_program.py, where they attach, and the
layouts of the maps the net source reads (mirroring the C structs there)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuscope.agent.bpf.family import Attachment, MapSpec, Program
from gpuscope.agent.bpf.host import tracepoint_fields
from gpuscope.agent.bpf.layout import Layout
from gpuscope.agent.net import bpf_program
from gpuscope.agent.net.bpf_program import RETIRED_FIELDS, MapLimits, ProbePlan, program_text
from gpuscope.agent.net.records import DIRECTIONS, PROTOCOLS, RTT_SLOTS
from gpuscope.agent.runtime.sources import SourceUnavailable

TRAFFIC = MapSpec(
    "traffic",
    Layout.of(("cgroup", "u64"), ("proto", "u32"), ("dir", "u32")),
    Layout.of(("bytes", "u64"), ("calls", "u64")),
    percpu=True,
)
TCP = MapSpec(
    "tcp",
    Layout.of(("cgroup", "u64")),
    Layout.of(("opened", "u64"), ("closed", "u64"), ("retransmits", "u64"),
              ("rtt_sum_us", "u64"), ("rtt_count", "u64")),
)  # fmt: skip
RTT = MapSpec("rtt", Layout.of(("cgroup", "u64"), ("slot", "u64")), Layout.of(("samples", "u64")))
SOCKETS = MapSpec(
    "sockets",
    Layout.of(("sk", "u64")),
    Layout.of(("cgroup", "u64"), ("rtt_at", "u64"), ("flags", "u32"), ("pad", "u32")),
)
MAP_FULL = MapSpec("map_full", Layout.of(("index", "u32")), Layout.of(("failed", "u64")))

# (protocol, direction) pairs in the retired value's order, then the TCP counters and slots.
RETIRED_TRAFFIC = tuple((p, d) for p in PROTOCOLS for d in DIRECTIONS)
RETIRED = MapSpec(
    "retired",
    Layout.of(("pod_uid", "char[40]"), ("container", "char[72]")),
    Layout.of(
        *((f"{p}_{d}_bytes", "u64") for p, d in RETIRED_TRAFFIC),
        *((f"{p}_{d}_calls", "u64") for p, d in RETIRED_TRAFFIC),
        ("retransmits", "u64"), ("opened", "u64"), ("closed", "u64"),
        ("rtt_sum_us", "u64"), ("rtt_count", "u64"),
        *((f"rtt_{s}", "u64") for s in range(RTT_SLOTS)),
    ),
)  # fmt: skip
assert len(RETIRED.value.fields) == RETIRED_FIELDS

TRACEPOINTS = {
    "connections": Attachment("tracepoint__sock__inet_sock_set_state", "sock:inet_sock_set_state"),
    "retransmits": Attachment("tracepoint__tcp__tcp_retransmit_skb", "tcp:tcp_retransmit_skb"),
    "rtt": Attachment("tracepoint__tcp__tcp_probe", "tcp:tcp_probe"),
    "send": Attachment("tracepoint__sock__sock_send_length", "sock:sock_send_length"),
    "receive": Attachment("tracepoint__sock__sock_recv_length", "sock:sock_recv_length"),
}
CGROUP_SKB = (
    Attachment("gpuscope_egress", "cgroup_skb:egress"),
    Attachment("gpuscope_ingress", "cgroup_skb:ingress"),
)


def plan_probes(tracefs: Path, traffic_mode: str = "auto") -> ProbePlan:
    """Feature detection: which tracepoints this kernel has, and what to fall back to."""
    send = tracepoint_fields(tracefs, "sock", "sock_send_length")
    recv = tracepoint_fields(tracefs, "sock", "sock_recv_length")
    state = tracepoint_fields(tracefs, "sock", "inet_sock_set_state")
    retrans = tracepoint_fields(tracefs, "tcp", "tcp_retransmit_skb")
    probe = tracepoint_fields(tracefs, "tcp", "tcp_probe")
    if traffic_mode == "auto":
        traffic = "tracepoint" if send is not None and recv is not None else "cgroup_skb"
    elif traffic_mode == "tracepoint" and (send is None or recv is None):
        raise SourceUnavailable("this kernel has no sock:sock_send_length/sock_recv_length")
    else:
        traffic = traffic_mode
    connections = state is not None and "skaddr" in state
    return ProbePlan(
        traffic=traffic,
        connections=connections,
        retransmits=connections and retrans is not None and "skaddr" in retrans,
        rtt=connections and probe is not None and {"skaddr", "srtt"} <= probe,
        retransmit_err=retrans is not None and "err" in retrans,
    )


def plan_maps(plan: ProbePlan) -> tuple[MapSpec, ...]:
    maps = [TRAFFIC, TCP, MAP_FULL, RETIRED]
    if plan.connections:
        maps.append(SOCKETS)
        if plan.rtt:
            maps.append(RTT)
    return tuple(maps)


def plan_attachments(plan: ProbePlan) -> tuple[Attachment, ...]:
    out = []
    if plan.connections:
        out.append(TRACEPOINTS["connections"])
        if plan.retransmits:
            out.append(TRACEPOINTS["retransmits"])
        if plan.rtt:
            out.append(TRACEPOINTS["rtt"])
    if plan.traffic == "tracepoint":
        out += [TRACEPOINTS["send"], TRACEPOINTS["receive"]]
    else:
        out += CGROUP_SKB
    return tuple(out)


@dataclass(frozen=True, slots=True)
class NetFamily:
    """The network probes with the agent's options (`--net-traffic-mode`, map sizes) and the
    cgroup v2 root (agents with different roots on one host, simulated nodes, keep apart)."""

    traffic_mode: str = "auto"
    limits: MapLimits = field(default_factory=MapLimits)
    cgroup_root: Path | None = None  # what cgroup_skb programs attach to

    @property
    def name(self) -> str:
        return "net"

    def source(self) -> str:
        return bpf_program.source()

    def request(self) -> Mapping[str, object]:
        return {
            "traffic_mode": self.traffic_mode,
            "cgroups": self.limits.cgroups,
            "sockets": self.limits.sockets,
            "cgroup_root": None if self.cgroup_root is None else str(self.cgroup_root),
        }

    def layouts(self) -> tuple[MapSpec, ...]:
        return (TRAFFIC, TCP, MAP_FULL, RETIRED, SOCKETS, RTT)

    def program(self, tracefs: Path) -> Program:
        plan = plan_probes(tracefs, self.traffic_mode)
        return Program(
            text=program_text(plan, self.limits),
            maps=plan_maps(plan),
            attachments=plan_attachments(plan),
            modes=plan.modes(),
        )
