"""This node's pods from the API server double, through lightkube: list + watch, 410 Gone
relists without duplicates, last known pods kept while the API server is down, and a watch
that goes silent without closing noticed within a bound and healed without help."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client, KubeConfig

from gpuscope.agent.k8s.pods import PodWatcher
from gpuscope.agent.k8s.pods_source import PodsSource
from gpuscope.agent.k8s.records import PodsSnapshot
from gpuscope.agent.runtime.sources import SourceResult, SourceRunner
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


# --- a watch that goes silent -----------------------------------------------------------------


MakeSource = Callable[..., tuple[KubeApiServer, PodsSource]]


@pytest.fixture
def make_source(tmp_path: Path) -> Iterator[MakeSource]:
    made: list[tuple[KubeApiServer, PodsSource]] = []

    def make(**options: Any) -> tuple[KubeApiServer, PodsSource]:
        server = KubeApiServer(bookmark_interval=options.pop("bookmark_interval", None))
        server.start()
        kubeconfig = server.kubeconfig(tmp_path / f"kubeconfig-{len(made)}")
        source = PodsSource(
            lambda: Client(KubeConfig.from_file(str(kubeconfig))), NODE,
            backoff_first=0.05, backoff_max=0.2, **options,
        )  # fmt: skip
        made.append((server, source))
        return server, source

    yield make
    for server, source in made:
        server.stop()
        source.stop()


def pod_names(result: SourceResult[PodsSnapshot]) -> set[str]:
    assert result.records is not None
    return {p.name for p in result.records.pods.values()}


def test_a_frozen_watch_fails_the_collector_then_heals_by_itself(
    make_source: MakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    server, source = make_source(stale_after=1.0, read_timeout=6.0, watch_timeout=60)
    runner = SourceRunner([source])
    server.add_pod("ml", "bert-0", node=NODE)
    runner.start()
    assert runner.collect().results["pods"].success
    server.wait_for_watches(1)

    assert server.freeze_watches() == 1  # the connection stays open, nothing arrives on it
    server.add_pod("ml", "llama-0", node=NODE)  # a new pod holding a GPU, created meanwhile

    def pods() -> SourceResult[PodsSnapshot]:
        result: SourceResult[PodsSnapshot] = runner.collect().results["pods"]
        return result

    wait_for(lambda: not pods().success, timeout=5, what="success 0 within the bound")
    stale = pods()
    assert pod_names(stale) == {"bert-0"}  # the last pods are kept; the new one is unseen
    assert stale.error is not None and "nothing heard on the watch of pods of node" in stale.error

    # No manual action: the read timeout drops the frozen connection, relists, watches anew.
    wait_for(lambda: pods().success, timeout=20, what="recovery")
    assert pod_names(pods()) == {"bert-0", "llama-0"}
    wait_for(lambda: server.frozen_watches == 0, what="the frozen connection closed")
    assert source.watcher.silences == 1 and source.watcher.lists == 2
    failed = [r for r in caplog.records if "collector pods failed" in r.getMessage()]
    assert len(failed) == 1  # one line for the stale state, however many scrapes saw it
    silent = [r for r in caplog.records if "no data on the watch for 6s" in r.getMessage()]
    assert len(silent) == 1 and silent[0].levelname == "WARNING"

    server.add_pod("ml", "llama-1", node=NODE)  # and the new watch delivers
    wait_for(lambda: "llama-1" in pod_names(pods()), what="events after recovery")


def test_bookmarks_keep_a_quiet_watch_alive(make_source: MakeSource) -> None:
    server, source = make_source(
        stale_after=1.0, read_timeout=1.5, watch_timeout=60, bookmark_interval=0.2
    )
    server.add_pod("ml", "bert-0", node=NODE)
    source.start()
    server.wait_for_watches(1)
    (request,) = server.calls("watch", "pods")
    assert request.query["allowWatchBookmarks"] == "true"
    assert 60 <= int(request.query["timeoutSeconds"]) < 120  # jittered, as client-go does
    deadline = time.monotonic() + 3  # twice the read timeout, three times the bound
    while time.monotonic() < deadline:
        assert source.read().pods  # never stale: nothing changes, bookmarks come
        time.sleep(0.1)
    assert source.watcher.lists == 1 and source.watcher.silences == 0
    assert len(server.calls("watch", "pods")) == 1


def test_a_server_without_bookmarks_is_relisted_quietly(
    make_source: MakeSource, caplog: pytest.LogCaptureFixture
) -> None:
    server, source = make_source(stale_after=5.0, read_timeout=0.3, watch_timeout=60)
    server.add_pod("ml", "bert-0", node=NODE)
    source.start()
    wait_for(lambda: source.watcher.silences >= 3, what="silent watches")
    assert source.read().pods  # each relist is word from the API server: not stale
    silent = [r for r in caplog.records if "no data on the watch" in r.getMessage()]
    assert len(silent) == 1  # said once, not once per silent watch
    server.add_pod("ml", "llama-0", node=NODE)
    wait_for(lambda: len(source.watcher.pods()) == 2, what="a change seen between relists")


def test_a_watch_ended_by_the_server_resumes_without_a_relist(make_source: MakeSource) -> None:
    server, source = make_source(watch_timeout=1, read_timeout=10.0)
    source.start()
    server.wait_for_watches(2, timeout=10, opened=True)  # the first ended after 1-2 s
    server.add_pod("ml", "bert-0", node=NODE)
    wait_for(lambda: len(source.watcher.pods()) == 1, what="seen on the resumed watch")
    assert source.watcher.lists == 1
    second = server.calls("watch", "pods")[1]
    assert int(second.query["resourceVersion"]) >= int(
        server.calls("watch", "pods")[0].query["resourceVersion"]
    )


def test_watches_cut_at_once_back_off_instead_of_spinning(make_source: MakeSource) -> None:
    server, source = make_source(read_timeout=10.0)
    server.max_watch_seconds = 0.01  # a proxy that ends every stream at once
    source.start()
    time.sleep(1.5)
    # A busy loop would have opened hundreds; the backoff (0.05 s doubling to 0.2 s here,
    # 1 s to 30 s by default) allows a handful.
    assert len(server.calls("watch", "pods")) <= 20  # a busy loop: hundreds
    # Between a relist that succeeds and the next watch that ends at once, `error` is None
    # for a moment: wait for the error rather than sample it.
    wait_for(
        lambda: "at once, sending nothing" in (source.watcher.error or ""),
        what="the watcher to report watches ended at once",
    )
    server.max_watch_seconds = None
    server.add_pod("ml", "bert-0", node=NODE)
    wait_for(lambda: source.watcher.error is None and len(source.watcher.pods()) == 1)
