"""The Prometheus rules (daemonset/rules/gpuscope.rules.yml): promtool accepts the source and
the generated PrometheusRule, the unit tests in tests/rules/ pass, every alert has a case
where it fires and one where it must not, every recording rule a checked value, and every
alert names its runbook, whose section exists in docs/alerts.md."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
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


# --- the DCGM compatibility layer (daemonset/rules/dcgm-compat.rules.yml) ------------------
# Both variants: the source, with namespace/pod/container, and the exported_* one that
# scripts/gen-deploy-assets.py derives from it (tests/deploy/test_deploy_assets.py checks the
# derivation). dcgm-exporter's counters come from the fixture tests/rules/dcgm-exporter/.

DCGM_COMPAT_PROMETHEUS_RULE = (
    REPO / "daemonset" / "overlays" / "dcgm-compat" / "prometheusrule.yaml"
)
# Recorded although not in the list: the PCIe names of its default list before dcgm-exporter
# 3.3.7, and the profiling fields the list leaves commented out.
OUTSIDE_DEFAULT_LIST = frozenset(
    {"DCGM_FI_DEV_PCIE_TX_THROUGHPUT", "DCGM_FI_DEV_PCIE_RX_THROUGHPUT"}
    | {"DCGM_FI_PROF_SM_ACTIVE", "DCGM_FI_PROF_SM_OCCUPANCY"}
    | {"DCGM_FI_PROF_PIPE_FP64_ACTIVE", "DCGM_FI_PROF_PIPE_FP32_ACTIVE"}
    | {"DCGM_FI_PROF_PIPE_FP16_ACTIVE"}
)
SCRAPE_JOIN_LABELS = frozenset({"job", "instance"})
DCGM_MIG_LABELS = frozenset({"GPU_I_ID", "GPU_I_PROFILE"})
DCGM_GPU_LABELS = "gpu_pod:gpuscope_gpu_dcgm_labels:info"
DCGM_MIG_LABELS_RULE = "gpu_instance:gpuscope_mig_dcgm_labels:info"
DCGM_LABEL_JOIN = f"* on (job, instance, gpu) group_right () {DCGM_GPU_LABELS}"
DCGM_MIG_JOIN = f"* on (job, instance, mig_uuid) group_right () {DCGM_MIG_LABELS_RULE}"
# A rule derived from a DCGM_FI_* series recorded earlier in the group, by a unit factor
# (the pre-3.3.7 PCIe names, KiB/s of the bytes per second): it inherits that one's labels.
DERIVED = re.compile(r"(DCGM_FI_\w+) / (\d+)")
VARIANT_PARAMS = pytest.mark.parametrize(
    "variant", list(dcgm.VARIANTS), ids=[p.name for p in dcgm.VARIANTS]
)


def _outer_by(expr: str) -> set[str]:
    m = re.match(r"\w+ by \(([^)]*)\)", " ".join(expr.split()))
    return {x.strip() for x in m.group(1).split(",")} if m else set()


@VARIANT_PARAMS
def test_promtool_accepts_the_compat_rules(variant: Path) -> None:
    proc = promtool("check", "rules", variant)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(dcgm.compat_rules(variant))} rules found" in proc.stdout


def test_promtool_accepts_the_compat_prometheus_rule(tmp_path: Path) -> None:
    spec = yaml.safe_load(DCGM_COMPAT_PROMETHEUS_RULE.read_text())["spec"]
    path = tmp_path / "dcgm-compat-groups.yml"
    path.write_text(yaml.safe_dump({"groups": spec["groups"]}, sort_keys=False))
    proc = promtool("check", "rules", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(dcgm.compat_rules())} rules found" in proc.stdout


def test_compat_layer_records_every_dcgm_field_gpuscope_has_a_source_for() -> None:
    """Every series counter of dcgm-exporter's list but those gpuscope cannot source, plus
    the older and optional names; nothing else."""
    recorded = dcgm.recorded_names()
    assert not [r for r in dcgm.compat_rules() if "alert" in r], "the compat layer only records"
    assert len(recorded) == len(set(recorded))
    listed = {c.name for c in dcgm.metric_counters()}
    assert set(dcgm.NO_GPUSCOPE_SOURCE) <= listed
    assert not OUTSIDE_DEFAULT_LIST & listed, "now in the list: move it to the first table"
    assert set(recorded) == listed - set(dcgm.NO_GPUSCOPE_SOURCE) | OUTSIDE_DEFAULT_LIST
    assert dcgm.recorded_names(dcgm.DCGM_COMPAT_EXPORTED) == recorded


@VARIANT_PARAMS
def test_compat_helper_rules_follow_level_metric_operations(variant: Path) -> None:
    for r in dcgm.compat_rules(variant):
        if r["record"].startswith("DCGM_FI_"):
            continue
        level, metric, ops = r["record"].split(":")
        assert metric.startswith("gpuscope_") and re.fullmatch(r"[a-z]+(_[a-z]+)*", ops)
        for label in level.split("_"):
            assert label in r["expr"], f"{r['record']}: level {label} not in its expression"


@VARIANT_PARAMS
def test_every_compat_series_gets_dcgm_exporters_labels_from_the_joins(variant: Path) -> None:
    """The label sets are the joins' own by() lists, and every DCGM_FI_* term ends with a join
    (group_right: the labels are the join's), so none can drift from dcgm-exporter's. A rule
    is the per-GPU term, then for the fields DCGM has per MIG GPU instance `or` the MIG term;
    or a unit factor of a DCGM_FI_* series recorded before it, whose labels it keeps."""
    holders = set(dcgm.VARIANTS[variant])
    rules = dcgm.compat_rules(variant)
    info = {r["record"]: r for r in rules if r["record"].endswith(":info")}
    assert _outer_by(info[DCGM_GPU_LABELS]["expr"]) == dcgm.DEVICE_LABELS | holders | (
        SCRAPE_JOIN_LABELS
    )
    mig_labels = dcgm.DEVICE_LABELS | SCRAPE_JOIN_LABELS | DCGM_MIG_LABELS
    assert _outer_by(info[DCGM_MIG_LABELS_RULE]["expr"]) == mig_labels | {"mig_uuid"}
    seen: list[str] = []
    for r in rules:
        if not r["record"].startswith("DCGM_FI_"):
            continue
        expr = " ".join(r["expr"].split())
        derived = DERIVED.fullmatch(expr)
        if derived:
            assert derived.group(1) in seen, (
                f"{r['record']}: {derived.group(1)} not recorded before"
            )
        else:
            gpu_term, _, mig_term = expr.partition(" or max without (mig_uuid) (")
            assert gpu_term.endswith(DCGM_LABEL_JOIN), r["record"]
            assert not mig_term or mig_term.endswith(f"{DCGM_MIG_JOIN} )"), r["record"]
        seen.append(r["record"])


# One series per GPU whatever its other labels: they describe the GPU.
PER_GPU_INFO = frozenset({"gpuscope_gpu_info"})


@VARIANT_PARAMS
def test_every_compat_source_series_is_unique_per_gpu_or_mig_device(variant: Path) -> None:
    """The DCGM_FI_* terms join the agent's series as they are, with no aggregation first
    (docs/performance.md, #25): that is only safe while each selector picks one series per
    (job, instance, gpu), or per (job, instance, mig_uuid) in a MIG term. So every label the
    agent's catalog gives a source beyond gpu, uuid and mig_uuid must be pinned by an
    equality matcher of the selector; a new label on a source family fails here, not in a
    cluster with a many-to-many error."""
    catalog = known_series()
    identity = {"gpu", "uuid", "mig_uuid"} | SCRAPE_JOIN_LABELS | {"node", "cluster"}
    problems = []
    for r in dcgm.compat_rules(variant):
        if not r["record"].startswith("DCGM_FI_"):
            continue
        expr = " ".join(r["expr"].split())
        for metric, _ in selectors(expr):
            if not metric.startswith("gpuscope_") or metric in PER_GPU_INFO:
                continue
            pinned = {
                m.group(1)
                for sel in re.findall(rf"\b{metric}\{{([^}}]*)\}}", expr)
                for m in re.finditer(r'(\w+)="[^"]*"', sel)
            }
            loose = catalog[metric] - identity - pinned
            if loose:
                problems.append(f"{r['record']}: {metric} not unique per GPU: {sorted(loose)}")
    assert not problems, "\n".join(problems)


def test_the_exported_variant_renames_the_holders_and_nothing_else() -> None:
    """Its rules are the source's but for the label join, and that join names no namespace,
    pod or container label of its own (the allocations' are renamed as they enter)."""
    source = {r["record"]: r["expr"] for r in dcgm.compat_rules()}
    exported = {r["record"]: r["expr"] for r in dcgm.compat_rules(dcgm.DCGM_COMPAT_EXPORTED)}
    assert list(exported) == list(source)
    assert [k for k in source if source[k] != exported[k]] == [DCGM_GPU_LABELS]
    join = exported[DCGM_GPU_LABELS]
    for label in dcgm.HOLDER_LABELS:
        assert f'"exported_{label}", "$1", "{label}", "(.*)"' in join
        assert not re.search(
            rf"(?<![\w\"]){label}(?=[,)\s])", join.replace(f"exported_{label}", "")
        ), label


def test_every_compat_recording_rule_has_a_checked_value() -> None:
    exprs = [e for t in _rule_tests() for e in t.get("promql_expr_test", [])]
    missing = [
        r["record"]
        for r in dcgm.compat_rules()
        if not any(e["expr"].strip() == r["record"] and e.get("exp_samples") for e in exprs)
    ]
    assert not missing, f"compat recording rules without a promql_expr_test: {missing}"


@VARIANT_PARAMS
def test_every_metric_and_label_the_compat_rules_select_exists(variant: Path) -> None:
    known = known_series()
    rules = dcgm.compat_rules(variant)
    for r in rules:
        derived = DERIVED.fullmatch(" ".join(r["expr"].split()))
        known[r["record"]] = (
            known[derived.group(1)] if derived else _outer_by(r["expr"]) or {"digit"}
        )
    problems = []
    for rule in rules:
        for metric, labels in selectors(rule["expr"]):
            if metric not in known:
                problems.append(f"{rule['record']}: unknown {metric}")
            elif labels - known[metric]:
                problems.append(f"{rule['record']}: {metric} {labels}")
    assert not problems, "\n".join(problems)


# --- the migration guide's tables against dcgm-exporter's counter list ----------------------


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
        recorded = "none: not recorded" not in r[3]
        assert recorded == (c.name not in dcgm.NO_GPUSCOPE_SOURCE), f"{c.name}: {r[3]}"


def test_the_guides_second_table_has_the_recorded_names_outside_the_list() -> None:
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
