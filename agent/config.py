"""Command-line flags, each with a `GPUSCOPE_*` environment variable (flags win).

Bad values end the program with one line naming the flag and what is wrong, before any
source starts: a DaemonSet with a typo should crash-loop with a readable reason.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuscope.agent.k8s.workloads import DEFAULT_ORDER, RESOLVERS

AVAILABLE_COLLECTORS = ("gpu", "net", "nic", "rdma", "kubelet", "pods")
DEFAULT_COLLECTORS = AVAILABLE_COLLECTORS


class ConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class Config:
    listen_host: str
    listen_port: int
    sample_interval: float
    collectors: tuple[str, ...]
    node_name: str
    log_format: str
    log_level: str
    procfs: Path
    sysfs: Path
    idle_threshold: float
    nvlink_per_link: bool
    cgroup_root: Path | None
    net_per_container: bool
    net_prune_grace: float
    net_traffic_mode: str
    bpf_max_cgroups: int
    bpf_max_sockets: int
    kernel_modules: Path
    kernel_headers: Path
    labels_mode: str
    labels_interval: float
    label_prefix: str
    labels_dir: Path
    namespace: str
    kubelet_socket: Path
    kubelet_interval: float
    gpu_resource_names: tuple[str, ...]
    kubeconfig: Path | None
    workload_order: tuple[str, ...]


def _env_name(flag: str) -> str:
    return "GPUSCOPE_" + flag.lstrip("-").replace("-", "_").upper()


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuscope",
        description="GPU and network observability agent for Kubernetes nodes. Every flag can "
        "also be set with the environment variable shown in brackets.",
    )

    def add(flag: str, help_text: str, **kw: object) -> None:
        p.add_argument(flag, help=f"{help_text} [{_env_name(flag)}]", **kw)  # type: ignore[arg-type]

    add("--listen", "address to serve /metrics, /healthz and /readyz on (default :9400)")
    add("--sample-interval", "seconds between GPU sampler ticks (default 1)")
    add(
        "--collectors",
        f"comma-separated collectors to enable (available: {', '.join(AVAILABLE_COLLECTORS)}; "
        f"default: {','.join(DEFAULT_COLLECTORS)})",
    )
    add("--node-name", "this node's name (default: $NODE_NAME, else the host name)")
    add("--log-format", "json or text (default text)")
    add("--log-level", "debug, info, warning or error (default info)")
    add("--procfs", "where the host's /proc is mounted (default /proc)")
    add("--sysfs", "where the host's /sys is mounted (default /sys)")
    add(
        "--idle-threshold",
        "utilization ratio (0-1) above which a GPU counts as active (default 0)",
    )
    add(
        "--nvlink-per-link",
        "also export NVLink throughput per link (true/false, default false)",
        nargs="?",
        const="true",
    )
    add(
        "--cgroup-root",
        "the host's cgroup v2 mount (default: <sysfs>/fs/cgroup, or its unified/ on hybrid hosts)",
    )
    add(
        "--net-per-container",
        "network series per container, not only per pod (true/false, default false)",
        nargs="?",
        const="true",
    )
    add("--net-prune-grace", "seconds before a vanished cgroup's series go (default 60)")
    add(
        "--net-traffic-mode",
        "auto, tracepoint or cgroup_skb (default auto: tracepoints where the kernel has them)",
    )
    add("--bpf-max-cgroups", "cgroups the BPF maps can hold (default 8192)")
    add("--bpf-max-sockets", "TCP sockets the BPF socket map can hold (default 262144)")
    add("--kernel-modules", "where the host's /lib/modules is (default /lib/modules)")
    add(
        "--kernel-headers",
        "fallback kernel header tree for bcc (default /usr/src/gpuscope-kernel-headers)",
    )
    add("--labels-mode", "node, nodefeature, file or none (default node)")
    add("--labels-interval", "seconds between node label recomputations (default 60)")
    add("--label-prefix", "prefix of the node labels (default gpuscope.io/)")
    add(
        "--labels-dir",
        "NFD features.d directory for --labels-mode file "
        "(default /etc/kubernetes/node-feature-discovery/features.d)",
    )
    add("--namespace", "the agent's namespace, for NodeFeature objects (default $POD_NAMESPACE)")
    add(
        "--kubelet-socket",
        "the kubelet's PodResources socket (default /var/lib/kubelet/pod-resources/kubelet.sock)",
    )
    add("--kubelet-interval", "seconds between PodResources polls (default 10)")
    add(
        "--gpu-resource-names",
        "comma-separated extended resources that are GPUs, besides nvidia.com/mig-* "
        "(default nvidia.com/gpu; add renamed shared resources such as nvidia.com/gpu.shared)",
    )
    add(
        "--kubeconfig",
        "kubeconfig for the Kubernetes API (default: in-cluster config, else $KUBECONFIG)",
    )
    add(
        "--workload-order",
        "comma-separated order in which pod workloads are resolved (default "
        "jobset,kubeflow,volcano,lws,ray,job,owner; leave one out to ignore it)",
    )
    p.add_argument("--version", action="version", version="%(prog)s " + _version())
    return p


def _version() -> str:
    from gpuscope import __version__

    return __version__


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Parse flags over environment variables over defaults; raise ConfigError on bad values."""
    env = os.environ if env is None else env
    args = build_parser().parse_args(argv)

    def value(flag: str, default: str) -> str:
        given = getattr(args, flag.lstrip("-").replace("-", "_"))
        if given is not None:
            return str(given)
        return env.get(_env_name(flag), default)

    host, port = _listen(value("--listen", ":9400"))
    collectors = _collectors(value("--collectors", ",".join(DEFAULT_COLLECTORS)))
    log_format = value("--log-format", "text").lower()
    if log_format not in ("json", "text"):
        raise ConfigError(f"--log-format: expected json or text, got {log_format!r}")
    log_level = value("--log-level", "info").lower()
    if log_level not in ("debug", "info", "warning", "error"):
        raise ConfigError(f"--log-level: expected debug, info, warning or error, got {log_level!r}")
    interval = _number("--sample-interval", value("--sample-interval", "1"))
    if not 0.05 <= interval <= 60:
        raise ConfigError(f"--sample-interval: expected 0.05 to 60 seconds, got {interval:g}")
    threshold = _number("--idle-threshold", value("--idle-threshold", "0"))
    if not 0 <= threshold < 1:
        raise ConfigError(
            f"--idle-threshold: expected a ratio from 0 to below 1, got {threshold:g}"
        )
    node = value("--node-name", env.get("NODE_NAME", "")) or socket.gethostname()
    grace = _number("--net-prune-grace", value("--net-prune-grace", "60"))
    if grace < 0:
        raise ConfigError(f"--net-prune-grace: expected seconds >= 0, got {grace:g}")
    traffic_mode = value("--net-traffic-mode", "auto").lower()
    if traffic_mode not in ("auto", "tracepoint", "cgroup_skb"):
        raise ConfigError(
            f"--net-traffic-mode: expected auto, tracepoint or cgroup_skb, got {traffic_mode!r}"
        )
    cgroup_root = value("--cgroup-root", "")
    labels_mode = value("--labels-mode", "node").lower()
    if labels_mode not in ("node", "nodefeature", "file", "none"):
        raise ConfigError(
            f"--labels-mode: expected node, nodefeature, file or none, got {labels_mode!r}"
        )
    labels_interval = _number("--labels-interval", value("--labels-interval", "60"))
    if labels_interval < 1:
        raise ConfigError(f"--labels-interval: expected at least 1 second, got {labels_interval:g}")
    kubelet_interval = _number("--kubelet-interval", value("--kubelet-interval", "10"))
    if not 1 <= kubelet_interval <= 600:
        raise ConfigError(
            f"--kubelet-interval: expected 1 to 600 seconds, got {kubelet_interval:g}"
        )
    resources = tuple(
        dict.fromkeys(
            r.strip()
            for r in value("--gpu-resource-names", "nvidia.com/gpu").split(",")
            if r.strip()
        )
    )
    if not resources:
        raise ConfigError("--gpu-resource-names: expected at least one resource name")
    order = _workload_order(value("--workload-order", ",".join(DEFAULT_ORDER)))
    kubeconfig = value("--kubeconfig", "")
    prefix = value("--label-prefix", "gpuscope.io/")
    if not prefix.endswith("/"):
        prefix += "/"
    return Config(
        listen_host=host,
        listen_port=port,
        sample_interval=interval,
        collectors=collectors,
        node_name=node,
        log_format=log_format,
        log_level=log_level,
        procfs=Path(value("--procfs", "/proc")),
        sysfs=Path(value("--sysfs", "/sys")),
        idle_threshold=threshold,
        nvlink_per_link=_boolean("--nvlink-per-link", value("--nvlink-per-link", "false")),
        cgroup_root=Path(cgroup_root) if cgroup_root else None,
        net_per_container=_boolean("--net-per-container", value("--net-per-container", "false")),
        net_prune_grace=grace,
        net_traffic_mode=traffic_mode,
        bpf_max_cgroups=_count("--bpf-max-cgroups", value("--bpf-max-cgroups", "8192")),
        bpf_max_sockets=_count("--bpf-max-sockets", value("--bpf-max-sockets", "262144")),
        kernel_modules=Path(value("--kernel-modules", "/lib/modules")),
        kernel_headers=Path(value("--kernel-headers", "/usr/src/gpuscope-kernel-headers")),
        labels_mode=labels_mode,
        labels_interval=labels_interval,
        label_prefix=prefix,
        labels_dir=Path(value("--labels-dir", "/etc/kubernetes/node-feature-discovery/features.d")),
        namespace=value("--namespace", env.get("POD_NAMESPACE", "gpuscope")),
        kubelet_socket=Path(
            value("--kubelet-socket", "/var/lib/kubelet/pod-resources/kubelet.sock")
        ),
        kubelet_interval=kubelet_interval,
        gpu_resource_names=resources,
        kubeconfig=Path(kubeconfig) if kubeconfig else None,
        workload_order=order,
    )


def _workload_order(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in RESOLVERS]
    if unknown or not names:
        raise ConfigError(
            f"--workload-order: unknown resolver {unknown[0] if unknown else '(none)'!r} "
            f"(available: {', '.join(RESOLVERS)})"
        )
    return names


def _listen(text: str) -> tuple[str, int]:
    host, sep, port_text = text.rpartition(":")
    if not sep:
        raise ConfigError(f"--listen: expected [HOST]:PORT, got {text!r}")
    host = host.strip("[]")
    try:
        port = int(port_text)
    except ValueError:
        raise ConfigError(f"--listen: port must be a number, got {port_text!r}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"--listen: port must be 0-65535, got {port}")
    return host, port


def _collectors(text: str) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in AVAILABLE_COLLECTORS]
    if unknown:
        raise ConfigError(
            f"--collectors: unknown collector {unknown[0]!r} "
            f"(available: {', '.join(AVAILABLE_COLLECTORS)})"
        )
    return names


def _number(flag: str, text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{flag}: expected a number, got {text!r}") from None


def _count(flag: str, text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise ConfigError(f"{flag}: expected a whole number, got {text!r}") from None
    if n < 1:
        raise ConfigError(f"{flag}: expected at least 1, got {n}")
    return n


def _boolean(flag: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ConfigError(f"{flag}: expected true or false, got {text!r}")
