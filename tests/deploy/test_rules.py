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
    join is followed by `or on (uuid)` the device series (the unit tests prove it fires)."""
    for rule in alerting_rules():
        if "gpuscope_gpu_allocation_info" in rule["expr"]:
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
