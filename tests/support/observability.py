"""Reading gpuscope's dashboards and rules for the tests: panels, their PromQL, the metrics and
template variables they use, and Grafana's variable substitution."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from gpuscope.agent.app.exposition import catalog

REPO = Path(__file__).resolve().parents[2]
DASHBOARDS = REPO / "dashboards"
RULES = REPO / "daemonset" / "rules" / "gpuscope.rules.yml"
ALERTS_DOC = REPO / "docs" / "alerts.md"
RUNBOOK_BASE = "https://github.com/gpuscope/gpuscope/blob/main/docs/alerts.md#"

# Labels a scrape adds to every series (the agent never exports them; `node` unless
# --series-node-label asks).
SCRAPE_LABELS = frozenset({"node", "job", "instance"})
# The external label that names the cluster in Thanos or Mimir, on every series recorded
# ones included (the dashboards' cluster selector, scripts/gen-deploy-assets.py CLUSTER_LABEL).
EXTERNAL_LABELS = frozenset({"cluster"})
# Grafana's built-in variables.
GRAFANA_BUILTINS = frozenset(
    {"__rate_interval", "__interval", "__interval_ms", "__range", "__range_s", "__range_ms"}
)
# kube-state-metrics series the optional rules read (docs/alerts.md: empty without it), with
# the labels kube-state-metrics gives them.
KUBE_STATE_METRICS = {
    "kube_pod_status_phase": frozenset({"namespace", "pod", "uid", "phase"}),
    "kube_pod_owner": frozenset(
        {"namespace", "pod", "uid", "owner_kind", "owner_name", "owner_is_controller"}
    ),
}
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
_KEYWORDS = frozenset(
    {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or"}
    | {"unless", "offset", "atan2", "inf", "nan", "start", "end"}
)
_AGGREGATIONS = frozenset(
    {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk"}
    | {"quantile", "count_values"}
)
_LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
_VAR = re.compile(r"\$(?:\{(\w+)(?::\w+)?\}|(\w+))")


@dataclass(frozen=True)
class Query:
    dashboard: str  # file stem
    panel: str  # panel title (or "variable <name>")
    ref: str  # target refId
    expr: str
    instant: bool
    kind: str  # panel type, or "variable"

    @property
    def where(self) -> str:
        return f"{self.dashboard}.json / {self.panel!r} / {self.ref}"


def dashboards() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))}


def panels(dashboard: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels included (a collapsed row holds its own)."""
    for panel in dashboard.get("panels", []):
        yield panel
        yield from panel.get("panels", [])


def variables(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    return list(dashboard.get("templating", {}).get("list", []))


def variable_query(var: Mapping[str, Any]) -> str:
    query = var.get("query", "")
    return str(query.get("query", "")) if isinstance(query, dict) else str(query)


def queries(name: str, dashboard: Mapping[str, Any]) -> list[Query]:
    out = []
    for panel in panels(dashboard):
        for target in panel.get("targets", []):
            out.append(
                Query(
                    name,
                    panel.get("title", ""),
                    target.get("refId", "?"),
                    target.get("expr", ""),
                    bool(target.get("instant")),
                    panel.get("type", ""),
                )
            )
    for var in variables(dashboard):
        if var.get("type") == "query":
            out.append(
                Query(
                    name, f"variable {var['name']}", "query", variable_query(var), True, "variable"
                )
            )
    for annotation in annotations(dashboard):
        out.append(
            Query(
                name, f"annotation {annotation.get('name', '')}", "annotation",
                annotation["expr"], False, "annotation",
            )
        )  # fmt: skip
    return out


def annotations(dashboard: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The dashboard's Prometheus annotation queries (those with an `expr`)."""
    return [a for a in dashboard.get("annotations", {}).get("list", []) if "expr" in a]


def all_queries() -> list[Query]:
    return [q for name, d in dashboards().items() for q in queries(name, d)]


def used_variables(text: str) -> set[str]:
    return {a or b for a, b in _VAR.findall(text)}


def substitute(expr: str, values: Mapping[str, str]) -> str:
    """Grafana's interpolation for the forms the dashboards use: $name and ${name}."""

    def one(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2)
        if name not in values:
            raise KeyError(f"no value for ${name} in {expr!r}")
        return values[name]

    # Longest names first is implicit: \w+ is greedy, so $__rate_interval is never $__rate.
    return _VAR.sub(one, expr)


def label_values_query(expr: str) -> tuple[str, str] | None:
    """(selector, label) of a Grafana `label_values(selector, label)` variable query."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*(\w+)\s*\)\s*", expr, re.S)
    return (m.group(1).strip(), m.group(2)) if m else None


# --- a small PromQL lexer: metric names and the label matchers used with them -------------


def _strip_strings(expr: str) -> str:
    return re.sub(r'"(?:\\.|[^"\\])*"|\'(?:\\.|[^\'\\])*\'|`[^`]*`', "0", expr)


_NUMBER = re.compile(r"\d[\d.]*(?:[eE][-+]?\d+)?[a-zA-Z]*")  # numbers and durations
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")


def selectors(expr: str) -> list[tuple[str, set[str]]]:
    """(metric name, label names matched) of every vector selector in `expr`.

    Understands enough PromQL for the dashboards and rules: strings, label matchers, range
    and subquery brackets, label lists after by/without/on/ignoring/group_left/group_right,
    function calls, keywords, numbers, durations and Grafana variables in a number's place.
    `label_values(sel, label)` counts as sel.
    """
    lv = label_values_query(expr)
    if lv:
        expr = lv[0]
    text = _strip_strings(expr)
    out: list[tuple[str, set[str]]] = []
    i, n = 0, len(text)
    skip_list = False
    while i < n:
        c = text[i]
        if c.isspace() or c in ",+-*/%^=!<>[()":
            i, skip_list = _skip_punctuation(text, i, skip_list)
            continue
        if c == "{":  # a selector without a metric name
            end = text.index("}", i)
            out.append(("", _matcher_labels(text[i + 1 : end])))
            i = end + 1
            continue
        m = _NUMBER.match(text, i) or _VAR.match(text, i)  # a Grafana variable is a number
        if m:
            i = m.end()
            continue
        m = _NAME.match(text, i)
        if not m:
            raise ValueError(f"cannot lex {expr!r} at {text[i:]!r}")
        word, i = m.group(), m.end()
        if word in _KEYWORDS:
            skip_list = word in _LABEL_LIST_KEYWORDS
            continue
        selector, i = _named_selector(text, word, i)
        if selector is not None:
            out.append(selector)
    return out


def _skip_punctuation(text: str, i: int, skip_list: bool) -> tuple[int, bool]:
    """Past one operator, space, bracket or paren at `i`: a range or subquery `[...]` whole,
    and the `(...)` after by/without/on/... whole too, since its names are labels, not
    metrics. Returns the new position and whether a label list is still expected."""
    c = text[i]
    if c == "[":
        return text.index("]", i) + 1, skip_list
    if c == "(" and skip_list:
        return text.index(")", i) + 1, False
    return i + 1, skip_list


def _named_selector(text: str, word: str, i: int) -> tuple[tuple[str, set[str]] | None, int]:
    """`word` (ending at `i`) as a metric selector with its matchers, if any, and where the
    lexer goes on; None for a function call or an aggregation."""
    n = len(text)
    j = i
    while j < n and text[j].isspace():
        j += 1
    nxt = text[j] if j < n else ""
    if nxt == "(" or word in _AGGREGATIONS:
        return None, i  # a function or an aggregation
    labels: set[str] = set()
    if nxt == "{":
        end = text.index("}", j)
        labels = _matcher_labels(text[j + 1 : end])
        i = end + 1
    return (word, labels), i


def _matcher_labels(body: str) -> set[str]:
    return set(re.findall(r"([a-zA-Z_]\w*)\s*(?:=~|!~|!=|=)", body))


# --- what exists --------------------------------------------------------------------------


def rules_doc() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(RULES.read_text())
    return doc


def rules() -> list[dict[str, Any]]:
    return [r for g in rules_doc()["groups"] for r in g["rules"]]


def recording_rules() -> list[dict[str, Any]]:
    return [r for r in rules() if "record" in r]


def alerting_rules() -> list[dict[str, Any]]:
    return [r for r in rules() if "alert" in r]


def recording_rule_labels() -> dict[str, set[str]]:
    """Labels each recorded series carries: the by() of its outermost aggregation, or those
    of its join (recorded from the rule's own expression, so they cannot drift)."""
    out: dict[str, set[str]] = {}
    for r in recording_rules():
        expr = " ".join(r["expr"].split())
        m = re.match(r"\w+ by \(([^)]*)\)", expr)
        labels = {x.strip() for x in m.group(1).split(",")} if m else set()
        for extra in re.findall(r"group_left \(([^)]*)\)", expr):
            labels |= {x.strip() for x in extra.split(",") if x.strip()}
        out[r["record"]] = labels
    return out


def known_series() -> dict[str, set[str]]:
    """Every series name a query may select, with the labels it may match on."""
    known: dict[str, set[str]] = {}
    for m in catalog().metrics:
        labels = set(m.labels) | SCRAPE_LABELS
        if m.kind == "histogram":
            for suffix in _HISTOGRAM_SUFFIXES:
                known[m.name + suffix] = labels | ({"le"} if suffix == "_bucket" else set())
        else:
            known[m.name] = labels
    known.update(recording_rule_labels())
    known.update({name: set(labels) | SCRAPE_LABELS for name, labels in KUBE_STATE_METRICS.items()})
    known["up"] = set(SCRAPE_LABELS)
    known["ALERTS"] = alert_labels(known)
    return {name: labels | EXTERNAL_LABELS for name, labels in known.items()}


def alert_labels(known: Mapping[str, set[str]]) -> set[str]:
    """Labels Prometheus's ALERTS series of the shipped alerts may carry: alertname and
    alertstate, and each alert's own: its static labels, those of the series its expression
    selects and those its joins add (more than any one alert has: a name check, not a
    contract)."""
    labels = {"alertname", "alertstate"}
    for rule in alerting_rules():
        labels |= set(rule.get("labels", {}))
        for metric, _matched in selectors(rule["expr"]):
            labels |= known.get(metric, set())
        for extra in re.findall(r"group_left \(([^)]*)\)", " ".join(rule["expr"].split())):
            labels |= {x.strip() for x in extra.split(",") if x.strip()}
    return labels


def promtool_check_exprs(exprs: Mapping[str, str], tmp: Path) -> dict[str, str]:
    """Parse each expression with promtool (as a recording rule); {key: error} of failures."""
    keys = list(exprs)
    doc = {
        "groups": [
            {
                "name": "parse",
                "rules": [{"record": f"parse:q{i}", "expr": exprs[k]} for i, k in enumerate(keys)],
            }
        ]
    }
    path = tmp / "parse.rules.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    proc = subprocess.run(
        ["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False
    )
    if proc.returncode == 0:
        return {}
    errors: dict[str, str] = {}
    for line in (proc.stdout + proc.stderr).splitlines():
        m = re.search(r'"parse:q(\d+)": (.*)', line)
        if m:
            errors[keys[int(m.group(1))]] = m.group(2)
    return errors or {"(promtool)": proc.stdout + proc.stderr}
