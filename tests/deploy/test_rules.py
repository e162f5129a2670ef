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

DCGM_COMPAT = REPO / "daemonset" / "rules" / "dcgm-compat.rules.yml"
DCGM_COMPAT_PROMETHEUS_RULE = (
    REPO / "daemonset" / "overlays" / "dcgm-compat" / "prometheusrule.yaml"
)
MIGRATION_DOC = REPO / "docs" / "migrating-from-dcgm-exporter.md"
# dcgm-exporter's default counter set (etc/default-counters.csv in NVIDIA/dcgm-exporter, the
# fields not commented out), and those of them gpuscope has no source for.
DCGM_DEFAULT_COUNTERS = (
    "DCGM_FI_DEV_SM_CLOCK",
    "DCGM_FI_DEV_MEM_CLOCK",
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "DCGM_FI_DEV_PCIE_TX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_RX_THROUGHPUT",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_MEM_COPY_UTIL",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
)
# dcgm-exporter's profiling fields (dcp-metrics-included.csv, the GPU Operator's default)
# that gpuscope reads through NVML GPM.
DCGM_PROF_FIELDS = (
    "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
    "DCGM_FI_PROF_SM_ACTIVE",
    "DCGM_FI_PROF_SM_OCCUPANCY",
    "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
    "DCGM_FI_PROF_DRAM_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP64_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP32_ACTIVE",
    "DCGM_FI_PROF_PIPE_FP16_ACTIVE",
)
NO_GPUSCOPE_SOURCE = {
    "DCGM_FI_DEV_ENC_UTIL": "gpuscope does not read the video encoder",
    "DCGM_FI_DEV_DEC_UTIL": "gpuscope does not read the video decoder",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS": "gpuscope does not read vGPU licensing",
}
# dcgm-exporter's labels, and those of the scrape, on every compatibility series.
DCGM_LABELS = frozenset(
    {"gpu", "UUID", "device", "modelName", "Hostname", "pci_bus_id", "DCGM_FI_DRIVER_VERSION"}
    | {"namespace", "pod", "container", "job", "instance"}
)
DCGM_MIG_LABELS = frozenset({"GPU_I_ID", "GPU_I_PROFILE"})
DCGM_GPU_LABELS = "gpu_pod:gpuscope_gpu_dcgm_labels:info"
DCGM_MIG_LABELS_RULE = "gpu_instance:gpuscope_mig_dcgm_labels:info"
DCGM_LABEL_JOIN = f"* on (job, instance, UUID) group_right () {DCGM_GPU_LABELS}"
DCGM_MIG_JOIN = f"* on (job, instance, mig_uuid) group_right () {DCGM_MIG_LABELS_RULE}"


def compat_rules() -> list[dict[str, Any]]:
    doc = yaml.safe_load(DCGM_COMPAT.read_text())
    return [r for g in doc["groups"] for r in g["rules"]]


def _outer_by(expr: str) -> set[str]:
    m = re.match(r"\w+ by \(([^)]*)\)", " ".join(expr.split()))
    return {x.strip() for x in m.group(1).split(",")} if m else set()


def test_promtool_accepts_the_compat_rules_and_their_prometheus_rule(tmp_path: Path) -> None:
    proc = promtool("check", "rules", DCGM_COMPAT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(compat_rules())} rules found" in proc.stdout
    spec = yaml.safe_load(DCGM_COMPAT_PROMETHEUS_RULE.read_text())["spec"]
    path = tmp_path / "dcgm-compat-groups.yml"
    path.write_text(yaml.safe_dump({"groups": spec["groups"]}, sort_keys=False))
    proc = promtool("check", "rules", path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(compat_rules())} rules found" in proc.stdout


def test_compat_layer_records_every_dcgm_field_gpuscope_has_a_source_for() -> None:
    recorded = [r["record"] for r in compat_rules() if r["record"].startswith("DCGM_FI_")]
    assert not [r for r in compat_rules() if "alert" in r], "the compat layer only records"
    assert len(recorded) == len(set(recorded))
    expected = set(DCGM_DEFAULT_COUNTERS) - set(NO_GPUSCOPE_SOURCE) | set(DCGM_PROF_FIELDS)
    assert set(recorded) == expected


def test_compat_helper_rules_follow_level_metric_operations() -> None:
    for r in compat_rules():
        if r["record"].startswith("DCGM_FI_"):
            continue
        level, metric, ops = r["record"].split(":")
        assert metric.startswith("gpuscope_") and re.fullmatch(r"[a-z]+(_[a-z]+)*", ops)
        for label in level.split("_"):
            assert label in r["expr"], f"{r['record']}: level {label} not in its expression"


def test_every_compat_series_gets_dcgm_exporters_labels_from_the_joins() -> None:
    """The label sets are the joins' own by() lists, and every DCGM_FI_* term ends with a join
    (group_right: the labels are the join's), so none can drift from dcgm-exporter's. A rule
    is the per-GPU term, then for the fields DCGM has per MIG GPU instance `or` the MIG term."""
    info = {r["record"]: r for r in compat_rules() if r["record"].endswith(":info")}
    assert _outer_by(info[DCGM_GPU_LABELS]["expr"]) == DCGM_LABELS
    mig_labels = DCGM_LABELS - {"namespace", "pod", "container"} | DCGM_MIG_LABELS
    assert _outer_by(info[DCGM_MIG_LABELS_RULE]["expr"]) == mig_labels | {"mig_uuid"}
    for r in compat_rules():
        if not r["record"].startswith("DCGM_FI_"):
            continue
        gpu_term, _, mig_term = " ".join(r["expr"].split()).partition(
            " or max without (mig_uuid) ("
        )
        assert gpu_term.endswith(DCGM_LABEL_JOIN), r["record"]
        assert not mig_term or mig_term.endswith(f"{DCGM_MIG_JOIN} )"), r["record"]


def test_every_compat_recording_rule_has_a_checked_value() -> None:
    exprs = [e for t in _rule_tests() for e in t.get("promql_expr_test", [])]
    missing = [
        r["record"]
        for r in compat_rules()
        if not any(e["expr"].strip() == r["record"] and e.get("exp_samples") for e in exprs)
    ]
    assert not missing, f"compat recording rules without a promql_expr_test: {missing}"


def test_every_metric_and_label_the_compat_rules_select_exists() -> None:
    known = known_series()
    for r in compat_rules():
        known[r["record"]] = _outer_by(r["expr"]) or {"digit"}
    problems = []
    for rule in compat_rules():
        for metric, labels in selectors(rule["expr"]):
            if metric not in known:
                problems.append(f"{rule['record']}: unknown {metric}")
            elif labels - known[metric]:
                problems.append(f"{rule['record']}: {metric} {labels}")
    assert not problems, "\n".join(problems)


def test_the_migration_guide_has_a_row_for_every_default_counter() -> None:
    rows = {
        m.group(1): line
        for line in MIGRATION_DOC.read_text().splitlines()
        if (m := re.match(r"\| `(DCGM_FI_\w+)` \|", line))
    }
    missing = [c for c in (*DCGM_DEFAULT_COUNTERS, *DCGM_PROF_FIELDS) if c not in rows]
    assert not missing, f"docs/migrating-from-dcgm-exporter.md has no row for {missing}"
    for counter, why in NO_GPUSCOPE_SOURCE.items():
        assert "none" in rows[counter].lower(), f"{counter}: the guide must say ({why})"
