"""This node's pods from the API server double, through lightkube: list + watch, 410 Gone
relists without duplicates, last known pods kept while the API server is down."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from lightkube import Client, KubeConfig

from gpuscope.agent.k8s.pods import PodWatcher
from tests.doubles.kube_apiserver import KubeApiServer
from tests.support import wait_for

NODE = "gpu-node-1"


@pytest.fixture
def api(tmp_path: Path) -> Iterator[tuple[KubeApiServer, PodWatcher]]:
    with KubeApiServer() as server:
        kubeconfig = server.kubeconfig(tmp_path / "kubeconfig")
        watcher = PodWatcher(
            lambda: Client(KubeConfig.from_file(str(kubeconfig))), NODE,
            backoff_first=0.05, backoff_max=0.2, watch_timeout=2,
        )  # fmt: skip
        yield server, watcher
        server.stop()  # cuts the open watch, so the watcher thread ends at once
        watcher.stop()


def names(watcher: PodWatcher) -> set[str]:
    return {f"{p.namespace}/{p.name}" for p in watcher.pods().values()}


def test_lists_and_watches_only_this_nodes_pods(api) -> None:
    server, watcher = api
    server.add_pod("ml", "bert-worker-0", node=NODE, labels={
        "training.kubeflow.org/job-name": "bert", "training.kubeflow.org/replica-type": "Worker",
        "training.kubeflow.org/replica-index": "0"})  # fmt: skip
    server.add_pod("ml", "elsewhere", node="gpu-node-2")
    watcher.start()
    assert watcher.synced.wait(5)
    assert names(watcher) == {"ml/bert-worker-0"}
    (meta,) = watcher.pods().values()
    assert (meta.workload.name, meta.workload.replica) == ("bert", "worker-0")

    server.add_pod("ml", "nb", node=NODE)
    wait_for(lambda: names(watcher) == {"ml/bert-worker-0", "ml/nb"}, what="ADDED")
    server.delete_pod("ml", "bert-worker-0")
    wait_for(lambda: names(watcher) == {"ml/nb"}, what="DELETED")


def test_410_gone_relists_once_without_duplicates(api) -> None:
    server, watcher = api
    server.add_pod("a", "keep", node=NODE)
    server.add_pod("a", "goes", node=NODE)
    watcher.start()
    assert watcher.synced.wait(5)
    server.wait_for_watches(1)
    server.delete_pod("a", "goes")
    server.expire_history()  # compaction: the watcher's resourceVersion is now too old
    server.drop_watches()
    server.add_pod("a", "new", node=NODE)
    wait_for(lambda: names(watcher) == {"a/keep", "a/new"}, what="relist after 410")
    assert len(watcher.pods()) == 2
    assert watcher.lists >= 2


def test_api_server_down_keeps_names_and_recovers(api) -> None:
    server, watcher = api
    server.add_pod("a", "p1", node=NODE)
    watcher.start()
    assert watcher.synced.wait(5)
    server.stop()
    wait_for(lambda: watcher.error is not None, what="error noticed")
    assert names(watcher) == {"a/p1"}  # last known names stay
    server.start()
    server.add_pod("a", "p2", node=NODE)
    wait_for(lambda: names(watcher) == {"a/p1", "a/p2"}, timeout=10, what="recovered")
    assert watcher.error is None
