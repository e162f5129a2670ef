"""The agent's configuration, derived from the declared options of every part.

Flags come from the option dataclasses (agent/runtime/options.py): the agent-wide ones below, one
set per collector (agent/app/registry.py), the attribution stage's and node labels'. Each flag
has a `GPUSCOPE_*` environment variable (flags win). Bad values end the program with one
line naming the flag and what is wrong, before any source starts: a DaemonSet with a typo
should crash-loop with a readable reason.
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from gpuscope.agent.app.registry import BY_NAME, COLLECTORS, DEFAULT_COLLECTORS
from gpuscope.agent.attribution.options import AttributionOptions
from gpuscope.agent.labels.options import LabelsOptions
from gpuscope.agent.name_patterns import pattern_problem
from gpuscope.agent.runtime.help_format import HelpFormatter
from gpuscope.agent.runtime.options import ConfigError, Flag, flag, flags_of, names, number, one_of
from gpuscope.agent.serve.web_config import WebConfig, load_web_config

if TYPE_CHECKING:
    from gpuscope.agent.runtime.spec import CollectorSpec

__all__ = ["AgentOptions", "Config", "ConfigError", "all_flags", "build_parser", "parse"]

O = TypeVar("O")  # noqa: E741


def _listen(flag_name: str, text: str) -> tuple[str, int]:
    from gpuscope.agent.serve.server import parse_listen_address  # the server binds what it parses

    return parse_listen_address(flag_name, text)


def _collectors(flag_name: str, text: str) -> tuple[str, ...]:
    chosen = names(text)
    if not chosen:
        raise ConfigError(f"{flag_name}: expected at least one collector")
    unknown = [n for n in chosen if n not in BY_NAME]
    if unknown:
        raise ConfigError(
            f"{flag_name}: unknown collector {unknown[0]!r} (available: {', '.join(BY_NAME)})"
        )
    return chosen


def _node_name(flag_name: str, text: str) -> str:
    """Arguments and environment that are not valid UTF-8 reach Python as surrogate escapes;
    a node name with them would fail every Kubernetes API call and every label, later."""
    name = text or socket.gethostname()
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        shown = os.fsencode(name).decode("utf-8", "backslashreplace")
        raise ConfigError(f"{flag_name}: not valid UTF-8: '{shown}'") from None
    return name


def _pattern_problem(text: str) -> str | None:
    return pattern_problem(text) if text else None


def _web_config(flag_name: str, text: str) -> WebConfig | None:
    if not text:
        return None
    try:
        return load_web_config(Path(text))
    except ConfigError as exc:
        raise ConfigError(f"{flag_name}: {exc}") from None


@dataclass(frozen=True, slots=True)
class AgentOptions:
    """What every part shares: where to serve, what to collect, the host's roots."""

    # 19400: dcgm-exporter's 9400 moved out of the exporters' block, which Prometheus's
    # default-port list has filled (README, "Its own port"), so both can run on one node.
    listen: tuple[str, int] = flag(
        ("", 19400),
        "address to serve /metrics, /healthz (alive) and /readyz (first collection done) on",
        parse=_listen,
        shown=":19400",
    )
    collectors: tuple[str, ...] = flag(
        DEFAULT_COLLECTORS,
        f"comma-separated collectors to enable (available: {', '.join(BY_NAME)})",
        parse=_collectors,
    )
    node_name: str = flag(
        "",
        "this node's name",
        parse=_node_name,
        fallback=lambda env: env.get("NODE_NAME", ""),
        shown="$NODE_NAME, else the host name",
    )
    series_node_label: bool = flag(
        False,
        'put node="<node name>" on every series (true/false), for scrapes that do not add it: '
        "a plain Prometheus, a ServiceMonitor without relabeling (docs/deploy.md)",
    )
    metrics_detail: str = flag(
        "default",
        "default or full: the default level serves per-GPU summaries and the exceptions "
        "(NVLink errors summed per GPU, only links down or erroring, only throttle reasons "
        "that apply: at most 40 series per H100), full serves every per-link and per-reason "
        "series (docs/metrics.md, column Default)",
        parse=one_of("default", "full"),
    )
    metrics_include: str = flag(
        "",
        "RE2 regular expression of metric names (fully anchored, as in Prometheus "
        "relabelling) served whole at any detail level, e.g. 'gpuscope_gpu_nvlink_link_.*'",
        check=lambda v: _pattern_problem(v),
        shown="none",
    )
    metrics_exclude: str = flag(
        "",
        "RE2 regular expression of metric names (fully anchored) never served (wins over "
        "include; the gpuscope_collector_* health series cannot be excluded)",
        check=lambda v: _pattern_problem(v),
        shown="none",
    )
    dcgm_compat: str = flag(
        "off",
        "off, on or exported-labels: also serve dcgm-exporter's default counters as it does "
        "(DCGM_FI_* names, units, label names); exported-labels names the holding container "
        "exported_namespace, exported_pod, exported_container "
        "(docs/migrating-from-dcgm-exporter.md)",
        parse=one_of("off", "on", "exported-labels"),
    )
    collect_deadline: float = flag(
        5.0,
        "seconds a scrape waits for each collector and stage (counted from when its work "
        "began); a late one is reported stuck and its last good data served, at once on later "
        "scrapes",
        parse=number,
        check=lambda v: None if 0.1 <= v <= 120 else f"expected 0.1 to 120 seconds, got {v:g}",
    )
    collection_max_age: float = flag(
        1.0,
        "seconds a finished collection is reused by later scrapes (concurrent scrapes always "
        "share the collection in flight); 0 collects anew for every scrape",
        parse=number,
        check=lambda v: None if 0 <= v <= 60 else f"expected 0 to 60 seconds, got {v:g}",
    )
    log_format: str = flag("text", "json or text", parse=one_of("json", "text"))
    log_level: str = flag(
        "info", "debug, info, warning or error", parse=one_of("debug", "info", "warning", "error")
    )
    procfs: Path = flag(
        Path("/proc"), "where the host's /proc is mounted (/host/proc in the DaemonSet)"
    )
    sysfs: Path = flag(
        Path("/sys"), "where the host's /sys is mounted (/host/sys in the DaemonSet)"
    )
    # Read by the net collector (its cgroup programs) and the attribution stage (pods'
    # cgroup signals): a host root, like --procfs and --sysfs.
    cgroup_root: Path | None = flag(
        None,
        "the host's cgroup v2 mount",
        shown="<sysfs>/fs/cgroup, or its unified/ on hybrid hosts",
    )
    kubeconfig: Path | None = flag(
        None,
        "kubeconfig for the Kubernetes API (pods collector, node labels)",
        shown="in-cluster config, else $KUBECONFIG",
    )
    web_config_file: WebConfig | None = flag(
        None,
        "exporter-toolkit web configuration (TLS, client certificates, basic auth, headers), "
        "the same file node_exporter takes; read and checked at start (docs/deploy.md)",
        parse=_web_config,
        shown="none: plain HTTP, no authentication",
    )


@dataclass(frozen=True, slots=True)
class Config:
    """Every part's options as `parse` made them: the agent-wide ones, the attribution stage's,
    the node labels', and each collector's own (typed by `of`)."""

    agent: AgentOptions
    attribution: AttributionOptions
    labels: LabelsOptions
    collector_options: Mapping[str, Any]  # by collector name, each its declared dataclass

    @property
    def collectors(self) -> tuple[str, ...]:
        return self.agent.collectors

    def of(self, collector: CollectorSpec[Any, O]) -> O:
        """The options of one collector, typed by its declaration."""
        options: O = self.collector_options[collector.name]
        return options


# Option groups in --help and README order: (owner, options dataclass, title).
_GROUPS: tuple[tuple[str, type, str], ...] = (
    ("agent", AgentOptions, "agent"),
    *((c.name, c.options, f"collector {c.name}") for c in COLLECTORS),
    ("attribution", AttributionOptions, "attribution stage"),
    ("labels", LabelsOptions, "node labels"),
)


def all_flags() -> tuple[tuple[str, tuple[Flag, ...]], ...]:
    """Every flag, grouped by its owner's title (for --help and the README table)."""
    return tuple((title, flags_of(cls, owner)) for owner, cls, title in _GROUPS)


FLAG_TABLE_BEGIN = "<!-- flags:begin: generated from the declared options (make golden-update) -->"
FLAG_TABLE_END = "<!-- flags:end -->"


def flag_table() -> str:
    """The README's flag table, between its markers (a test keeps the README in step)."""
    rows = [
        FLAG_TABLE_BEGIN,
        "| Flag | Environment | Default | Part | Meaning |",
        "|---|---|---|---|---|",
    ]
    for title, flags in all_flags():
        for f in flags:
            default = f"`{f.default_text}`" if f.default_text else "none"
            rows.append(f"| `{f.name}` | `{f.env}` | {default} | {title} | {f.meta.help} |")
    rows.append(FLAG_TABLE_END)
    return "\n".join(rows) + "\n"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gpuscope",
        formatter_class=HelpFormatter,
        description="GPU and network observability agent for Kubernetes nodes. Every flag can "
        "also be set with the environment variable shown in brackets.",
    )
    for title, flags in all_flags():
        if not flags:
            continue
        group = p.add_argument_group(title)
        for f in flags:
            extra: dict[str, Any] = {"nargs": "?", "const": "true"} if f.is_bool else {}
            group.add_argument(
                f.name,
                dest=f.attr,
                help=f"{f.meta.help} (default: {f.default_text or 'none'}) [{f.env}]",
                **extra,
            )
    p.add_argument("--version", action="version", version="%(prog)s " + _version())
    return p


def _version() -> str:
    from gpuscope import __version__

    return __version__


def parse(argv: Sequence[str] | None = None, env: Mapping[str, str] | None = None) -> Config:
    """Parse flags over environment variables over defaults; raise ConfigError on bad values."""
    return from_parsed(vars(build_parser().parse_args(argv)), env)


def from_parsed(args: Mapping[str, Any], env: Mapping[str, str] | None = None) -> Config:
    """`parse` for flags that a parser built on `build_parser` has already parsed (the
    command line's, which adds the commands): the parser is built once per start."""
    env = os.environ if env is None else env
    groups = {
        owner: cls(**{f.attr: f.value(args[f.attr], env) for f in flags_of(cls, owner)})
        for owner, cls, _title in _GROUPS
    }
    return Config(
        agent=groups.pop("agent"),
        attribution=groups.pop("attribution"),
        labels=groups.pop("labels"),
        collector_options=groups,
    )
