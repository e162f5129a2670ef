"""One way to build a Kubernetes API client, shared by every part of the agent that talks to
the API server: --kubeconfig when given, else in-cluster config (the DaemonSet), else
$KUBECONFIG / ~/.kube/config (a developer's machine). lightkube's default timeouts (10 s,
none on watch reads) suit the agent."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def make_client(kubeconfig: Path | None = None) -> Any:
    from lightkube import Client, KubeConfig

    if kubeconfig is not None:
        return Client(config=KubeConfig.from_file(kubeconfig))
    return Client()
