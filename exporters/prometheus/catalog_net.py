"""Metrics of the `net` collector (eBPF, per pod)."""

from __future__ import annotations

from gpuscope.exporters.prometheus.spec import MetricSpec

# Pods are identified by UID always, and by name and workload once the Kubernetes API has
# named them (empty until then; the last known names stay while the API is unreachable).
# `container` is set only with --net-per-container: the container's name, or its runtime id
# where the API does not name it; else empty (PromQL treats "" as absent).
POD = ("namespace", "pod", "pod_uid", "workload_kind", "workload", "container")
HOST_NOTE = 'One series set per pod with traffic, plus one for the host (`pod_uid=""`, `pod=""`).'

NET_METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "gpuscope_pod_network_transmit_bytes_total",
        "counter",
        "Payload bytes the pod's sockets sent (sock:sock_send_length), by protocol (tcp, udp).",
        (*POD, "protocol"),
        "net",
        HOST_NOTE + " In cgroup_skb fallback mode: IP packet bytes.",
    ),
    MetricSpec(
        "gpuscope_pod_network_receive_bytes_total",
        "counter",
        "Payload bytes the pod's sockets received (sock:sock_recv_length), by protocol.",
        (*POD, "protocol"),
        "net",
        HOST_NOTE,
    ),
    MetricSpec(
        "gpuscope_pod_network_transmit_calls_total",
        "counter",
        "Send calls that sent data; bytes / calls is the average message size.",
        (*POD, "protocol"),
        "net",
        HOST_NOTE + " Packets in cgroup_skb fallback mode.",
    ),
    MetricSpec(
        "gpuscope_pod_network_receive_calls_total",
        "counter",
        "Receive calls that returned data.",
        (*POD, "protocol"),
        "net",
        HOST_NOTE,
    ),
    MetricSpec(
        "gpuscope_pod_tcp_retransmits_total",
        "counter",
        "TCP segments the pod's sockets retransmitted (tcp:tcp_retransmit_skb).",
        POD,
        "net",
        "Pods with TCP activity since the agent started.",
    ),
    MetricSpec(
        "gpuscope_pod_tcp_connections_opened_total",
        "counter",
        "TCP connections that reached ESTABLISHED, active (connect) and passive (accept).",
        POD,
        "net",
        "Pods with TCP activity since the agent started.",
    ),
    MetricSpec(
        "gpuscope_pod_tcp_connections_closed_total",
        "counter",
        "TCP connections opened since the agent started that have closed.",
        POD,
        "net",
        "Pods with TCP activity since the agent started.",
    ),
    MetricSpec(
        "gpuscope_pod_tcp_connections_active",
        "gauge",
        "TCP connections opened since the agent started and still open (opened - closed).",
        POD,
        "net",
        "Pods with TCP activity since the agent started.",
    ),
    MetricSpec(
        "gpuscope_pod_tcp_rtt_seconds",
        "histogram",
        "Smoothed RTT of the pod's TCP connections (tcp:tcp_probe srtt), sampled per connection "
        "at most once per kernel tick (1-10 ms), from an in-kernel log2 histogram.",
        POD,
        "net",
        "Pods with TCP traffic. Buckets are powers of two from 16 µs to 8.4 s.",
    ),
    MetricSpec(
        "gpuscope_bpf_probe_info",
        "gauge",
        "Always 1; which mode each probe runs in (tracepoint, cgroup_skb, absent).",
        ("probe", "mode"),
        "net",
        "Once the probes are loaded.",
    ),
    MetricSpec(
        "gpuscope_bpf_map_full_total",
        "counter",
        "Inserts a full BPF map refused; the data of those events is missing from the pod "
        "series. Raise --bpf-max-cgroups / --bpf-max-sockets.",
        ("map",),
        "net",
        "Every map, once the probes are loaded.",
    ),
    MetricSpec(
        "gpuscope_bpf_map_entries",
        "gauge",
        "Entries in each BPF map now.",
        ("map",),
        "net",
        "Every map, once the probes are loaded.",
    ),
    MetricSpec(
        "gpuscope_bpf_map_max_entries",
        "gauge",
        "Capacity of each BPF map.",
        ("map",),
        "net",
        "Every map, once the probes are loaded.",
    ),
)
