"""Check `series_budget`: what a real GPU costs in series at each detail level."""

from __future__ import annotations

import re
from collections import Counter
from typing import TYPE_CHECKING, Any

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpuscope.agent.app.config import parse
from gpuscope.agent.app.exposition import exposition_of
from gpuscope.agent.check.common import Check, verdict
from gpuscope.agent.check.session import agent_argv
from gpuscope.exporters.prometheus.exporter import PrometheusExporter

if TYPE_CHECKING:
    from gpuscope.agent.app.agent import Agent

# Families the default detail level serves only while they apply (exporters/prometheus/
# detail.py): a real GPU may have some (a power cap reason, an erroring link, an XID).
EXCEPTION_FAMILIES = re.compile(
    r"gpuscope_gpu_(xid_errors_total|throttle_reasons|nvlink_link_\w+|stuck_\w+|fenced"
    r"|fatal_xid_info|xid_events_watched|unsampled_seconds_total|recovery_action_info"
    r"|events_total|events_watched|xgmi_link_up)"
)


SERIES_BUDGET = 40  # per GPU at the default level (issue #15; the fake dgx-h100: 40)


def series_by_gpu(text_out: str) -> dict[str, Counter[str]]:
    """{uuid: Counter(family)} of an exposition's GPU series; a partition's own (a MIG
    device's, an AMD XCP's) are its, not its GPU's."""
    out: dict[str, Counter[str]] = {}
    for family in text_string_to_metric_families(text_out):
        for sample in family.samples:
            uuid = sample.labels.get("uuid")
            partition = sample.labels.get("mig_uuid") or sample.labels.get("partition_uuid")
            if uuid and not partition:
                out.setdefault(uuid, Counter())[sample.name] += 1
    return out


def check_series_budget(agent: Agent, args: Any, collector: str = "gpu") -> Check:
    """What a real GPU costs in series at each detail level: the default level within the
    budget once the exceptions a real GPU may have are set apart."""
    default = PrometheusExporter(
        agent.scrape, exposition_of(parse(agent_argv(args, "default", collector), env={}))
    )
    levels = {
        "default": series_by_gpu(default.render_text().decode()),
        "full": series_by_gpu(generate_latest(agent.registry).decode()),
    }
    problems: list[str] = []
    per_gpu: dict[str, dict[str, Any]] = {}
    for uuid, families in levels["default"].items():
        exceptions = {n: c for n, c in families.items() if EXCEPTION_FAMILIES.fullmatch(n)}
        base = sum(families.values()) - sum(exceptions.values())
        per_gpu[uuid] = {
            "default": sum(families.values()),
            "default_without_exceptions": base,
            "exceptions": exceptions,
            "full": sum(levels["full"].get(uuid, Counter()).values()),
        }
        if base > SERIES_BUDGET:
            problems.append(f"{uuid}: {base} series at the default level (budget {SERIES_BUDGET})")
    details = {
        "per_gpu": per_gpu,
        "families_default": dict(sum(levels["default"].values(), Counter())),
        "families_full": dict(sum(levels["full"].values(), Counter())),
    }
    counts = sorted(int(g["default"]) for g in per_gpu.values())
    full = sorted(int(g["full"]) for g in per_gpu.values())
    ok = (
        f"default {counts[0]}-{counts[-1]} series a GPU, full {full[0]}-{full[-1]}"
        if counts and full
        else "no GPU series"
    )
    return verdict("series_budget", problems, ok, details)
