"""Publishing labels: the Node patch touches only the agent's keys, removes the ones it no
longer emits, patches only on change and survives conflicts (against the API server double
through lightkube); the NFD feature file is written atomically; what was published reads
back after a restart."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client

from gpuscope.exporters.labels.publish import (
    NodePublisher,
    Published,
    PublishError,
    node_patch,
    read_features_file,
    write_features_file,
)
from tests.doubles.kube_apiserver import KubeApiServer
from tests.support.labels import FOREIGN, P, annotations_of, labels_of, node_api


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[KubeApiServer, Client]]:
    with node_api(tmp_path) as api:
        yield api


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


def test_node_mode_reads_back_only_the_keys_it_owns(api: tuple[KubeApiServer, Client]) -> None:
    _, client = api
    pub = NodePublisher(client, "gpu-node-1", P)
    assert pub.published() is None  # never published here: nothing to hold after a restart
    labels = {f"{P}gpu.count": "8", f"{P}gpu.present": "true"}
    pub.publish(labels, {f"{P}topology": '{"v":1}'})
    again = NodePublisher(client, "gpu-node-1", P).published()  # a restarted agent
    assert again == Published(labels, {f"{P}topology": '{"v":1}'})
    pub.remove()
    assert pub.published() is None


def test_reading_back_a_missing_node_is_one_line(api: tuple[KubeApiServer, Client]) -> None:
    _, client = api
    with pytest.raises(PublishError, match=r"^reading node nowhere: 404"):
        NodePublisher(client, "nowhere", P).published()


def test_features_file_reads_back_what_was_written(tmp_path: Path) -> None:
    labels = {f"{P}gpu.count": "8", f"{P}gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert read_features_file(tmp_path) is None
    write_features_file(tmp_path, labels)
    assert read_features_file(tmp_path) == Published(labels)
