"""Static checks of the Grafana dashboards (dashboards/*.json): the schema rules, one data
source variable used everywhere, units and descriptions, rate windows, that every metric and
label they select exists in the agent's catalog (or the recording rules), and that every
query parses (promtool). Whether the queries return data on a real agent is
tests/e2e/test_prometheus_e2e.py's job."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support.observability import (
    GRAFANA_BUILTINS,
    Query,
    all_queries,
    annotations,
    dashboards,
    known_series,
    panels,
    promtool_check_exprs,
    queries,
    selectors,
    substitute,
    used_variables,
    variable_query,
    variables,
)

EXPECTED = {  # file stem -> uid: links and provisioning depend on the uids never changing
    "gpu-fleet": "gpuscope-fleet",
    "node": "gpuscope-node",
    "training-job": "gpuscope-training-job",
    "network": "gpuscope-network",
}
PANEL_TYPES = {"timeseries", "stat", "table", "bargauge", "heatmap", "row"}
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
# Panels that deliberately total over the whole dashboard range ([$__range]) rather than
# rate over $__rate_interval: totals and straggler rankings for the time picked. Over a
# recorded rate (the fleet's GPU-hours), the total is a subquery at Grafana's step,
# [$__range:$__interval], each step's rate times $__interval_ms.
RANGE_PANELS = {
    ("gpu-fleet", "GPU-hours wasted"),
    ("gpu-fleet", "GPU-hours wasted by namespace"),
    ("gpu-fleet", "GPU-hours wasted by workload"),
    ("gpu-fleet", "GPU-hours busy, SMs idle"),
    ("gpu-fleet", "Idle GPU-hours by cause"),
    ("gpu-fleet", "GPU-hours busy, SMs idle by cause"),
    ("gpu-fleet", "Idle GPU-hours by workload and cause"),
    ("training-job", "Idle GPU-hours"),
    ("training-job", "Idle GPU-hours by cause"),
    ("training-job", "GPU-hours busy, SMs idle by cause"),
}
RANGE_WINDOWS = ("$__range", "$__range:$__interval")
# Values for a static parse only (the e2e test substitutes values read from the data).
SAMPLE_VALUES = {
    "cluster": ".*",
    "node": "node-a",
    "gpu": ".*",
    "vendor": ".*",
    "model": ".*",
    "namespace": "ml-team",
    "workload": "llama-ft",
    "__rate_interval": "1m",
    "__interval": "15s",
    "__interval_ms": "15000",
    "__range": "6h",
}


def problems_report(problems: list[str]) -> str:
    return f"{len(problems)} problem(s):\n  " + "\n  ".join(problems)


def test_the_four_dashboards_exist_with_stable_uids() -> None:
    found = {name: d["uid"] for name, d in dashboards().items()}
    assert found == EXPECTED


def test_schema_panel_types_ids_titles_and_layout() -> None:
    problems = []
    for name, d in dashboards().items():
        if d.get("schemaVersion", 0) < 39:
            problems.append(f"{name}: schemaVersion {d.get('schemaVersion')} < 39")
        if not d.get("title", "").startswith("gpuscope / "):
            problems.append(f"{name}: title {d.get('title')!r} does not start with 'gpuscope / '")
        if "gpuscope" not in d.get("tags", []):
            problems.append(f"{name}: no 'gpuscope' tag (the dashboards link to each other by it)")
        if d.get("id") is not None:
            problems.append(f"{name}: id must be null (Grafana assigns it)")
        ids, titles = set(), set()
        cells: dict[tuple[int, int], str] = {}
        for p in panels(d):
            title = p.get("title", "")
            if p.get("type") not in PANEL_TYPES:
                problems.append(f"{name}: {title!r}: panel type {p.get('type')!r} not allowed")
            if p.get("id") in ids:
                problems.append(f"{name}: {title!r}: duplicate panel id {p.get('id')}")
            ids.add(p.get("id"))
            if p.get("type") != "row":
                if not title or title in titles:
                    problems.append(f"{name}: panel title {title!r} missing or duplicated")
                titles.add(title)
            pos = p.get("gridPos", {})
            x, y, w, h = (pos.get(k, -1) for k in ("x", "y", "w", "h"))
            if min(x, y) < 0 or w <= 0 or h <= 0 or x + w > 24:
                problems.append(f"{name}: {title!r}: bad gridPos {pos}")
                continue
            for cx in range(x, x + w):
                for cy in range(y, y + h):
                    if (cx, cy) in cells:
                        problems.append(f"{name}: {title!r} overlaps {cells[(cx, cy)]!r}")
                        break
                    cells[(cx, cy)] = title
                else:
                    continue
                break
            if p.get("type") == "row":
                continue
            refs = [t.get("refId") for t in p.get("targets", [])]
            if not refs or len(set(refs)) != len(refs):
                problems.append(f"{name}: {title!r}: no targets, or duplicate refIds {refs}")
    assert not problems, problems_report(problems)


def test_one_datasource_variable_used_by_every_panel_target_and_variable() -> None:
    problems = []
    for name, d in dashboards().items():
        ds_vars = [v for v in variables(d) if v.get("type") == "datasource"]
        if [(v.get("name"), v.get("query")) for v in ds_vars] != [("datasource", "prometheus")]:
            problems.append(
                f"{name}: need exactly one datasource variable 'datasource' (prometheus)"
            )
        for v in variables(d):
            if v.get("type") == "query" and v.get("datasource") != DATASOURCE:
                problems.append(
                    f"{name}: variable {v.get('name')}: datasource {v.get('datasource')}"
                )
        for p in panels(d):
            if p.get("type") == "row":
                continue
            if p.get("datasource") != DATASOURCE:
                problems.append(f"{name}: {p['title']!r}: panel datasource {p.get('datasource')}")
            for t in p.get("targets", []):
                if t.get("datasource") != DATASOURCE:
                    problems.append(
                        f"{name}: {p['title']!r} {t.get('refId')}: target datasource "
                        f"{t.get('datasource')}"
                    )
        for a in annotations(d):
            if a.get("datasource") != DATASOURCE:
                problems.append(f"{name}: annotation {a.get('name')!r}: {a.get('datasource')}")
    assert not problems, problems_report(problems)


def test_every_panel_has_a_unit_and_a_description() -> None:
    problems = []
    for name, d in dashboards().items():
        for p in panels(d):
            if p.get("type") == "row":
                continue
            if not p.get("fieldConfig", {}).get("defaults", {}).get("unit"):
                problems.append(f"{name}: {p['title']!r}: no unit")
            if len(p.get("description", "")) < 20:
                problems.append(f"{name}: {p['title']!r}: no (real) description")
            if p.get("type") == "heatmap" and not p.get("options", {}).get("yAxis", {}).get("unit"):
                problems.append(f"{name}: {p['title']!r}: heatmap without a y-axis unit")
    assert not problems, problems_report(problems)


def test_heatmaps_read_histogram_buckets_as_heatmaps() -> None:
    problems = []
    for name, d in dashboards().items():
        for p in panels(d):
            if p.get("type") != "heatmap" or p["options"].get("calculate"):
                continue
            for t in p["targets"]:
                if t.get("format") != "heatmap" or "_bucket" not in t["expr"]:
                    problems.append(f"{name}: {p['title']!r}: not a bucket query in heatmap format")
                if "by (le)" not in t["expr"]:
                    problems.append(f"{name}: {p['title']!r}: buckets not summed by (le)")
    assert not problems, problems_report(problems)


def test_every_range_is_the_rate_interval_or_a_deliberate_dashboard_range() -> None:
    problems = []
    used_range = set()
    for q in all_queries():
        for window in re.findall(r"\[([^\]]*)\]", q.expr):
            if window == "$__rate_interval":
                continue
            if window in RANGE_WINDOWS and (q.dashboard, q.panel) in RANGE_PANELS:
                used_range.add((q.dashboard, q.panel))
                if not q.instant:
                    problems.append(f"{q.where}: [$__range] in a range query (totals are instant)")
                continue
            problems.append(f"{q.where}: range [{window}] (use $__rate_interval, or allow-list)")
        for fn in re.findall(r"\b(rate|irate|increase)\s*\(", q.expr):
            if not re.search(rf"\b{fn}\s*\([^\[]*\[\$__(rate_interval|range)\]", q.expr):
                problems.append(f"{q.where}: {fn}() without a $__rate_interval/$__range window")
    assert not problems, problems_report(problems)
    assert used_range == RANGE_PANELS, (
        f"allow-listed but not using [$__range]: {RANGE_PANELS - used_range}"
    )


def test_every_variable_used_is_defined() -> None:
    problems = []
    for name, d in dashboards().items():
        defined = {v["name"] for v in variables(d)} | GRAFANA_BUILTINS
        for q in queries(name, d):
            for var in used_variables(q.expr) - defined:
                problems.append(f"{q.where}: ${var} is not a variable of the dashboard")
        for v in variables(d):
            if v.get("type") == "query" and not variable_query(v).startswith("label_values("):
                problems.append(f"{name}: variable {v['name']}: not a label_values() query")
    assert not problems, problems_report(problems)


def test_every_metric_and_label_selected_exists() -> None:
    """Against exporters/prometheus/catalog.py (plus scrape labels, the recording rules and
    `up`): a renamed metric or label fails here, not silently in Grafana."""
    known = known_series()
    problems = []
    for q in all_queries():
        found = selectors(q.expr)
        if not found:
            problems.append(f"{q.where}: selects no metric")
        for metric, labels in found:
            if metric not in known:
                problems.append(f"{q.where}: unknown metric {metric or '{...}'}")
            elif labels - known[metric]:
                problems.append(
                    f"{q.where}: {metric} has no label(s) {sorted(labels - known[metric])}"
                )
    assert not problems, problems_report(problems)


def test_the_lexer_finds_metrics_not_labels_functions_or_durations() -> None:
    expr = (
        'sort_desc(sum by (node, xid) (increase(gpuscope_gpu_xid_errors_total{xid=~"48|79"}'
        '[$__range] offset 1h)) / on (node) group_left (gpu) up{job="x"} * 1e-3) '
        'or label_replace(vector(0), "a", "b", "", "")'
    )
    assert selectors(expr) == [
        ("gpuscope_gpu_xid_errors_total", {"xid"}),
        ("up", {"job"}),
    ]


def test_every_query_parses(tmp_path: Path) -> None:
    exprs: dict[str, str] = {}
    for q in all_queries():
        expr = q.expr
        if q.kind == "variable":
            expr = expr.removeprefix("label_values(").rsplit(",", 1)[0]
        exprs[q.where] = substitute(expr, SAMPLE_VALUES)
    errors = promtool_check_exprs(exprs, tmp_path)
    assert not errors, problems_report([f"{k}: {v}" for k, v in errors.items()])


def test_queries_are_listed_for_failure_reports() -> None:
    # The e2e test names failures by dashboard and panel title: every query has both.
    for q in all_queries():
        assert isinstance(q, Query) and q.dashboard and q.panel and q.expr, q
