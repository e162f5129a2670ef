"""Publishing the labels computed from an in-process GPU agent on the fake NVML: a lost GPU
changes gpu.healthy on the Node, and the NodeFeature object has NFD's shape (against the API
server double through lightkube). Labels hold through faults: an agent restarted without its
driver, with a broken one or with GPUs not answering keeps the labels with gpu.healthy 0, and
only an absence confirmed for the grace withdraws them; an invalid label is left out alone."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client

from gpuscope.agent.app.agent import Agent
from gpuscope.agent.app.config import parse
from gpuscope.agent.clock import ManualClock
from gpuscope.agent.gpu.source import GpuSource
from gpuscope.agent.labels.loop import LabelsLoop, make_publisher
from gpuscope.agent.runtime.sources import RETRY_FIRST
from gpuscope.exporters.labels.gpu import gpu_labels
from gpuscope.exporters.labels.publish import NodePublisher
from tests.doubles.fakenvml.control import FakeNvml
from tests.doubles.kube_apiserver import KubeApiServer
from tests.doubles.make_sysfs import write_tree
from tests.support import T0
from tests.support.labels import P, annotations_of, labels_of, node_api


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[KubeApiServer, Client]]:
    with node_api(tmp_path) as api:
        yield api


def test_gpu_lost_drops_gpu_healthy_on_the_node(inprocess, api) -> None:
    server, client = api
    h = inprocess("dgx-h100")
    pub = NodePublisher(client, "gpu-node-1", P)
    pub.publish(gpu_labels(h.gpu.read()), {})
    assert labels_of(server)[f"{P}gpu.healthy"] == "8"
    h.fake.lose_gpu(5)
    assert pub.publish(gpu_labels(h.gpu.read()), {}) is True  # the next recompute
    assert labels_of(server)[f"{P}gpu.healthy"] == "7"


def test_nodefeature_mode_object_shape(inprocess, api) -> None:
    from gpuscope.exporters.labels.publish import NodeFeaturePublisher

    server, client = api
    h = inprocess("dgx-h100")
    snap = h.gpu.read()
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
    snap = h.gpu.read()
    assert pub.publish(gpu_labels(snap), snap) is True
    obj = server.get_node_feature("gpuscope", "gpuscope-gpu-node-1")
    assert obj is not None and obj["spec"]["labels"][f"{P}gpu.healthy"] == "7"


# --- labels hold through faults: the labels loop, the real publisher, the API server double --


class Node:
    """One GPU node whose agent can be restarted, the fake NVML under it switched between
    a working driver, none at all, a broken one and no GPUs, and time moved by hand."""

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *args: str) -> None:
        self.fake = FakeNvml("dgx-h100", tmp_path / "dgx-h100.state", now=T0)
        self.fake.activate()
        self.clock = ManualClock(T0)
        self.config = parse(
            ["--listen", "127.0.0.1:0", "--collectors", "gpu", "--node-name", "gpu-node-1",
             "--kubeconfig", str(tmp_path / "kubeconfig"),
             "--sysfs", str(write_tree(tmp_path / "sys")), *args],
            env={},
        )  # fmt: skip
        self._tmp = tmp_path
        self._monkeypatch = monkeypatch
        self.agent: Agent | None = None
        self.loop: LabelsLoop | None = None

    def restart(self, driver: str = "loaded") -> LabelsLoop:
        """Stop the agent (if running) and start a new one, with the driver `loaded`,
        `missing` (NVML: driver not loaded), `broken` (nvmlInit fails otherwise) or with
        `no-gpus` (NVML works and finds none)."""
        self.stop()
        self.set_driver(driver)
        self.agent = Agent(self.config, clock=self.clock, background=False)
        self.agent.start()
        gpu = self.agent.source("gpu")
        publisher = make_publisher(self.config)
        assert publisher is not None
        self.loop = LabelsLoop(
            self.config, self.agent.runner, gpu if isinstance(gpu, GpuSource) else None,
            publisher, clock=self.clock,
        )  # fmt: skip
        return self.loop

    def set_driver(self, driver: str) -> None:
        """What the next nvmlInit finds (the agent retries its GPU collector with backoff)."""
        state = self._tmp / f"{driver}.state"
        if driver == "loaded":
            state = self.fake.state_path
        elif driver == "broken":
            state.write_text("not a state file\n")
        elif driver == "no-gpus":
            header = self.fake.state_text().split("\ngpus ")[0]
            state.write_text(f"{header}\ngpus 0\nend\n")
        self._monkeypatch.setenv("FAKENVML_STATE", str(state))

    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)

    def stop(self) -> None:
        if self.agent is not None:
            self.agent.stop()
            self.agent = None


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api) -> Iterator[Node]:
    handle = Node(tmp_path, monkeypatch)
    yield handle
    handle.stop()


def ours(server: KubeApiServer) -> dict[str, str]:
    return {k: v for k, v in labels_of(server).items() if k.startswith(P)}


def refused(server: KubeApiServer) -> list[int]:
    return [r.code for r in server.calls("patch", "nodes") if r.code is not None and r.code >= 400]


def messages(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if text in r.getMessage()]


@pytest.fixture
def published(node: Node, api) -> dict[str, str]:
    """The 20 labels a working DGX H100 agent published, before any fault."""
    server, _ = api
    node.restart().run_once()
    labels = ours(server)
    assert len(labels) == 20 and labels[f"{P}gpu.healthy"] == "8"
    return labels


def test_restart_without_driver_keeps_the_labels_with_healthy_0(
    node: Node, api, published: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    server, _ = api
    topology = annotations_of(server)[f"{P}topology"]
    loop = node.restart(driver="missing")  # rebooted: the agent starts before the driver
    with caplog.at_level(logging.INFO, logger="gpuscope.labels"):
        loop.run_once()
        node.advance(5)
        loop.run_once()
    assert ours(server) == {**published, f"{P}gpu.healthy": "0"}
    assert labels_of(server)["kubernetes.io/hostname"] == "gpu-node-1"  # foreign: untouched
    assert annotations_of(server)[f"{P}topology"] == topology
    (held,) = messages(caplog, "holding the 20 node labels")
    assert "driver is not loaded" in held and "after 600 s" in held
    assert refused(server) == []

    node.set_driver("loaded")  # the driver comes up
    node.advance(RETRY_FIRST)  # the runner's next try at the GPU collector
    with caplog.at_level(logging.INFO, logger="gpuscope.labels"):
        loop.run_once()
    assert ours(server) == published
    assert messages(caplog, "GPUs readable again")


def test_no_driver_for_longer_than_the_grace_withdraws_the_labels(
    node: Node, api, published: dict[str, str], caplog: pytest.LogCaptureFixture
) -> None:
    server, _ = api
    loop = node.restart(driver="missing")
    loop.run_once()
    node.advance(599)
    loop.run_once()
    assert ours(server) == {**published, f"{P}gpu.healthy": "0"}
    node.advance(1)
    with caplog.at_level(logging.INFO, logger="gpuscope.labels"):
        loop.run_once()
    assert ours(server) == {f"{P}gpu.present": "false", f"{P}rdma.present": "true"}
    assert f"{P}topology" not in annotations_of(server)
    assert len(messages(caplog, "node labels withdrawn")) == 1
    node.advance(60)
    loop.run_once()  # withdrawn once, not again
    assert len(messages(caplog, "node labels withdrawn")) == 1


def test_no_gpus_found_for_longer_than_the_grace_withdraws_the_labels(
    node: Node, api, published: dict[str, str]
) -> None:
    server, _ = api
    loop = node.restart(driver="no-gpus")
    loop.run_once()
    assert ours(server) == {**published, f"{P}gpu.healthy": "0"}
    node.advance(600)
    loop.run_once()
    assert ours(server) == {f"{P}gpu.present": "false", f"{P}rdma.present": "true"}


def test_any_other_fault_in_between_restarts_the_grace(
    node: Node, api, published: dict[str, str]
) -> None:
    server, _ = api
    loop = node.restart(driver="missing")
    loop.run_once()
    node.advance(500)
    node.set_driver("broken")  # not evidence of absence: the count starts again after it
    node.advance(RETRY_FIRST * 2)
    loop.run_once()
    node.set_driver("missing")
    node.advance(RETRY_FIRST * 4)
    loop.run_once()
    node.advance(599)
    loop.run_once()
    assert ours(server)[f"{P}gpu.present"] == "true"
    node.advance(1)
    loop.run_once()
    assert ours(server)[f"{P}gpu.present"] == "false"


def test_a_broken_driver_holds_the_labels_however_long_it_lasts(
    node: Node, api, published: dict[str, str]
) -> None:
    server, _ = api
    loop = node.restart(driver="broken")
    for _ in range(12):
        loop.run_once()
        node.advance(600)
    assert ours(server) == {**published, f"{P}gpu.healthy": "0"}
    assert refused(server) == []


def test_gpus_not_answering_at_restart_keep_what_describes_them(
    node: Node, api, published: dict[str, str]
) -> None:
    """GPUs whose firmware stopped answering are enumerated but cannot be read: their
    product, memory, links and topology stay as published, while count and health follow."""
    server, _ = api
    with node.fake.batch():
        for gpu in range(8):
            node.fake.lose_gpu(gpu)
    node.restart().run_once()
    assert ours(server) == {**published, f"{P}gpu.healthy": "0"}
    with node.fake.batch():
        for gpu in range(8):
            node.fake.restore_gpu(gpu)
    node.loop.run_once()  # type: ignore[union-attr]
    assert ours(server)[f"{P}gpu.healthy"] == "8"
    assert ours(server)[f"{P}gpu.product"] == published[f"{P}gpu.product"]


def test_gpus_that_answer_again_give_back_every_label(
    node: Node, api, published: dict[str, str]
) -> None:
    server, _ = api
    with node.fake.batch():
        for gpu in range(8):
            node.fake.lose_gpu(gpu)
    node.restart().run_once()
    with node.fake.batch():
        for gpu in range(8):
            node.fake.restore_gpu(gpu)
    node.loop.run_once()  # type: ignore[union-attr]
    assert ours(server) == published


def test_the_first_start_without_a_driver_says_present_false(node: Node, api) -> None:
    """Nothing was ever published, so nothing is held: the node says what is true."""
    server, _ = api
    node.restart(driver="missing").run_once()
    assert ours(server) == {f"{P}gpu.present": "false", f"{P}rdma.present": "true"}


def test_an_invalid_label_is_dropped_and_the_rest_land(
    node: Node, api, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import gpuscope.agent.labels.loop as labels_loop

    server, _ = api
    real = labels_loop.gpu_labels

    def with_bad_ones(*args: Any, **kwargs: Any) -> dict[str, str]:
        # What a sanitizer bug or a surprising NVML string would produce.
        return {**real(*args, **kwargs), f"{P}gpu.model.": "1", f"{P}gpu.product": "H100-"}

    monkeypatch.setattr(labels_loop, "gpu_labels", with_bad_ones)
    loop = node.restart()
    with caplog.at_level(logging.INFO, logger="gpuscope.labels"):
        loop.run_once()
        node.fake.lose_gpu(4)
        loop.run_once()
    labels = ours(server)
    assert len(labels) == 19  # every valid one; gpu.product was the invalid value
    assert f"{P}gpu.product" not in labels and f"{P}gpu.healthy" in labels
    assert labels[f"{P}gpu.healthy"] == "7"  # and later rounds still publish
    assert refused(server) == []  # no 422: the API never saw them
    assert len(messages(caplog, f"not publishing node label {P}gpu.model.=")) == 1
    assert len(messages(caplog, f"not publishing node label {P}gpu.product=")) == 1


def test_file_mode_holds_the_features_file_across_a_restart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    directory = tmp_path / "features.d"
    node = Node(tmp_path, monkeypatch, "--labels-mode", "file", "--labels-dir", str(directory))
    try:
        node.restart().run_once()
        before = (directory / "gpuscope").read_text()
        assert f"{P}gpu.healthy=8" in before
        node.restart(driver="missing").run_once()
        assert (directory / "gpuscope").read_text() == before.replace(
            f"{P}gpu.healthy=8", f"{P}gpu.healthy=0"
        )
    finally:
        node.stop()


def test_nodefeature_mode_keeps_the_gpu_instances_while_holding(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, api
) -> None:
    server, _ = api
    node = Node(tmp_path, monkeypatch, "--labels-mode", "nodefeature")
    try:
        node.restart().run_once()
        first = server.get_node_feature("gpuscope", "gpuscope-gpu-node-1")
        assert first is not None
        node.restart(driver="missing").run_once()
        held = server.get_node_feature("gpuscope", "gpuscope-gpu-node-1")
        assert held is not None
        assert held["spec"]["labels"] == {**first["spec"]["labels"], f"{P}gpu.healthy": "0"}
        assert held["spec"]["features"] == first["spec"]["features"]  # 8 GPUs, as published
        node.advance(600)
        node.loop.run_once()  # type: ignore[union-attr]
        gone = server.get_node_feature("gpuscope", "gpuscope-gpu-node-1")
        assert gone is not None and gone["spec"]["labels"][f"{P}gpu.present"] == "false"
        assert gone["spec"]["features"]["instances"]["gpuscope.gpu"]["elements"] == []
    finally:
        node.stop()
