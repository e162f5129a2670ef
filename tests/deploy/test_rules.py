"""The Prometheus rules (daemonset/rules/gpuscope.rules.yml): promtool accepts the source and
the generated PrometheusRule, the unit tests in tests/rules/ pass, every alert has a case
where it fires and one where it must not, every recording rule a checked value, and every
alert names its runbook, whose section exists in docs/alerts.md."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from tests.support import dcgm
from tests.support.observability import (
    ALERTS_DOC,
    REPO,
    RULES,
    RUNBOOK_BASE,
    alerting_rules,
    known_series,
    recording_rules,
    rules,
    selectors,
)

RULE_TESTS = sorted((REPO / "tests" / "rules").glob("*.test.yml"))
PROMETHEUS_RULE = REPO / "daemonset" / "base" / "prometheusrule.yaml"
SEVERITIES = {"info", "warning", "critical"}


def promtool(*args: str | Path, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["promtool", *map(str, args)], capture_output=True, text=True, check=False, cwd=cwd
    )


def test_promtool_accepts_the_rules_file() -> None:
    proc = promtool("check", "rules", RULES)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules())} rules found" in proc.stdout


def test_promtool_accepts_the_prometheus_rule_groups(tmp_path: Path) -> None:
    spec = yaml.safe_load(PROMETHEUS_RULE.read_text())["spec"]
    path = tmp_path / "prometheusrule-groups.yml"
    path.write_text(yaml.safe_dump({"groups": spec["groups"]}, sort_keys=False))
    proc = promtool("check", "rules", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(rules())} rules found" in proc.stdout


def test_promtool_unit_tests_pass() -> None:
    assert RULE_TESTS
    proc = promtool("test", "rules", *(p.name for p in RULE_TESTS), cwd=RULE_TESTS[0].parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("SUCCESS") == len(RULE_TESTS), proc.stdout


def _rule_tests() -> list[dict[str, Any]]:
    return [t for path in RULE_TESTS for t in yaml.safe_load(path.read_text())["tests"]]


def test_every_alert_rule_has_a_firing_and_a_quiet_case() -> None:
    cases = [c for t in _rule_tests() for c in t.get("alert_rule_test", [])]
    problems = []
    for rule in alerting_rules():
        name, static = rule["alert"], rule.get("labels", {})
        mine = [c for c in cases if c["alertname"] == name]
        fires = [
            c
            for c in mine
            if any(static.items() <= a["exp_labels"].items() for a in c.get("exp_alerts") or [])
        ]
        quiet = [c for c in mine if not c.get("exp_alerts")]
        if not fires:
            problems.append(f"{name} {static}: no case where it fires")
        if not quiet:
            problems.append(f"{name}: no case where it must not fire")
        for c in fires:
            for a in c["exp_alerts"]:
                if set(a.get("exp_annotations", {})) != {"summary", "description", "runbook_url"}:
                    problems.append(f"{name} at {c['eval_time']}: annotations not all checked")
    assert not problems, "\n".join(problems)


def test_every_recording_rule_has_a_checked_value() -> None:
    exprs = [e for t in _rule_tests() for e in t.get("promql_expr_test", [])]
    missing = [
        r["record"]
        for r in recording_rules()
        if not any(e["expr"].strip() == r["record"] and e.get("exp_samples") for e in exprs)
    ]
    assert not missing, f"recording rules without a promql_expr_test: {missing}"


def test_recording_rule_names_follow_level_metric_operations() -> None:
    for r in recording_rules():
        level, metric, ops = r["record"].split(":")
        assert re.fullmatch(r"[a-z]+(_[a-z]+)*", level), r["record"]
        assert metric.startswith("gpuscope_") and not metric.endswith("_total"), r["record"]
        assert re.fullmatch(r"[a-z0-9]+(_[a-z0-9]+)*", ops), r["record"]
        for label in level.split("_"):
            if label not in ("workload",):
                assert label in r["expr"], f"{r['record']}: level {label} not in its expression"


def test_alerts_carry_severity_summary_description_and_runbook() -> None:
    anchors = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^##+ (.+)$", ALERTS_DOC.read_text(), re.M)
    }
    problems = []
    for rule in alerting_rules():
        name = rule["alert"]
        if rule.get("labels", {}).get("severity") not in SEVERITIES:
            problems.append(f"{name}: severity {rule.get('labels')}")
        ann = rule.get("annotations", {})
        for key in ("summary", "description"):
            if "$labels.node" not in ann.get(key, "") and name != "GpuscopeDown":
                problems.append(f"{name}: {key} does not name the node")
        if name.startswith("GPU") and "$labels.gpu" not in ann.get("summary", ""):
            problems.append(f"{name}: summary does not name the GPU")
        if name.startswith("GPU") and "$labels.pod" not in ann.get("description", ""):
            problems.append(f"{name}: description does not name the pod holding the GPU")
        if ann.get("runbook_url") != RUNBOOK_BASE + name.lower():
            problems.append(f"{name}: runbook_url {ann.get('runbook_url')}")
        if name.lower() not in anchors:
            problems.append(f"{name}: no section #{name.lower()} in docs/alerts.md")
    assert not problems, "\n".join(problems)


def test_gpu_alerts_keep_gpus_no_pod_holds() -> None:
    """Joined with the allocations, a GPU alert must still fire for a GPU nobody holds: the
    join is followed by `or on (uuid)` the device series (the unit tests prove it fires).
    Workload alerts (Workload*) count a workload's allocations instead: no GPU to keep."""
    for rule in alerting_rules():
        if rule["alert"].startswith("GPU") and "gpuscope_gpu_allocation_info" in rule["expr"]:
            assert "group_left (node, gpu" in rule["expr"], rule["alert"]
            assert "or on (uuid)" in rule["expr"], rule["alert"]


def test_every_metric_and_label_the_rules_select_exists() -> None:
    known = known_series()
    problems = []
    for rule in rules():
        for metric, labels in selectors(rule["expr"]):
            if metric not in known:
                problems.append(f"{rule.get('alert') or rule.get('record')}: unknown {metric}")
            elif labels - known[metric]:
                problems.append(f"{rule.get('alert') or rule.get('record')}: {metric} {labels}")
    assert not problems, "\n".join(problems)


# --- the migration guide's tables against dcgm-exporter's counter list ----------------------
# The DCGM compatibility names are served by the agent (--dcgm-compat,
# exporters/prometheus/catalog_dcgm.py); the guide's tables are held to the counter list here
# and to the catalog, tests/unit/exporters/test_dcgm_render.py holds the catalog to the list.

# Served although not in the list: the PCIe names of its default list before dcgm-exporter
# 3.3.7, and the profiling fields the list leaves commented out.
OUTSIDE_DEFAULT_LIST = (
    {"DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT"}
    | {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY"}
    | {"DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE"}
    | {"DCGM_FI_PROF_PIPE_FP16_ACTIVE"}
)


def test_the_agent_serves_the_list_and_the_names_outside_it() -> None:
    from gpuscope.exporters.prometheus.catalog_dcgm import FIELDS

    listed = {c.name for c in dcgm.metric_counters()}
    served = {f.name for f in FIELDS}
    assert served == listed - set(dcgm.NO_GPUSCOPE_SOURCE) | OUTSIDE_DEFAULT_LIST


def test_the_guides_default_table_is_dcgm_exporters_list_with_its_types_and_units() -> None:
    """One row per series counter of the fixture, in its order, whose "dcgm type, unit" is
    the list's type and the unit its help names; "none" where gpuscope has no source."""
    rows = dcgm.guide_table("Default counters")
    counters = dcgm.metric_counters()
    assert [dcgm.first_cell_name(r) for r in rows] == [c.name for c in counters]
    wrong = {
        c.name: (r[1], c.type_and_unit)
        for r, c in zip(rows, counters, strict=True)
        if r[1] != c.type_and_unit
    }
    assert not wrong, f"type, unit differ from the counter list's: {wrong}"
    for r, c in zip(rows, counters, strict=True):
        served = "none: not served" not in r[3]
        assert served == (c.name not in dcgm.NO_GPUSCOPE_SOURCE), f"{c.name}: {r[3]}"


def test_the_guides_second_table_has_the_served_names_outside_the_list() -> None:
    rows = dcgm.guide_table("Outside the default list")
    assert {dcgm.first_cell_name(r) for r in rows} == OUTSIDE_DEFAULT_LIST
    assert len(rows) == len(OUTSIDE_DEFAULT_LIST)


def test_the_guides_labels_table_has_the_lists_label_fields_and_both_label_forms() -> None:
    labels = " ".join(r[0] for r in dcgm.guide_table("Labels"))
    wanted = [c.name for c in dcgm.default_counters() if c.type == "label"]
    wanted += [*dcgm.DEVICE_LABELS, *dcgm.HOLDER_LABELS, *dcgm.EXPORTED_HOLDER_LABELS]
    missing = [name for name in wanted if f"`{name}`" not in labels]
    assert not missing, f"the guide's Labels table does not name {missing}"


def test_the_counter_list_fixture_says_where_it_came_from() -> None:
    head = dcgm.DEFAULT_COUNTERS_CSV.read_text().split("\n# Format\n")[0]
    assert "NVIDIA/dcgm-exporter etc/default-counters.csv" in head
    assert re.search(r"\bcommit\s+[0-9a-f]{40}\b", head), head
