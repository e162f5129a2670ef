"""The generated deployment copies of the rules and dashboards match their sources; the
critical-XID list in the rules, labels and dashboards is agent/gpu/xid_catalog.py's; every
dashboard query selects the cluster, whose label name is one constant of the generator.

daemonset/base/prometheusrule.yaml, daemonset/overlays/plain-prometheus/rules-configmap.yaml
and daemonset/base/dashboards.yaml come from scripts/gen-deploy-assets.py. After changing
daemonset/rules/gpuscope.rules.yml or dashboards/*.json, regenerate them with
`scripts/gen-deploy-assets.py` or
`GPUSCOPE_UPDATE_GOLDEN=1 pytest tests/deploy/test_deploy_assets.py` (`make golden-update` does
it too). The DCGM compatibility names are the agent's (--dcgm-compat), not rules: the
overlay and components that turn them on are checked here too."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from gpuscope.agent.gpu import xid, xid_catalog
from gpuscope.exporters.labels import nvidia as labels_nvidia
from tests.deploy.test_scrape_objects import compose
from tests.support.manifests import find, render, render_text
from tests.support.observability import (
    DASHBOARDS,
    REPO,
    RULES,
    alerting_rules,
    dashboards,
    promtool_check_exprs,
    queries,
    selectors,
    substitute,
    variable_query,
    variables,
)

# Above this, `kubectl apply` (client side) cannot store the last-applied annotation.
KUBECTL_APPLY_LIMIT = 262_144


def generator() -> ModuleType:
    path = REPO / "scripts" / "gen-deploy-assets.py"
    spec = importlib.util.spec_from_file_location("gen_deploy_assets", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_generated_files_match_their_sources() -> None:
    rendered: dict[Path, str] = generator().render_all()
    if os.environ.get("GPUSCOPE_UPDATE_GOLDEN") == "1":
        for path, text in rendered.items():
            path.write_text(text)
    stale = [str(p.relative_to(REPO)) for p, t in rendered.items() if p.read_text() != t]
    assert not stale, f"stale: {stale}; run scripts/gen-deploy-assets.py"


def test_prometheus_rule_holds_the_same_groups() -> None:
    doc = yaml.safe_load((REPO / "daemonset/base/prometheusrule.yaml").read_text())
    assert (doc["apiVersion"], doc["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert doc["metadata"]["namespace"] == "gpuscope"
    assert doc["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_rules_configmap_holds_the_rules_file() -> None:
    path = REPO / "daemonset/overlays/plain-prometheus/rules-configmap.yaml"
    doc = yaml.safe_load(path.read_text())
    assert doc["metadata"]["name"] == "gpuscope-rules"
    assert doc["data"] == {"gpuscope.rules.yml": RULES.read_text()}


# --- the DCGM compatibility names: the agent's option, set by a component ----------------

DCGM_COMPONENTS = {"dcgm-compat": "on", "dcgm-compat-exported-labels": "exported-labels"}


def agent_args(docs: list[dict[str, Any]]) -> list[str]:
    (ds,) = find(docs, "DaemonSet", "gpuscope")
    agent = ds["spec"]["template"]["spec"]["containers"][0]  # what the components patch
    args: list[str] = agent["args"]
    return args


def test_dcgm_compat_overlay_is_the_base_with_the_agents_option_on() -> None:
    """The overlay adds no object (no rules to load) and one agent argument; the base and
    the other overlays serve no DCGM_FI_* name."""
    docs, base = render("overlays/dcgm-compat"), render("base")
    assert agent_args(docs) == [*agent_args(base), "--dcgm-compat=on"]
    assert [(d["kind"], d["metadata"]["name"]) for d in docs] == [
        (d["kind"], d["metadata"]["name"]) for d in base
    ]
    assert "dcgm-compat" not in render_text("base")
    assert "DCGM_FI_" not in render_text("base")


@pytest.mark.parametrize("component", DCGM_COMPONENTS)
@pytest.mark.parametrize("overlay", ["base", "overlays/plain-prometheus", "overlays/gpu-operator"])
def test_each_dcgm_component_sets_its_variant_on_any_overlay(
    tmp_path: Path, overlay: str, component: str
) -> None:
    docs = compose(tmp_path, overlay, component)
    plain = render(overlay)
    assert agent_args(docs) == [*agent_args(plain), f"--dcgm-compat={DCGM_COMPONENTS[component]}"]
    (ds,) = find(docs, "DaemonSet", "gpuscope")
    assert [d for d in docs if d is not ds] == [d for d in plain if d["kind"] != "DaemonSet"]


def test_the_agent_accepts_what_the_components_set() -> None:
    from gpuscope.agent.app.config import parse

    for value in DCGM_COMPONENTS.values():
        assert parse([f"--dcgm-compat={value}"], env={}).agent.dcgm_compat == value


def test_no_dcgm_rules_are_shipped() -> None:
    """The recording-rule layer is gone: nothing under daemonset/ records DCGM_FI_* names."""
    shipped = [
        p for p in (REPO / "daemonset").rglob("*.y*ml") if "record: DCGM_FI_" in p.read_text()
    ]
    assert not shipped


def test_one_configmap_per_dashboard_for_the_grafana_sidecar() -> None:
    path = REPO / "daemonset/base/dashboards.yaml"
    docs = list(yaml.safe_load_all(path.read_text()))
    sources = {json.loads(p.read_text())["uid"]: p for p in sorted(DASHBOARDS.glob("*.json"))}
    assert len(docs) == len(sources) == 4
    for doc in docs:
        assert doc["kind"] == "ConfigMap"
        assert doc["metadata"]["namespace"] == "gpuscope"
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        ((key, text),) = doc["data"].items()
        uid = key.removesuffix(".json")
        assert text == sources[uid].read_text()
        assert len(json.dumps(doc)) < KUBECTL_APPLY_LIMIT, doc["metadata"]["name"]


# --- the critical-XID list: one source, agent/gpu/xid_catalog.py -------------------------


def _xid_regexes(text: str) -> set[str]:
    return set(re.findall(r'(?<=")\d+(?:\|\d+)+(?=\\?")', text))


def test_the_rules_labels_and_dashboards_share_the_catalogs_critical_xids() -> None:
    regex = xid_catalog.critical_regex()
    assert _xid_regexes(RULES.read_text()) == {regex}
    (critical,) = [r for r in alerting_rules() if r["alert"] == "GPUXidCritical"]
    assert f'xid=~"{regex}"' in critical["expr"]
    fleet = (DASHBOARDS / "gpu-fleet.json").read_text()
    assert _xid_regexes(fleet) == {regex}
    for path in DASHBOARDS.glob("*.json"):
        assert _xid_regexes(path.read_text()) <= {regex}, path.name
    assert labels_nvidia.CRITICAL_XIDS == xid_catalog.CRITICAL_XIDS
    assert xid.FATAL_XIDS == xid_catalog.FATAL_XIDS <= xid_catalog.CRITICAL_XIDS
    assert xid_catalog.RECOVERY_ACTION_XID not in xid_catalog.CRITICAL_XIDS


def test_a_changed_catalog_is_written_into_the_rules_and_dashboards(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gen = generator()
    monkeypatch.setattr(gen, "critical_regex", lambda: "48|79|999")
    monkeypatch.setattr(gen, "critical_list", lambda: "48, 79, 999")
    rendered = gen.render_all()
    assert _xid_regexes(rendered[RULES]) == {"48|79|999"}
    fleet = rendered[DASHBOARDS / "gpu-fleet.json"]
    assert _xid_regexes(fleet) == {"48|79|999"}
    assert "critical XID (48, 79, 999)" in fleet
    assert 'xid=~\\"48|79|999\\"' in rendered[REPO / "daemonset/base/dashboards.yaml"]
    groups = yaml.safe_load(rendered[REPO / "daemonset/base/prometheusrule.yaml"])["spec"]
    assert "48|79|999" in json.dumps(groups)


# --- the cluster selector on every dashboard ----------------------------------------------


def _selects_cluster_everywhere(docs: dict[str, dict[str, Any]], label: str) -> list[str]:
    problems = []
    for name, d in docs.items():
        names = [v["name"] for v in variables(d)]
        if names[:2] != ["datasource", "cluster"]:
            problems.append(f"{name}: variables {names}: cluster must follow datasource")
        (cluster,) = [v for v in variables(d) if v["name"] == "cluster"]
        if variable_query(cluster) != f"label_values(gpuscope_build_info, {label})":
            problems.append(f"{name}: cluster variable query {variable_query(cluster)!r}")
        if not (cluster["includeAll"] and cluster["allValue"] == ".*"):
            problems.append(f"{name}: the cluster variable must default to All (.*)")
        for q in queries(name, d):
            if q.panel == "variable cluster":
                continue
            for metric, matched in selectors(q.expr):
                if label not in matched or f'{label}=~"$cluster"' not in q.expr:
                    problems.append(f"{q.where}: {metric} does not select {label}")
    return problems


def test_every_dashboard_query_selects_the_cluster() -> None:
    problems = _selects_cluster_everywhere(dashboards(), "cluster")
    assert not problems, "\n".join(problems)


def test_the_cluster_label_name_is_one_constant(tmp_path: Path) -> None:
    gen = generator()
    docs = {
        path.stem: json.loads(gen.dashboard_text(path, "k8s_cluster"))
        for path in sorted(DASHBOARDS.glob("*.json"))
    }
    problems = _selects_cluster_everywhere(docs, "k8s_cluster")
    assert not problems, "\n".join(problems)
    text = json.dumps(docs)
    assert 'cluster=~\\"$cluster\\"' not in text.replace('k8s_cluster=~\\"$cluster\\"', "")
    # Regenerated with the default, the dashboards are what the repository holds.
    for path in sorted(DASHBOARDS.glob("*.json")):
        again = json.loads(gen.dashboard_text(path))
        assert json.dumps(gen.with_cluster(again), indent=2, ensure_ascii=False) + "\n" == (
            path.read_text()
        )
    values = {"cluster": ".*", "node": "n", "gpu": ".*", "namespace": "a", "workload": "w"}
    values |= {"vendor": ".*", "model": ".*"}
    values |= {"__rate_interval": "1m", "__interval": "15s", "__interval_ms": "15000"}
    values |= {"__range": "6h"}
    exprs = {}
    for name, d in docs.items():
        for q in queries(name, d):
            expr = q.expr
            if q.kind == "variable":
                expr = expr.removeprefix("label_values(").rsplit(",", 1)[0]
            exprs[q.where] = substitute(expr, values)
    assert not promtool_check_exprs(exprs, tmp_path)
