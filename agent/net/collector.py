"""Declarations of the network collectors: `net` (per-pod traffic through eBPF), `nic` and
`rdma` (device counters from sysfs)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuscope.agent.runtime.options import NoOptions, flag, one_of
from gpuscope.agent.runtime.spec import BuildContext, CollectorSpec, HostOptions

if TYPE_CHECKING:
    from gpuscope.agent.net.records import NetSnapshot, NicSnapshot, RdmaSnapshot
    from gpuscope.agent.net.source import NetConfig
    from gpuscope.agent.runtime.sources import Source

# Map sizes the kernel can allocate, checked at parse time (a larger one was accepted, then
# failed at load with "Argument list too long"). A hash map takes at most 2**27 entries (its
# power-of-two buckets must fit a u32 of bytes) and the RTT map holds 16 per cgroup; the TCP
# and socket maps are preallocated, so these bounds (about 100 MB and 300 MB of kernel
# memory) are also where a typo would start costing the node real memory. A node runs a few
# thousand cgroups and a few hundred thousand sockets at most.
MAX_BPF_CGROUPS = 2**20
MAX_BPF_SOCKETS = 2**22


def _map_size(most: int, what: str) -> Callable[[int], str | None]:
    def check(v: int) -> str | None:
        return None if 1 <= v <= most else f"expected 1 to {most} {what}, got {v}"

    return check


@dataclass(frozen=True, slots=True)
class NetOptions:
    """The `net` collector's flags, which `gpuscope bpf-load` reads too (`net_config`): what the
    probes count, how large their maps are, and where the kernel headers and the pins are."""

    net_per_container: bool = flag(
        False, "network series per container, not only per pod (true/false)"
    )
    net_prune_grace: float = flag(
        60.0,
        "seconds before a vanished cgroup's series go",
        check=lambda v: None if v >= 0 else f"expected seconds >= 0, got {v:g}",
    )
    net_traffic_mode: str = flag(
        "auto",
        "auto, tracepoint or cgroup_skb (auto: tracepoints where the kernel has them)",
        parse=one_of("auto", "tracepoint", "cgroup_skb"),
    )
    bpf_max_cgroups: int = flag(
        8192,
        f"cgroups the BPF maps can hold (at most {MAX_BPF_CGROUPS})",
        check=_map_size(MAX_BPF_CGROUPS, "cgroups"),
    )
    bpf_max_sockets: int = flag(
        262144,
        f"TCP sockets the BPF socket map can hold (at most {MAX_BPF_SOCKETS})",
        check=_map_size(MAX_BPF_SOCKETS, "sockets"),
    )
    kernel_modules: Path = flag(
        Path("/lib/modules"),
        "where the host's /lib/modules is (bcc finds the kernel headers there)",
    )
    kernel_headers: Path = flag(
        Path("/usr/src/gpuscope-kernel-headers"),
        "fallback kernel header tree for bcc, where the host has none",
    )
    bpf_pin_root: Path = flag(
        Path("/sys/fs/bpf/gpuscope"),
        "where `gpuscope bpf-load` pins the probes' maps and links (on bpffs); the agent "
        "runs it itself when the pins for its options are not there",
    )


def net_config(agent: HostOptions, o: NetOptions) -> NetConfig:
    """The net source's configuration from the flags: what the agent runs and what
    `gpuscope bpf-load` loads for it."""
    from gpuscope.agent.net.bpf_program import MapLimits
    from gpuscope.agent.net.source import NetConfig

    return NetConfig(
        sysfs=agent.sysfs,
        procfs=agent.procfs,
        cgroup_root=agent.cgroup_root,
        per_container=o.net_per_container,
        prune_grace=o.net_prune_grace,
        traffic_mode=o.net_traffic_mode,
        limits=MapLimits(cgroups=o.bpf_max_cgroups, sockets=o.bpf_max_sockets),
        modules_dir=o.kernel_modules,
        fallback_headers=o.kernel_headers,
        pin_root=o.bpf_pin_root,
    )


def _build_net(ctx: BuildContext[NetOptions]) -> Source[NetSnapshot]:
    from gpuscope.agent.net.source import NetSource

    return NetSource(net_config(ctx.agent, ctx.options), clock=ctx.clock)


def _build_nic(ctx: BuildContext[NoOptions]) -> Source[NicSnapshot]:
    from gpuscope.agent.net.nic import NicSource

    return NicSource(ctx.agent.sysfs)


def _build_rdma(ctx: BuildContext[NoOptions]) -> Source[RdmaSnapshot]:
    from gpuscope.agent.net.rdma import RdmaSource

    return RdmaSource(ctx.agent.sysfs)


NET: CollectorSpec[NetSnapshot, NetOptions] = CollectorSpec(
    name="net",
    summary="Per-pod TCP/UDP traffic, retransmits, connections and RTT from eBPF probes, "
    "aggregated in the kernel by cgroup.",
    options=NetOptions,
    build=_build_net,
    renderer="gpuscope.exporters.prometheus.net:RENDERER",
    metrics="gpuscope.exporters.prometheus.catalog_net:NET_METRICS",
)

NIC: CollectorSpec[NicSnapshot, NoOptions] = CollectorSpec(
    name="nic",
    summary="Physical network interfaces from sysfs: bytes, packets, errors, speed, MTU.",
    options=NoOptions,
    build=_build_nic,
    renderer="gpuscope.exporters.prometheus.net_devices:NIC_RENDERER",
    metrics="gpuscope.exporters.prometheus.catalog_nic:NIC_METRICS",
)

RDMA: CollectorSpec[RdmaSnapshot, NoOptions] = CollectorSpec(
    name="rdma",
    summary="RDMA devices (InfiniBand, RoCE) from sysfs: port state, rate, traffic and "
    "error counters.",
    options=NoOptions,
    build=_build_rdma,
    renderer="gpuscope.exporters.prometheus.net_devices:RDMA_RENDERER",
    metrics="gpuscope.exporters.prometheus.catalog_nic:RDMA_METRICS",
)
