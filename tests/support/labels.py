"""The Node the label tests publish to, on the API server double, and what they read back."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from lightkube import Client, KubeConfig

from tests.doubles.kube_apiserver import KubeApiServer

P = "gpuscope.io/"
FOREIGN = {"kubernetes.io/hostname": "gpu-node-1", "nvidia.com/gpu.product": "H100"}


@contextlib.contextmanager
def node_api(tmp_path: Path) -> Iterator[tuple[KubeApiServer, Client]]:
    """An API server double holding node gpu-node-1 (FOREIGN labels, one foreign annotation),
    and a lightkube client for it."""
    with KubeApiServer() as server:
        server.add_node("gpu-node-1", labels=FOREIGN, annotations={"team": "ml"})
        config = KubeConfig.from_file(str(server.kubeconfig(tmp_path / "kubeconfig")))
        yield server, Client(config)


def labels_of(server: KubeApiServer) -> dict[str, str]:
    node = server.get_node("gpu-node-1")
    assert node is not None
    return dict(node["metadata"].get("labels") or {})


def annotations_of(server: KubeApiServer) -> dict[str, str]:
    node = server.get_node("gpu-node-1")
    assert node is not None
    return dict(node["metadata"].get("annotations") or {})
