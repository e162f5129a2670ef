"""The generated deployment copies of the rules and dashboards match their sources; the
critical-XID list in the rules, labels and dashboards is agent/gpu/xid_catalog.py's; every
dashboard query selects the cluster, whose label name is one constant of the generator.

daemonset/base/prometheusrule.yaml, daemonset/overlays/plain-prometheus/rules-configmap.yaml
and daemonset/base/dashboards.yaml come from scripts/gen-deploy-assets.py. After changing
daemonset/rules/gpuscope.rules.yml or dashboards/*.json, regenerate them with
`scripts/gen-deploy-assets.py` or
`GPUSCOPE_UPDATE_GOLDEN=1 pytest tests/deploy/test_deploy_assets.py` (`make golden-update` does
it too). The DCGM compatibility rules (daemonset/rules/dcgm-compat.rules.yml) become
daemonset/overlays/dcgm-compat/prometheusrule.yaml and
daemonset/overlays/plain-prometheus-dcgm-compat/rules-configmap.yaml the same way."""

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


DCGM_COMPAT_RULES = REPO / "daemonset" / "rules" / "dcgm-compat.rules.yml"
DCGM_COMPAT_EXPORTED_RULES = REPO / "daemonset" / "rules" / "dcgm-compat-exported-labels.rules.yml"


def test_dcgm_compat_overlay_adds_its_own_prometheus_rule_beside_the_base() -> None:
    """The compatibility rules come as a PrometheusRule of their own, only with the overlay:
    the base and the other overlays never record DCGM_FI_* names."""
    docs = render("overlays/dcgm-compat")
    rules = {d["metadata"]["name"]: d for d in find(docs, "PrometheusRule")}
    assert set(rules) == {"gpuscope", "gpuscope-dcgm-compat"}
    compat = rules["gpuscope-dcgm-compat"]
    assert compat["metadata"]["namespace"] == "gpuscope"
    assert compat["spec"]["groups"] == yaml.safe_load(DCGM_COMPAT_RULES.read_text())["groups"]
    assert "DCGM_FI_" not in render_text("base")
    base = [(d["kind"], d["metadata"]["name"]) for d in render("base")]
    assert sorted([*base, ("PrometheusRule", "gpuscope-dcgm-compat")]) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in docs
    )


def test_plain_prometheus_dcgm_compat_overlay_adds_the_rules_file_as_a_configmap() -> None:
    docs = render("overlays/plain-prometheus-dcgm-compat")
    assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")]
    (compat,) = find(docs, "ConfigMap", "gpuscope-dcgm-compat-rules")
    assert compat["data"] == {"dcgm-compat.rules.yml": DCGM_COMPAT_RULES.read_text()}
    plain = [(d["kind"], d["metadata"]["name"]) for d in render("overlays/plain-prometheus")]
    assert sorted([*plain, ("ConfigMap", "gpuscope-dcgm-compat-rules")]) == sorted(
        (d["kind"], d["metadata"]["name"]) for d in docs
    )


# --- the exported_* variant: a component that swaps the rules in either overlay -----------

EXPORTED_COMPONENT = REPO / "daemonset" / "components" / "dcgm-compat-exported-labels"


@pytest.mark.parametrize(
    "overlay", ["overlays/dcgm-compat", "overlays/plain-prometheus-dcgm-compat"]
)
def test_the_exported_labels_component_swaps_the_compat_rules_and_nothing_else(
    tmp_path: Path, overlay: str
) -> None:
    """With the component, the overlay's compatibility rules are the exported_* variant (the
    PrometheusRule's groups, or the ConfigMap's file under the same key); every other object
    is the overlay's own."""
    docs = compose(tmp_path, overlay, EXPORTED_COMPONENT.name)
    plain = render(overlay)
    exported_text = DCGM_COMPAT_EXPORTED_RULES.read_text()
    if overlay == "overlays/dcgm-compat":
        (compat,) = find(docs, "PrometheusRule", "gpuscope-dcgm-compat")
        assert compat["spec"]["groups"] == yaml.safe_load(exported_text)["groups"]
        (before,) = find(plain, "PrometheusRule", "gpuscope-dcgm-compat")
    else:
        (compat,) = find(docs, "ConfigMap", "gpuscope-dcgm-compat-rules")
        assert compat["data"] == {"dcgm-compat.rules.yml": exported_text}
        (before,) = find(plain, "ConfigMap", "gpuscope-dcgm-compat-rules")
    assert compat["metadata"] == before["metadata"]
    assert [d for d in docs if d is not compat] == [d for d in plain if d != before]
    by_list = "exported_namespace, exported_pod, exported_container"  # the join's by()
    assert by_list in json.dumps(compat) and by_list not in json.dumps(plain)


def test_the_exported_labels_component_composes_with_the_release_label(tmp_path: Path) -> None:
    """kube-prometheus-stack users add the release label too: both components patch the same
    PrometheusRule, one its labels, the other its groups."""
    docs = compose(tmp_path, "overlays/dcgm-compat", "release-label", EXPORTED_COMPONENT.name)
    (compat,) = find(docs, "PrometheusRule", "gpuscope-dcgm-compat")
    assert compat["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    exported = yaml.safe_load(DCGM_COMPAT_EXPORTED_RULES.read_text())["groups"]
    assert compat["spec"]["groups"] == exported


def test_the_overlays_name_the_component_as_their_switch() -> None:
    """The switch is documented where it is thrown: a commented `components:` entry that,
    uncommented, is the path of the component."""
    for overlay in ("dcgm-compat", "plain-prometheus-dcgm-compat"):
        text = (REPO / "daemonset" / "overlays" / overlay / "kustomization.yaml").read_text()
        assert "#   - ../../components/dcgm-compat-exported-labels" in text, overlay
        target = (REPO / "daemonset" / "overlays" / overlay / "../../components").resolve()
        assert (target / "dcgm-compat-exported-labels" / "kustomization.yaml").exists()


def test_the_exported_variant_fails_loudly_when_the_source_join_changes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A source whose label join no longer has the shape the rewrite expects must stop the
    generator, not yield a variant that still labels namespace/pod/container."""
    gen = generator()
    changed = tmp_path / "dcgm-compat.rules.yml"
    text = DCGM_COMPAT_RULES.read_text()
    changed.write_text(text.replace("DCGM_FI_DRIVER_VERSION, namespace, pod, container", "x"))
    monkeypatch.setattr(gen, "DCGM_COMPAT_RULES", changed)
    monkeypatch.setattr(gen, "REPO", tmp_path)
    with pytest.raises(ValueError, match="matched 0 times"):
        gen.dcgm_compat_exported_text()


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
