"""The scrape objects beside the base's PodMonitor: the ServiceMonitor overlay
(daemonset/overlays/servicemonitor: a headless Service and a ServiceMonitor that scrape and
label exactly as the PodMonitor does), the `release` label kube-prometheus-stack selects on
(daemonset/components/release-label), and the agent's own node label for scrapes that add
none (daemonset/components/series-node-label). Rendered with `kubectl kustomize`; the Service
is validated against the Kubernetes schemas by test_deploy_manifests.py (KUSTOMIZATIONS)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import yaml

from tests.deploy.test_deploy_manifests import OWN_LABELS, POD_META, agent_config, relabel
from tests.support import REPO
from tests.support.manifests import daemonset, find, kubectl, render

DEPLOY_DOC = REPO / "docs" / "deploy.md"
MONITORING = ("PodMonitor", "ServiceMonitor", "PrometheusRule")


def compose(tmp_path: Path, resource: str, *components: str) -> list[dict[str, Any]]:
    """An overlay of the user's own, in `tmp_path`: `resource` (daemonset/...) with the
    components (daemonset/components/...), as docs/deploy.md tells them to write it."""
    doc = {
        "resources": [f"../gpuscope/daemonset/{resource}"],
        "components": [f"../gpuscope/daemonset/components/{c}" for c in components],
    }
    return kustomize(tmp_path, yaml.safe_dump(doc))


def kustomize(tmp_path: Path, kustomization: str) -> list[dict[str, Any]]:
    """`kubectl kustomize` of a user's overlay whose paths name this checkout
    `../gpuscope/`, as docs/deploy.md's examples do."""
    here = tmp_path / "overlay"
    here.mkdir(parents=True)
    text = kustomization.replace("../gpuscope/", os.path.relpath(REPO, here) + "/")
    (here / "kustomization.yaml").write_text(text)
    proc = subprocess.run(
        [kubectl(), "kustomize", str(here)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_servicemonitor_overlay_replaces_the_podmonitor() -> None:
    docs = render("overlays/servicemonitor")
    assert not find(docs, "PodMonitor")
    ((service,), (monitor,)) = find(docs, "Service"), find(docs, "ServiceMonitor")
    template = daemonset(docs)["spec"]["template"]
    assert service["spec"]["clusterIP"] == "None"  # one endpoint per pod, no virtual IP
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    (port,) = service["spec"]["ports"]
    (container,) = template["spec"]["containers"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert port["targetPort"] in ports
    assert port["port"] == ports[port["targetPort"]] == agent_config(docs).agent.listen[1]
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )
    assert monitor["spec"]["namespaceSelector"] == {
        "matchNames": [service["metadata"]["namespace"]]
    }
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["port"] == port["name"] and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True
    # The PodMonitor's scrape, unchanged: same interval and timeout, same labels.
    (podmonitor,) = find(render("base"), "PodMonitor")
    (pm_endpoint,) = podmonitor["spec"]["podMetricsEndpoints"]
    for key in ("interval", "scrapeTimeout", "honorLabels", "relabelings"):
        assert endpoint[key] == pm_endpoint[key], key
    kubernetes_validate.validate(service, kubernetes_validate.latest_version(), strict=True)


def test_servicemonitor_targets_get_node_and_none_of_the_agents_own_labels() -> None:
    (monitor,) = find(render("overlays/servicemonitor"), "ServiceMonitor")
    (endpoint,) = monitor["spec"]["endpoints"]
    # What the Prometheus Operator sets on every ServiceMonitor target (role endpoints, the
    # pod's meta labels included) before these relabelings.
    target = POD_META | {
        "__meta_kubernetes_service_name": "gpuscope",
        "__meta_kubernetes_endpoint_port_name": "metrics",
        "namespace": "gpuscope",
        "service": "gpuscope",
        "pod": "gpuscope-x7k2p",
        "container": "gpuscope",
        "endpoint": "metrics",
        "job": "gpuscope",
        "instance": "10.4.7.21:19400",
    }
    out = relabel(target, endpoint["relabelings"])
    assert out is not None and out["node"] == "gpu-node-1"
    assert not OWN_LABELS & out.keys(), out
    assert re.fullmatch(".*gpuscope.*", out["job"])  # GpuscopeDown's selector


def test_release_label_on_the_monitoring_objects_only(tmp_path: Path) -> None:
    for i, resource in enumerate(("base", "overlays/servicemonitor")):
        docs = compose(tmp_path / str(i), resource, "release-label")
        labelled = {d["kind"] for d in docs if "release" in d["metadata"].get("labels", {})}
        present = {d["kind"] for d in docs if d["kind"] in MONITORING}
        assert labelled == present, resource
        assert present == {"PodMonitor" if i == 0 else "ServiceMonitor", "PrometheusRule"}
        for d in docs:
            if d["kind"] in MONITORING:
                assert d["metadata"]["labels"]["release"] == "kube-prometheus-stack"
        assert daemonset(docs)["spec"]["template"]["metadata"]["labels"].get("release") is None


def test_series_node_label_component_turns_the_flag_on(tmp_path: Path) -> None:
    assert agent_config(render("base")).agent.series_node_label is False
    docs = compose(tmp_path, "overlays/plain-prometheus", "series-node-label")
    assert agent_config(docs).agent.series_node_label is True


def test_deploy_doc_names_the_overlay_and_components() -> None:
    text = DEPLOY_DOC.read_text()
    for path in (
        "daemonset/overlays/servicemonitor",
        "daemonset/components/release-label",
        "daemonset/components/series-node-label",
        "--series-node-label",
    ):
        assert path in text, path


def test_the_deploy_docs_release_example_renders(tmp_path: Path) -> None:
    blocks = re.findall(r"```yaml\n(.*?)```", DEPLOY_DOC.read_text(), re.S)
    (example,) = [b for b in blocks if "components/release-label" in b]
    docs = kustomize(tmp_path, example)
    labels = {d["kind"]: d["metadata"]["labels"].get("release") for d in docs}
    assert labels["ServiceMonitor"] == labels["PrometheusRule"] == "my-monitoring"
