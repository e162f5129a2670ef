"""Publishing labels: the Node patch touches only the agent's keys, removes the ones it no
longer emits, patches only on change and survives conflicts (against the API server double
through lightkube); the NFD feature file is written atomically."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig

from gpuscope.exporters.labels.gpu import gpu_labels
from gpuscope.exporters.labels.publish import (
    NodePublisher,
    PublishError,
    node_patch,
    write_features_file,
)
from tests.kube_apiserver import KubeApiServer

P = "gpuscope.io/"
FOREIGN = {"kubernetes.io/hostname": "gpu-node-1", "nvidia.com/gpu.product": "H100"}


def test_patch_sets_changed_keys_only_and_records_ownership() -> None:
    patch = node_patch(
        {**FOREIGN, f"{P}gpu.count": "8"}, {}, {f"{P}gpu.count": "8", f"{P}gpu.present": "true"},
        {}, P,
    )  # fmt: skip
    assert patch == {
        "labels": {f"{P}gpu.present": "true"},
        "annotations": {f"{P}owned-labels": f"{P}gpu.count,{P}gpu.present"},
    }


def test_patch_is_empty_when_nothing_changed() -> None:
    labels = {f"{P}gpu.count": "8"}
    owned = {f"{P}owned-labels": f"{P}gpu.count"}
    assert node_patch({**FOREIGN, **labels}, owned, labels, {}, P) == {}


def test_keys_no_longer_emitted_are_removed_and_foreign_keys_never_touched() -> None:
    current = {**FOREIGN, f"{P}gpu.count": "8", f"{P}nvlink.domain": "abc"}
    owned = {f"{P}owned-labels": f"{P}gpu.count,{P}nvlink.domain,kubernetes.io/hostname"}
    patch = node_patch(current, owned, {f"{P}gpu.count": "8"}, {}, P)
    assert patch["labels"] == {f"{P}nvlink.domain": None}
    assert not any(k in patch["labels"] for k in FOREIGN)  # even if the list was tampered with


def test_refuses_keys_outside_the_prefix() -> None:
    with pytest.raises(ValueError, match="outside the agent's prefix"):
        node_patch({}, {}, {"kubernetes.io/arch": "arm64"}, {}, P)


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[KubeApiServer, Client]]:
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


def test_node_mode_end_to_end(api: tuple[KubeApiServer, Client]) -> None:
    server, client = api
    pub = NodePublisher(client, "gpu-node-1", P)
    labels = {f"{P}gpu.count": "8", f"{P}nvlink.domain": "d1"}
    annotations = {f"{P}topology": '{"v":1}'}
    assert pub.publish(labels, annotations) is True
    assert labels_of(server) == {**FOREIGN, **labels}
    assert annotations_of(server)["team"] == "ml"
    assert annotations_of(server)[f"{P}topology"] == '{"v":1}'

    patches = len(server.calls("patch", "nodes"))
    assert pub.publish(labels, annotations) is False  # unchanged: read, no write
    assert len(server.calls("patch", "nodes")) == patches

    del labels[f"{P}nvlink.domain"]
    assert pub.publish(labels, annotations) is True
    assert labels_of(server) == {**FOREIGN, f"{P}gpu.count": "8"}

    assert pub.remove() is True  # uninstall: only the agent's keys go
    assert labels_of(server) == FOREIGN
    assert annotations_of(server) == {"team": "ml"}


def test_conflicts_are_retried(api: tuple[KubeApiServer, Client]) -> None:
    server, client = api
    server.fail_next(2, code=409, method="PATCH")
    assert NodePublisher(client, "gpu-node-1", P).publish({f"{P}gpu.count": "4"}, {}) is True
    assert labels_of(server)[f"{P}gpu.count"] == "4"
    assert len(server.calls("patch", "nodes")) == 3


def test_api_errors_are_one_line(api: tuple[KubeApiServer, Client]) -> None:
    _, client = api
    with pytest.raises(PublishError, match=r"^patching node nowhere: 404"):
        NodePublisher(client, "nowhere", P).publish({f"{P}gpu.count": "1"}, {})


def test_gpu_lost_drops_gpu_healthy_on_the_node(inprocess, api) -> None:
    server, client = api
    h = inprocess("dgx-h100")
    pub = NodePublisher(client, "gpu-node-1", P)
    pub.publish(gpu_labels(h.gpu.collect()), {})
    assert labels_of(server)[f"{P}gpu.healthy"] == "8"
    h.fake.lose_gpu(5)
    assert pub.publish(gpu_labels(h.gpu.collect()), {}) is True  # the next recompute
    assert labels_of(server)[f"{P}gpu.healthy"] == "7"


def test_features_file_is_written_atomically_and_only_on_change(tmp_path: Path) -> None:
    directory = tmp_path / "features.d"
    labels = {f"{P}gpu.count": "8", f"{P}gpu.present": "true"}
    assert write_features_file(directory, labels) is True
    path = directory / "gpuscope"
    assert path.read_text().splitlines()[1:] == [f"{P}gpu.count=8", f"{P}gpu.present=true"]
    before = path.stat().st_ino
    assert write_features_file(directory, labels) is False
    assert path.stat().st_ino == before
    assert write_features_file(directory, {f"{P}gpu.count": "4"}) is True
    assert path.stat().st_ino != before  # replaced by rename, never rewritten in place
    assert sorted(os.listdir(directory)) == ["gpuscope"]  # no dotfile left behind


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


def test_the_agent_labels_its_node_and_reacts_to_a_lost_gpu(
    agent_process, fake_lib, tmp_path: Path
) -> None:
    from tests.conftest import wait_for
    from tests.fakenvml.control import FakeNvml

    fake = FakeNvml("dgx-h100", tmp_path / "state")
    with KubeApiServer() as server:
        server.add_node("gpu-node-1", labels=FOREIGN)
        env = fake.env() | {"KUBECONFIG": str(server.kubeconfig(tmp_path / "kubeconfig"))}
        agent_process(
            "--collectors", "gpu", "--node-name", "gpu-node-1", "--labels-interval", "3600",
            env=env,
        )  # fmt: skip
        wait_for(lambda: labels_of(server).get(f"{P}gpu.healthy") == "8", 10, "node labeled")
        assert labels_of(server)["kubernetes.io/hostname"] == "gpu-node-1"
        assert f"{P}topology" in annotations_of(server)
        fake.lose_gpu(3)  # long before the next hourly recompute
        wait_for(lambda: labels_of(server).get(f"{P}gpu.healthy") == "7", 10, "GPU loss seen")


def test_the_agent_writes_the_features_file(agent_process, fake_lib, tmp_path: Path) -> None:
    from tests.conftest import wait_for
    from tests.fakenvml.control import FakeNvml

    fake = FakeNvml("pcie-l40s", tmp_path / "state")
    directory = tmp_path / "features.d"
    agent_process(
        "--collectors", "gpu", "--labels-mode", "file", "--labels-dir", str(directory),
        env=fake.env(),
    )  # fmt: skip
    wait_for(lambda: (directory / "gpuscope").exists(), 10, "features file")
    assert f"{P}gpu.product=NVIDIA-L40S" in (directory / "gpuscope").read_text()


def test_labels_remove_cleans_the_node_for_uninstall(tmp_path: Path) -> None:
    import subprocess

    from tests.conftest import GPUSCOPE, REPO

    with KubeApiServer() as server:
        server.add_node(
            "gpu-node-1",
            labels={**FOREIGN, f"{P}gpu.count": "8"},
            annotations={f"{P}owned-labels": f"{P}gpu.count", "team": "ml"},
        )
        env = os.environ | {"KUBECONFIG": str(server.kubeconfig(tmp_path / "kubeconfig"))}
        result = subprocess.run(
            [*GPUSCOPE, "labels", "--remove", "--node-name", "gpu-node-1"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert labels_of(server) == FOREIGN
        assert annotations_of(server) == {"team": "ml"}
