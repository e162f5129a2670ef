"""Network records -> Prometheus samples (per pod, plus the host set)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuscope.agent.net.collector import NET, NetOptions
from gpuscope.agent.net.records import RTT_SLOTS, NetSnapshot, PodNetwork
from gpuscope.exporters.prometheus.catalog_net import NET_METRICS
from gpuscope.exporters.prometheus.render import RenderContext, Renderer

if TYPE_CHECKING:
    from gpuscope.agent.attribution.records import PodName
    from gpuscope.exporters.prometheus.families import Families

# Histogram buckets: slot s of the kernel histogram holds srtt in [2^(s-1), 2^s) µs, so its
# upper bound is 2^s µs. Slots below the first bound fold into it; above the last, +Inf.
FIRST_SLOT, LAST_SLOT = 4, 23
BOUNDS = tuple((s, 2.0**s / 1e6) for s in range(FIRST_SLOT, LAST_SLOT + 1))


def render_net(
    snapshot: NetSnapshot, out: Families, ctx: RenderContext[NetOptions] | None = None
) -> None:
    """Per-pod series are named from the attribution stage's pod names, by pod UID; without
    them (no Kubernetes API, or the stage failed) they carry `pod_uid` alone."""
    attribution = ctx.attribution if ctx is not None else None
    names = attribution.pod_names if attribution is not None else {}
    for probe, mode in sorted(snapshot.probes.items()):
        out.add("gpuscope_bpf_probe_info", (probe, mode), 1)
    for name, count in sorted(snapshot.map_full.items()):
        out.add("gpuscope_bpf_map_full_total", (name,), count)
    for name, count in sorted(snapshot.map_entries.items()):
        out.add("gpuscope_bpf_map_entries", (name,), count)
    for name, count in sorted(snapshot.map_max_entries.items()):
        out.add("gpuscope_bpf_map_max_entries", (name,), count)
    for pod in snapshot.pods:
        _render_pod(pod, names.get(pod.pod_uid) if pod.pod_uid else None, out)


def _render_pod(pod: PodNetwork, known: PodName | None, out: Families) -> None:
    if known is None:  # the host set, or a pod the Kubernetes API has not named (yet)
        who: tuple[str, ...] = ("", "", pod.pod_uid, "", "", pod.container_id)
    else:
        container = known.containers.get(pod.container_id, pod.container_id)
        who = (
            known.namespace,
            known.pod,
            pod.pod_uid,
            known.workload_kind,
            known.workload,
            container,
        )
    for name, table in (
        ("gpuscope_pod_network_transmit_bytes_total", pod.transmit_bytes),
        ("gpuscope_pod_network_receive_bytes_total", pod.receive_bytes),
        ("gpuscope_pod_network_transmit_calls_total", pod.transmit_calls),
        ("gpuscope_pod_network_receive_calls_total", pod.receive_calls),
    ):
        for protocol, value in table.items():
            out.add(name, (*who, protocol), value)
    has_tcp = (
        pod.connections_opened
        or pod.connections_closed
        or pod.tcp_retransmits
        or pod.rtt_count
        or "tcp" in pod.transmit_bytes
        or "tcp" in pod.receive_bytes
    )
    if not has_tcp:
        return
    out.add("gpuscope_pod_tcp_retransmits_total", who, pod.tcp_retransmits)
    out.add("gpuscope_pod_tcp_connections_opened_total", who, pod.connections_opened)
    out.add("gpuscope_pod_tcp_connections_closed_total", who, pod.connections_closed)
    out.add("gpuscope_pod_tcp_connections_active", who, pod.connections_active)
    if pod.rtt_count and len(pod.rtt_slots) == RTT_SLOTS:
        buckets: list[tuple[float, int]] = []
        cumulative = sum(pod.rtt_slots[:FIRST_SLOT])
        for slot, bound in BOUNDS:
            cumulative += pod.rtt_slots[slot]
            buckets.append((bound, cumulative))
        buckets.append((float("inf"), sum(pod.rtt_slots)))
        out.add_histogram("gpuscope_pod_tcp_rtt_seconds", who, buckets, pod.rtt_sum_seconds)


RENDERER: Renderer[NetSnapshot, NetOptions] = Renderer(NET, NET_METRICS, render_net)
