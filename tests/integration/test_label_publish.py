"""Publishing the labels computed from an in-process GPU agent on the fake NVML: a lost GPU
changes gpu.healthy on the Node, and the NodeFeature object has NFD's shape (against the API
server double through lightkube)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client

from gpuscope.exporters.labels.gpu import gpu_labels
from gpuscope.exporters.labels.publish import NodePublisher
from tests.doubles.kube_apiserver import KubeApiServer
from tests.support.labels import P, labels_of, node_api


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[KubeApiServer, Client]]:
    with node_api(tmp_path) as api:
        yield api


def test_gpu_lost_drops_gpu_healthy_on_the_node(inprocess, api) -> None:
    server, client = api
    h = inprocess("dgx-h100")
    pub = NodePublisher(client, "gpu-node-1", P)
    pub.publish(gpu_labels(h.gpu.collect()), {})
    assert labels_of(server)[f"{P}gpu.healthy"] == "8"
    h.fake.lose_gpu(5)
    assert pub.publish(gpu_labels(h.gpu.collect()), {}) is True  # the next recompute
    assert labels_of(server)[f"{P}gpu.healthy"] == "7"


def test_nodefeature_mode_object_shape(inprocess, api) -> None:
    from gpuscope.exporters.labels.publish import NodeFeaturePublisher

    server, client = api
    h = inprocess("dgx-h100")
    snap = h.gpu.collect()
    owner = {"name": "gpuscope-abcde", "uid": "0f5e8c1a-1111-4222-8333-944455556666"}
    pub = NodeFeaturePublisher(client, "gpu-node-1", "gpuscope", owner)
    labels = gpu_labels(snap)
    assert pub.publish(labels, snap) is True
    obj = server.get_node_feature("gpuscope", "gpuscope-gpu-node-1")
    assert obj is not None
    assert obj["metadata"]["labels"] == {"nfd.node.kubernetes.io/node-name": "gpu-node-1"}
    (ref,) = obj["metadata"]["ownerReferences"]
    assert (ref["kind"], ref["name"], ref["uid"]) == ("Pod", owner["name"], owner["uid"])
    assert obj["spec"]["labels"] == labels
    gpus = obj["spec"]["features"]["instances"]["gpuscope.gpu"]["elements"]
    assert len(gpus) == 8 and gpus[0]["attributes"]["memory_mib"] == "81559"
    assert pub.publish(labels, snap) is False  # unchanged: no write
    h.fake.lose_gpu(2)
    snap = h.gpu.collect()
    assert pub.publish(gpu_labels(snap), snap) is True
    obj = server.get_node_feature("gpuscope", "gpuscope-gpu-node-1")
    assert obj is not None and obj["spec"]["labels"][f"{P}gpu.healthy"] == "7"
