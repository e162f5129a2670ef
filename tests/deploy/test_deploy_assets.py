"""The generated deployment copies of the rules and dashboards match their sources.

daemonset/base/prometheusrule.yaml, daemonset/overlays/plain-prometheus/rules-configmap.yaml
and daemonset/base/dashboards.yaml come from scripts/gen-deploy-assets.py. After changing
daemonset/rules/gpuscope.rules.yml or dashboards/*.json, regenerate them with
`scripts/gen-deploy-assets.py` or
`GPUSCOPE_UPDATE_GOLDEN=1 pytest tests/deploy/test_deploy_assets.py` (`make golden-update` does
it too)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path
from types import ModuleType

import yaml

from tests.support.observability import DASHBOARDS, REPO, RULES

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
