"""Wire-compatibility smoke test of tests/doubles/kube_apiserver.py against real client libraries.

Not collected by pytest (no `test_` prefix): the project venv has neither client. Run it with a
python that has `kubernetes` and/or `lightkube` installed:

    python3 -m venv /tmp/kc && /tmp/kc/bin/pip install kubernetes lightkube
    PYTHONPATH=/work/main /tmp/kc/bin/python tests/doubles/kube_clients_smoke.py

Each library lists (selectors, pagination), watches pods (ADDED/MODIFIED/DELETED, a pod
moving out of the field selection), recovers from a 410 the way its own watch helper does
(kubernetes: Watch.stream raises ApiException(410) after its one retry, the caller relists;
lightkube: on_error_retry drops the resourceVersion and re-watches from the current state),
patches a node with all three patch types, meets a 409 on a stale update, and creates,
lists and patches an NFD NodeFeature. Exits non-zero if a library that is installed fails.
"""

from __future__ import annotations

import importlib.metadata
import queue
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.doubles.kube_apiserver import NFD_GROUP, NFD_VERSION, KubeApiServer

TIMEOUT = 10.0


def expect(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)


def seeded(api: KubeApiServer) -> None:
    api.add_node("n1", labels={"gpu": "true"})
    api.add_node("n2")
    for i in range(3):
        api.add_pod("default", f"train-{i}", "n1", labels={"app": "train"})
    api.add_pod("kube-system", "agent", "n1", labels={"app": "agent"})
    api.add_pod("default", "elsewhere", "n2", labels={"app": "train"})


def pump(events: Iterator[Any], sink: queue.Queue[Any]) -> threading.Thread:
    """Consume a watch generator on a thread; an exception is put on the queue too."""

    def run() -> None:
        try:
            for event in events:
                sink.put(event)
        except Exception as err:  # noqa: BLE001 - handed to the main thread
            sink.put(err)
        sink.put(StopIteration())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def take(sink: queue.Queue[Any], n: int, key: Callable[[Any], Any]) -> list[Any]:
    got = []
    while len(got) < n:
        item = sink.get(timeout=TIMEOUT)
        if isinstance(item, BaseException):
            raise AssertionError(f"watch ended early after {got}: {item!r}")
        got.append(key(item))
    return got


def drive(api: KubeApiServer) -> None:
    """The changes every watch below must see, in order, under spec.nodeName=n1."""
    api.add_pod("default", "new", "n1", labels={"app": "train"})
    api.update_pod("default", "new", phase="Succeeded")
    api.delete_pod("default", "new")
    api.update_pod("default", "train-2", node="n2")  # moves out of the selection: DELETED


EXPECTED = [("ADDED", "new"), ("MODIFIED", "new"), ("DELETED", "new"), ("DELETED", "train-2")]


# --- kubernetes (the official client) --------------------------------------------------------


def _k8s_list(v1: Any) -> None:
    """Field and label selectors and pagination, as the agent lists its node's pods."""
    # list: field and label selectors, pagination
    pods = v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
    names = [p.metadata.name for p in pods.items]
    expect(names == ["train-0", "train-1", "train-2", "agent"], f"field selector: {names}")
    pods = v1.list_namespaced_pod("default", label_selector="app in (train),app!=agent")
    expect(len(pods.items) == 4, f"label selector: {[p.metadata.name for p in pods.items]}")
    pages, token = [], None
    while True:
        page = v1.list_pod_for_all_namespaces(limit=2, _continue=token)
        pages.append([p.metadata.name for p in page.items])
        token = page.metadata._continue
        if not token:
            break
    expect(len(pages) == 3 and sum(map(len, pages)) == 5, f"pagination: {pages}")


def _k8s_watch(api: KubeApiServer, v1: Any) -> None:
    """A watch from a list's resourceVersion sees every change, then a bookmark moves it."""
    from kubernetes import watch

    # watch from the list's resourceVersion
    rv = v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1").metadata.resource_version
    w = watch.Watch()
    sink: queue.Queue[Any] = queue.Queue()
    pump(
        w.stream(
            v1.list_pod_for_all_namespaces,
            field_selector="spec.nodeName=n1",
            resource_version=rv,
            allow_watch_bookmarks=True,
            timeout_seconds=30,
        ),
        sink,
    )
    api.wait_for_watches(1)
    drive(api)
    got = take(sink, 4, lambda e: (e["type"], e["object"].metadata.name))
    expect(got == EXPECTED, f"watch events: {got}")
    api.bookmark()
    bookmark = sink.get(timeout=TIMEOUT)
    expect(bookmark["type"] == "BOOKMARK", f"bookmark: {bookmark}")
    expect(w.resource_version == str(api.resource_version), "bookmark moves Watch's RV")
    w.stop()
    api.drop_watches()


def _k8s_expired_watch(api: KubeApiServer, v1: Any) -> None:
    """A 410 makes Watch.stream retry once and raise; the caller's relist and new watch
    carry on; a dropped watch then surfaces as an error."""
    from kubernetes import watch
    from kubernetes.client.exceptions import ApiException

    # 410: the helper retries once from the same RV, then raises; the caller relists
    stale = str(api.resource_version)
    api.add_pod("default", "late", "n1")
    api.expire_history()
    api.clear_requests()
    try:
        for _ in watch.Watch().stream(
            v1.list_pod_for_all_namespaces,
            field_selector="spec.nodeName=n1",
            resource_version=stale,
        ):
            raise AssertionError("no event expected before the 410")
        raise AssertionError("the watch ended without an error")
    except ApiException as err:
        expect(err.status == 410, f"410 expected, got {err.status}")
    expect(len(api.calls("watch", "pods")) == 2, "Watch.stream retries a 410 exactly once")
    relisted = v1.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1")
    expect("late" in [p.metadata.name for p in relisted.items], "relist sees the new pod")
    sink: queue.Queue[Any] = queue.Queue()
    pump(
        watch.Watch().stream(
            v1.list_pod_for_all_namespaces,
            field_selector="spec.nodeName=n1",
            resource_version=relisted.metadata.resource_version,
            timeout_seconds=30,
        ),
        sink,
    )
    api.wait_for_watches(1)
    api.delete_pod("default", "late")
    got = take(sink, 1, lambda e: (e["type"], e["object"].metadata.name))
    expect(got == [("DELETED", "late")], f"watch after relist: {got}")

    # a dropped watch surfaces as an error from the stream
    api.drop_watches()
    ended = sink.get(timeout=TIMEOUT)
    expect(isinstance(ended, Exception), f"a dropped watch raises, got {ended!r}")


def _k8s_patches(api: KubeApiServer, v1: Any) -> None:
    """The three patch types by their bodies and content types, a failed test op (422) and
    a stale update (409)."""
    from kubernetes.client.exceptions import ApiException

    # patches: a dict body goes as strategic merge, a list as JSON patch
    v1.patch_node("n1", {"metadata": {"labels": {"added": "1", "gpu": None}}})
    labels = api.get_node("n1")["metadata"]["labels"]  # type: ignore[index]
    expect(labels.get("added") == "1" and "gpu" not in labels, f"strategic: {labels}")
    v1.patch_node(
        "n1",
        {"metadata": {"labels": {"merge": "yes"}}},
        _content_type="application/merge-patch+json",
    )
    v1.patch_node("n1", [{"op": "add", "path": "/metadata/labels/json", "value": "yes"}])
    labels = v1.read_node("n1").metadata.labels
    expect(labels.get("merge") == "yes" and labels.get("json") == "yes", f"labels: {labels}")
    requests = api.calls("patch", "nodes")
    types = [r.content_type for r in requests]
    expect(
        types
        == [
            "application/strategic-merge-patch+json",
            "application/merge-patch+json",
            "application/json-patch+json",
        ],
        f"patch content types: {types}",
    )
    try:
        v1.patch_node("n1", [{"op": "test", "path": "/metadata/labels/json", "value": "no"}])
        raise AssertionError("a failed JSON patch test must be refused")
    except ApiException as err:
        expect(err.status == 422, f"failed test op: {err.status}")
    stale_node = v1.read_node("n1")
    v1.patch_node("n1", {"metadata": {"annotations": {"touched": "yes"}}})
    try:
        v1.replace_node("n1", stale_node)
        raise AssertionError("a stale update must conflict")
    except ApiException as err:
        expect(err.status == 409, f"stale update: {err.status}")


def _k8s_node_feature(custom: Any) -> None:
    """Create, patch and list an NFD NodeFeature through the custom-objects API."""
    # the NFD custom resource
    body = {
        "apiVersion": f"{NFD_GROUP}/{NFD_VERSION}",
        "kind": "NodeFeature",
        "metadata": {"name": "n1-gpuscope"},
        "spec": {"labels": {"gpuscope/gpu-count": "8"}},
    }
    custom.create_namespaced_custom_object(NFD_GROUP, NFD_VERSION, "nfd", "nodefeatures", body)
    custom.patch_namespaced_custom_object(
        NFD_GROUP,
        NFD_VERSION,
        "nfd",
        "nodefeatures",
        "n1-gpuscope",
        {"spec": {"labels": {"gpuscope/gpu-count": "4"}}},
    )
    listed = custom.list_namespaced_custom_object(NFD_GROUP, NFD_VERSION, "nfd", "nodefeatures")
    counts = [i["spec"]["labels"]["gpuscope/gpu-count"] for i in listed["items"]]
    expect(counts == ["4"], f"NodeFeature: {counts}")


def smoke_kubernetes(api: KubeApiServer, kubeconfig: Path) -> None:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=str(kubeconfig), client_configuration=configuration)
    v1 = client.CoreV1Api(client.ApiClient(configuration))
    custom = client.CustomObjectsApi(client.ApiClient(configuration))
    _k8s_list(v1)
    _k8s_watch(api, v1)
    _k8s_expired_watch(api, v1)
    _k8s_patches(api, v1)
    _k8s_node_feature(custom)


# --- lightkube ---------------------------------------------------------------------------------


def _lk_list(api: KubeApiServer, kube: Any) -> str:
    """Field and label selectors and chunked listing; the first list's resourceVersion,
    for the watch."""
    from lightkube.resources.core_v1 import Pod

    # list: field and label selectors, pagination
    listing = kube.list(Pod, namespace="*", fields={"spec.nodeName": "n1"})
    names = [p.metadata.name for p in listing]
    expect(names == ["train-0", "train-1", "train-2", "agent"], f"field selector: {names}")
    rv: str = listing.resourceVersion
    api.clear_requests()
    names = [p.metadata.name for p in kube.list(Pod, namespace="*", chunk_size=2)]
    expect(len(names) == 5 and len(api.calls("list", "pods")) == 3, f"pagination: {names}")
    labelled = kube.list(Pod, namespace="default", labels={"app": "train"})
    expect(len(list(labelled)) == 4, "label selector")
    return rv


def _lk_watch(api: KubeApiServer, kube: Any, rv: str) -> None:
    """A watch from the list's resourceVersion sees every change; dropped, it raises."""
    from lightkube.resources.core_v1 import Pod

    # watch from the list's resourceVersion
    sink: queue.Queue[Any] = queue.Queue()
    pump(
        kube.watch(Pod, namespace="*", fields={"spec.nodeName": "n1"}, resource_version=rv),
        sink,
    )
    api.wait_for_watches(1)
    drive(api)
    got = take(sink, 4, lambda e: (e[0], e[1].metadata.name))
    expect(got == EXPECTED, f"watch events: {got}")

    # a dropped watch: on_error_raise (the default) raises
    api.drop_watches()
    ended = sink.get(timeout=TIMEOUT)
    expect(isinstance(ended, Exception), f"a dropped watch raises, got {ended!r}")


def _lk_expired_watch(api: KubeApiServer, kube: Any) -> None:
    """on_error_retry: a 410 re-watches from the current state, a dropped watch resumes
    from the last resourceVersion seen."""
    from lightkube.resources.core_v1 import Pod
    from lightkube.types import on_error_retry

    # 410: on_error_retry re-watches without a resourceVersion, replaying the current state
    stale = str(api.resource_version)
    api.add_pod("default", "late", "n1")
    api.expire_history()
    api.clear_requests()
    sink: queue.Queue[Any] = queue.Queue()
    pump(
        kube.watch(
            Pod,
            namespace="*",
            fields={"spec.nodeName": "n1"},
            resource_version=stale,
            on_error=on_error_retry,
        ),
        sink,
    )
    got = take(sink, 4, lambda e: (e[0], e[1].metadata.name))
    expect(
        sorted(got) == sorted(("ADDED", n) for n in ("train-0", "train-1", "agent", "late")),
        f"replay after 410: {got}",
    )
    watches = [r.query.get("resourceVersion") for r in api.calls("watch", "pods")]
    expect(watches == [stale, None], f"watch requests: {watches}")
    api.delete_pod("default", "late")
    got = take(sink, 1, lambda e: (e[0], e[1].metadata.name))
    expect(got == [("DELETED", "late")], f"after the replay: {got}")
    # with on_error_retry a dropped watch resumes from the last resourceVersion seen
    api.drop_watches()
    api.wait_for_watches(1)
    api.add_pod("default", "after-drop", "n1")
    got = take(sink, 1, lambda e: (e[0], e[1].metadata.name))
    expect(got == [("ADDED", "after-drop")], f"after the drop: {got}")
    api.drop_watches()


def _lk_patches(kube: Any) -> None:
    """The three patch types, a stale update and a stale-resourceVersion patch (409), and a
    missing node (404)."""
    from lightkube.core.exceptions import ApiError
    from lightkube.resources.core_v1 import Node
    from lightkube.types import PatchType

    # patches (lightkube's default is strategic merge)
    kube.patch(Node, "n1", {"metadata": {"labels": {"added": "1", "gpu": None}}})
    kube.patch(Node, "n1", {"metadata": {"labels": {"merge": "yes"}}}, patch_type=PatchType.MERGE)
    kube.patch(
        Node,
        "n1",
        [{"op": "replace", "path": "/metadata/labels/merge", "value": "json"}],
        patch_type=PatchType.JSON,
    )
    labels = kube.get(Node, "n1").metadata.labels
    expect(
        labels.get("added") == "1" and "gpu" not in labels and labels.get("merge") == "json",
        f"labels: {labels}",
    )
    stale_node = kube.get(Node, "n1")
    kube.patch(Node, "n1", {"metadata": {"annotations": {"touched": "yes"}}})
    try:
        kube.replace(stale_node)
        raise AssertionError("a stale update must conflict")
    except ApiError as err:
        expect(err.status.code == 409 and err.status.reason == "Conflict", f"{err.status}")
    try:
        kube.patch(
            Node,
            "n1",
            {"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}},
            patch_type=PatchType.MERGE,
        )
        raise AssertionError("a patch with a stale resourceVersion must conflict")
    except ApiError as err:
        expect(err.status.code == 409, f"{err.status}")
    try:
        kube.get(Node, "missing")
        raise AssertionError("a missing node must be 404")
    except ApiError as err:
        expect(err.status.code == 404 and err.status.reason == "NotFound", f"{err.status}")


def _lk_node_feature(kube: Any) -> None:
    """Create, merge-patch and list an NFD NodeFeature; strategic merge on it is 415."""
    from lightkube.core.exceptions import ApiError
    from lightkube.generic_resource import create_namespaced_resource
    from lightkube.types import PatchType

    # the NFD custom resource
    node_feature = create_namespaced_resource(NFD_GROUP, NFD_VERSION, "NodeFeature", "nodefeatures")
    kube.create(
        node_feature(
            metadata={"name": "n1-lightkube", "namespace": "nfd"},
            spec={"labels": {"gpuscope/gpu-count": "8"}},
        )
    )
    kube.patch(
        node_feature,
        "n1-lightkube",
        {"spec": {"labels": {"gpuscope/gpu-count": "4"}}},
        namespace="nfd",
        patch_type=PatchType.MERGE,
    )
    try:
        kube.patch(node_feature, "n1-lightkube", {"spec": {}}, namespace="nfd")
        raise AssertionError("strategic merge patch of a custom resource must be 415")
    except ApiError as err:
        expect(err.status.code == 415, f"{err.status}")
    items = list(kube.list(node_feature, namespace="nfd"))
    counts = [i.spec["labels"]["gpuscope/gpu-count"] for i in items]
    expect(counts == ["4"], f"NodeFeature: {counts}")


def smoke_lightkube(api: KubeApiServer, kubeconfig: Path) -> None:
    from lightkube import Client, KubeConfig

    kube = Client(KubeConfig.from_file(kubeconfig))
    rv = _lk_list(api, kube)
    _lk_watch(api, kube, rv)
    _lk_expired_watch(api, kube)
    _lk_patches(kube)
    _lk_node_feature(kube)


def main() -> int:
    failed = False
    smokes = {"kubernetes": smoke_kubernetes, "lightkube": smoke_lightkube}
    with tempfile.TemporaryDirectory() as tmp:
        for library, smoke in smokes.items():
            try:
                version = importlib.metadata.version(library)
            except importlib.metadata.PackageNotFoundError:
                print(f"{library}: not installed, skipped")
                continue
            started = time.monotonic()
            with KubeApiServer() as api:
                seeded(api)
                try:
                    smoke(api, api.kubeconfig(Path(tmp) / f"{library}.kubeconfig"))
                    if api.errors:
                        raise AssertionError("server errors:\n" + "\n".join(api.errors))
                except Exception:  # noqa: BLE001 - report and go on to the next library
                    failed = True
                    print(f"{library} {version}: FAIL")
                    traceback.print_exc()
                    continue
            elapsed = time.monotonic() - started
            print(f"{library} {version}: ok ({elapsed:.1f}s)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
