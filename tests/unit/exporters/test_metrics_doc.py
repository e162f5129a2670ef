"""docs/metrics.md is generated from the catalog, and the catalog is what is exported."""

from __future__ import annotations

import os
import re

from gpuscope.agent.app.exposition import catalog
from gpuscope.agent.app.metrics_doc import DOC_PATH, markdown
from tests.support import GOLDEN_DIR

# Exported only behind flags; their presence is tested in test_profiles.py. (Metrics of the
# full detail level are in the *-full golden files.)
FLAG_ONLY: set[str] = set()
# Exported only while a driver refuses something (tests/integration/test_nvml_divergences.py)
# or while a GPU is stuck or fenced (test_gpu_hang.py, test_gpu_fence.py).
FAULT_ONLY = {
    # A collector whose library is not on the host (test_amd_collector.py).
    "gpuscope_collector_absent",
    "gpuscope_gpu_processes_refused",
    "gpuscope_gpu_stuck_call_info",
    "gpuscope_gpu_fatal_xid_info",
}
# Exported only by drivers newer than every golden profile's (R570+: the gb200-nvl profile,
# tests/integration/test_gpu_recovery_action.py).
DRIVER_ONLY = {"gpuscope_gpu_recovery_action_info"}


def test_docs_match_catalog() -> None:
    if os.environ.get("GPUSCOPE_UPDATE_GOLDEN") == "1":
        DOC_PATH.write_text(markdown())
    assert DOC_PATH.read_text() == markdown(), (
        "docs/metrics.md is stale: run `python -m gpuscope.agent.app.metrics_doc --write`"
    )


def exported_names() -> set[str]:
    names: set[str] = set()
    for path in GOLDEN_DIR.glob("*.prom"):
        text = path.read_text()
        names |= set(re.findall(r"^# TYPE (\S+) (?:gauge|counter|histogram)", text, re.M))
    # dcgm-exporter's names (--dcgm-compat, tests/golden/*-dcgm.prom) are documented in
    # docs/migrating-from-dcgm-exporter.md, which tests/deploy/test_rules.py holds to them.
    return {name for name in names if not name.startswith("DCGM_FI_")}


def test_every_exported_metric_is_documented_and_every_documented_metric_is_exported() -> None:
    families = {m.family_name: m.name for m in catalog().metrics}
    exported = {families.get(name, name) for name in exported_names()}
    documented = {m.name for m in catalog().metrics}
    assert exported - documented == set()
    assert documented - exported - FLAG_ONLY - FAULT_ONLY - DRIVER_ONLY == set()


def test_names_follow_the_unit_conventions() -> None:
    units = ("_bytes", "_seconds", "_watts", "_joules", "_ratio", "_celsius", "_hertz")
    for m in catalog().metrics:
        if m.source == "process":  # the client libraries' standard process_* names
            assert m.name.startswith("process_"), m.name
            continue
        else:
            assert m.name.startswith("gpuscope_")
        assert (m.kind == "counter") == m.name.endswith("_total"), m.name
        assert not {"job", "instance", "node", "cluster"} & set(m.labels), m.name
        for bad in ("_percent", "_mib", "_mhz", "_milli", "_kib", "_mw"):
            assert bad not in m.name, m.name
        if any(u in m.name for u in units):
            continue
        assert m.name.endswith(
            (
                "_info",
                "_up",
                "_total",
                "_reasons",
                "_generation",
                "_width",
                "_pending",
                "_failure",
                "_success",
                "_active",
                "_entries",
                "_state",
                "_allocated",
                "_watched",
                "_refused",
                "_stuck",
                "_fenced",
                "_threads",
                "_links",
                "_pages",
                "_absent",
            )
        ), f"{m.name}: no base unit and not a state/info metric"


def test_family_names_do_not_clash_in_openmetrics() -> None:
    """OpenMetrics names a counter's family without `_total`: a gauge `x_seconds` and a
    counter `x_seconds_total` would be two families called `x_seconds`, and Prometheus, which
    asks for OpenMetrics first, would refuse the whole scrape."""
    families = [m.family_name for m in catalog().metrics]
    assert len(families) == len(set(families)), sorted(f for f in families if families.count(f) > 1)
