"""The Kubernetes API server double, driven over HTTP with the standard library.

Watches are read off a raw socket so the chunked framing itself is checked: one event per
chunk, newline-terminated, and a terminating chunk on a clean end but none when cut.
(tests/doubles/kube_clients_smoke.py checks the same server against the real client libraries.)
"""

from __future__ import annotations

import http.client
import json
import socket
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.doubles.kube_apiserver import (
    JSON_PATCH,
    MERGE_PATCH,
    STRATEGIC_PATCH,
    KubeApiServer,
    json_patch,
    merge_patch,
    node_feature,
    owner_reference,
    pod,
    strategic_merge_patch,
)
from tests.support import wait_for

NF_PATH = "/apis/nfd.k8s-sigs.io/v1alpha1/namespaces/nfd/nodefeatures"


@pytest.fixture
def api() -> Iterator[KubeApiServer]:
    with KubeApiServer() as server:
        yield server
    assert not server.errors, "\n".join(server.errors)


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str]


def call(
    api: KubeApiServer,
    method: str,
    path: str,
    body: Any = None,
    content_type: str = "application/json",
    token: str = "t0ken",
) -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", api.port, timeout=5)
    try:
        headers = {"Authorization": f"Bearer {token}", "Accept": "application/json"}
        data = None
        if body is not None:
            data = body if isinstance(body, bytes) else json.dumps(body).encode()
            headers["Content-Type"] = content_type
        conn.request(method, path, body=data, headers=headers)
        resp = conn.getresponse()
        raw = resp.read()
        parsed = json.loads(raw) if resp.getheader("Content-Type") == "application/json" else raw
        return Answer(resp.status, parsed, dict(resp.headers))
    finally:
        conn.close()


def get(api: KubeApiServer, path: str) -> Any:
    answer = call(api, "GET", path)
    assert answer.status == 200, answer.body
    return answer.body


def names(listing: dict[str, Any]) -> list[str]:
    return [item["metadata"]["name"] for item in listing["items"]]


class RawWatch:
    """A watch request read chunk by chunk off the socket."""

    def __init__(self, api: KubeApiServer, path: str) -> None:
        self.sock = socket.create_connection(("127.0.0.1", api.port), timeout=5)
        request = f"GET {path} HTTP/1.1\r\nHost: kube\r\nAuthorization: Bearer t\r\n\r\n"
        self.sock.sendall(request.encode())
        self.file = self.sock.makefile("rb")
        self.status = int(self.file.readline().split()[1])
        self.headers: dict[str, str] = {}
        while (line := self.file.readline().decode().strip()) != "":
            key, _, value = line.partition(":")
            self.headers[key.strip().lower()] = value.strip()

    def chunk(self) -> bytes | None:
        """The next chunk; None for the terminating chunk; EOFError if the stream was cut."""
        size = self.file.readline()
        if not size:
            raise EOFError("stream cut without a terminating chunk")
        if int(size, 16) == 0:
            assert self.file.readline() == b"\r\n"
            return None
        data = self.file.read(int(size, 16))
        assert self.file.readline() == b"\r\n"
        return data

    def event(self) -> dict[str, Any]:
        data = self.chunk()
        assert data is not None, "stream ended"
        assert data.endswith(b"\n") and data.count(b"\n") == 1
        event: dict[str, Any] = json.loads(data)
        return event

    def events(self, n: int) -> list[tuple[str, str]]:
        out = []
        for _ in range(n):
            event = self.event()
            out.append((event["type"], event["object"]["metadata"].get("name", "")))
        return out

    def ends_cleanly(self) -> bool:
        try:
            return self.chunk() is None
        except EOFError:
            return False

    def close(self) -> None:
        self.file.close()
        self.sock.close()


@pytest.fixture
def watch(api: KubeApiServer) -> Iterator[Any]:
    opened: list[RawWatch] = []

    def start(path: str, *, wait: bool = True) -> RawWatch:
        before = api.watches_opened
        stream = RawWatch(api, path)
        opened.append(stream)
        if wait:
            api.wait_for_watches(before + 1, opened=True)
        return stream

    yield start
    for stream in opened:
        stream.close()


def seed(api: KubeApiServer) -> None:
    api.add_node("n1", labels={"gpu": "true"})
    api.add_node("n2")
    api.add_pod("default", "a", "n1", labels={"app": "train", "tier": "gpu"})
    api.add_pod("default", "b", "n1", labels={"app": "serve"})
    api.add_pod("other", "c", "n2", labels={"app": "train"})
    api.add_pod("other", "pending", "", labels={"tier": "cpu"}, phase="Pending")


# --- discovery, list, selectors, pagination -----------------------------------------------------


def test_discovery_documents(api: KubeApiServer) -> None:
    assert get(api, "/api")["versions"] == ["v1"]
    core = get(api, "/api/v1")
    assert {r["name"] for r in core["resources"]} >= {"pods", "pods/status", "nodes"}
    groups = get(api, "/apis")["groups"]
    assert groups[0]["preferredVersion"]["groupVersion"] == "nfd.k8s-sigs.io/v1alpha1"
    nfd = get(api, "/apis/nfd.k8s-sigs.io/v1alpha1")
    assert nfd["resources"][0] | {"verbs": None} == {
        "name": "nodefeatures",
        "singularName": "nodefeature",
        "namespaced": True,
        "kind": "NodeFeature",
        "verbs": None,
    }
    assert get(api, "/version")["gitVersion"].startswith("v1.")
    missing = call(api, "GET", "/apis/example.com/v1/widgets")
    assert missing.status == 404 and missing.body["reason"] == "NotFound"


def test_list_carries_the_global_resource_version(api: KubeApiServer) -> None:
    seed(api)
    pods = get(api, "/api/v1/pods")
    assert pods["kind"] == "PodList" and pods["apiVersion"] == "v1"
    assert pods["metadata"]["resourceVersion"] == str(api.resource_version)
    assert names(pods) == ["a", "b", "c", "pending"]  # sorted by namespace/name, like etcd keys
    assert "kind" not in pods["items"][0]  # built-in list items carry no kind/apiVersion
    item = pods["items"][0]["metadata"]
    assert item["uid"] and item["creationTimestamp"].endswith("Z")
    assert int(item["resourceVersion"]) < api.resource_version
    assert names(get(api, "/api/v1/namespaces/other/pods")) == ["c", "pending"]
    api.add_node_feature("nfd", "n1", "n1", labels={"x": "y"})
    features = get(api, NF_PATH)
    assert features["kind"] == "NodeFeatureList"
    assert features["items"][0]["kind"] == "NodeFeature"  # custom resources keep theirs


@pytest.mark.parametrize(
    ("selector", "expected"),
    [
        ("fieldSelector=spec.nodeName=n1", ["a", "b"]),
        ("fieldSelector=spec.nodeName==n2", ["c"]),
        ("fieldSelector=spec.nodeName=", ["pending"]),  # unscheduled
        ("fieldSelector=spec.nodeName!=n1", ["c", "pending"]),
        ("fieldSelector=metadata.namespace=other,status.phase=Pending", ["pending"]),
        ("fieldSelector=metadata.name=b", ["b"]),
        ("labelSelector=app=train", ["a", "c"]),
        ("labelSelector=app!=train", ["b", "pending"]),  # != matches a missing key too
        ("labelSelector=app in (serve, train),tier", ["a"]),
        ("labelSelector=app notin (train)", ["b", "pending"]),
        ("labelSelector=!app", ["pending"]),
        ("labelSelector=app=train&fieldSelector=spec.nodeName=n1", ["a"]),
    ],
)
def test_list_selectors(api: KubeApiServer, selector: str, expected: list[str]) -> None:
    seed(api)
    query = "&".join(
        f"{k}={quote(v)}" for k, v in (part.split("=", 1) for part in selector.split("&"))
    )
    assert names(get(api, f"/api/v1/pods?{query}")) == expected


def test_unsupported_selectors_are_bad_requests(api: KubeApiServer) -> None:
    answer = call(api, "GET", "/api/v1/pods?fieldSelector=spec.priority%3D1")
    assert answer.status == 400 and answer.body["reason"] == "BadRequest"
    assert answer.body["message"] == "field label not supported: spec.priority"
    answer = call(api, "GET", "/api/v1/pods?labelSelector=a%20in%20b")
    assert answer.status == 400
    answer = call(api, "GET", f"{NF_PATH}?fieldSelector=spec.x%3D1")
    assert "is not a known field selector" in answer.body["message"]


def test_pagination_serves_a_consistent_snapshot(api: KubeApiServer) -> None:
    seed(api)
    first = get(api, "/api/v1/pods?limit=3")
    assert names(first) == ["a", "b", "c"]
    assert first["metadata"]["remainingItemCount"] == 1
    api.add_pod("default", "aa", "n1")  # after the first page: not in this list
    rest = get(api, f"/api/v1/pods?limit=3&continue={first['metadata']['continue']}")
    assert names(rest) == ["pending"]
    assert "continue" not in rest["metadata"]
    assert rest["metadata"]["resourceVersion"] == first["metadata"]["resourceVersion"]
    assert names(get(api, "/api/v1/pods?limit=2&resourceVersion=0")) == [
        "a",
        "aa",
        "b",
        "c",
        "pending",
    ]  # served "from the watch cache": limit ignored
    page = get(api, "/api/v1/pods?limit=1&fieldSelector=spec.nodeName%3Dn1")
    assert "remainingItemCount" not in page["metadata"]  # not counted under a selector
    api.expire_history()
    answer = call(api, "GET", f"/api/v1/pods?limit=1&continue={page['metadata']['continue']}")
    assert answer.status == 410 and answer.body["reason"] == "Expired"
    assert call(api, "GET", "/api/v1/pods?continue=garbage").status == 400


# --- single objects: get, create, update, delete --------------------------------------------------


def test_create_get_and_already_exists(api: KubeApiServer) -> None:
    manifest = pod("default", "p", "n1", labels={"a": "b"}, uid="client-made-up")
    created = call(api, "POST", "/api/v1/namespaces/default/pods", manifest)
    assert created.status == 201
    meta = created.body["metadata"]
    assert meta["uid"] != "client-made-up"  # the server assigns uids
    assert meta["resourceVersion"] == str(api.resource_version)
    assert get(api, "/api/v1/namespaces/default/pods/p") == created.body
    again = call(api, "POST", "/api/v1/namespaces/default/pods", manifest)
    assert again.status == 409 and again.body["reason"] == "AlreadyExists"
    assert again.body["message"] == 'pods "p" already exists'
    elsewhere = call(api, "POST", "/api/v1/namespaces/other/pods", manifest)
    assert elsewhere.status == 400
    missing = call(api, "GET", "/api/v1/namespaces/default/pods/nope")
    assert (missing.status, missing.body["details"]) == (404, {"name": "nope", "kind": "pods"})
    with_rv = pod("default", "q")
    with_rv["metadata"]["resourceVersion"] = "5"
    assert call(api, "POST", "/api/v1/namespaces/default/pods", with_rv).status == 500
    generated = pod("default", "")
    generated["metadata"] = {"generateName": "worker-"}
    answer = call(api, "POST", "/api/v1/namespaces/default/pods", generated)
    assert answer.status == 201 and answer.body["metadata"]["name"].startswith("worker-")


def test_update_is_optimistic(api: KubeApiServer) -> None:
    api.add_node("n1")
    node = get(api, "/api/v1/nodes/n1")
    node["metadata"]["labels"]["x"] = "1"
    updated = call(api, "PUT", "/api/v1/nodes/n1", node)
    assert updated.status == 200
    assert int(updated.body["metadata"]["resourceVersion"]) > int(
        node["metadata"]["resourceVersion"]
    )
    stale = call(api, "PUT", "/api/v1/nodes/n1", node)  # the old resourceVersion
    assert stale.status == 409
    assert stale.body == {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": 'Operation cannot be fulfilled on nodes "n1": the object has been modified; '
        "please apply your changes to the latest version and try again",
        "reason": "Conflict",
        "details": {"name": "n1", "kind": "nodes"},
        "code": 409,
    }
    del node["metadata"]["resourceVersion"]  # unconditional update
    node["metadata"]["labels"]["x"] = "2"
    assert call(api, "PUT", "/api/v1/nodes/n1", node).status == 200
    node["metadata"]["name"] = "n2"
    assert call(api, "PUT", "/api/v1/nodes/n1", node).status == 400
    node["metadata"]["name"] = "n3"
    assert call(api, "PUT", "/api/v1/nodes/n3", node).status == 404


def test_delete_answers_like_apiserver(api: KubeApiServer) -> None:
    seed(api)
    gone = call(api, "DELETE", "/api/v1/namespaces/default/pods/a")
    assert gone.status == 200 and gone.body["kind"] == "Pod"  # pods answer the object
    node = call(api, "DELETE", "/api/v1/nodes/n2")
    assert node.body["status"] == "Success" and node.body["details"]["name"] == "n2"
    assert call(api, "DELETE", "/api/v1/nodes/n2").status == 404
    wrong_uid = {"preconditions": {"uid": "nope"}}
    assert call(api, "DELETE", "/api/v1/nodes/n1", wrong_uid).status == 409
    removed = call(api, "DELETE", "/api/v1/namespaces/other/pods?labelSelector=app%3Dtrain")
    assert names(removed.body) == ["c"]
    assert [p["metadata"]["name"] for p in api.objects("pods")] == ["b", "pending"]


def test_finalizers_hold_a_deletion(api: KubeApiServer, watch: Any) -> None:
    feature = node_feature("nfd", "f", "n1")
    feature["metadata"]["finalizers"] = ["example.com/cleanup"]
    api.create(feature)
    stream = watch(f"{NF_PATH}?watch=1&resourceVersion={api.resource_version}")
    answer = call(api, "DELETE", f"{NF_PATH}/f")
    assert answer.status == 202 and answer.body["metadata"]["deletionTimestamp"]
    release = [{"op": "remove", "path": "/metadata/finalizers"}]
    assert call(api, "PATCH", f"{NF_PATH}/f", release, JSON_PATCH).status == 200
    assert stream.events(2) == [("MODIFIED", "f"), ("DELETED", "f")]
    assert api.get_node_feature("nfd", "f") is None


# --- patches ------------------------------------------------------------------------------------


def test_patch_content_types(api: KubeApiServer) -> None:
    api.add_node("n1", labels={"keep": "1", "drop": "1"})
    path = "/api/v1/nodes/n1"
    merge = {"metadata": {"labels": {"drop": None, "merge": "1"}}}
    assert call(api, "PATCH", path, merge, MERGE_PATCH).status == 200
    smp = {"metadata": {"labels": {"keep": None, "smp": "1"}}}
    assert call(api, "PATCH", path, smp, STRATEGIC_PATCH).status == 200
    ops = [
        {"op": "add", "path": "/metadata/labels/example.com~1json", "value": "1"},
        {"op": "test", "path": "/metadata/labels/smp", "value": "1"},
        {"op": "replace", "path": "/metadata/labels/merge", "value": "2"},
    ]
    patched = call(api, "PATCH", path, ops, JSON_PATCH)
    assert patched.status == 200
    assert patched.body["metadata"]["labels"] == {
        "kubernetes.io/hostname": "n1",
        "merge": "2",
        "smp": "1",
        "example.com/json": "1",
    }
    assert [r.content_type for r in api.calls("patch", "nodes")] == [
        MERGE_PATCH,
        STRATEGIC_PATCH,
        JSON_PATCH,
    ]


def test_patch_failures(api: KubeApiServer) -> None:
    api.add_node("n1")
    path = "/api/v1/nodes/n1"
    failed_test = [{"op": "test", "path": "/metadata/labels/kubernetes.io~1hostname", "value": "x"}]
    answer = call(api, "PATCH", path, failed_test, JSON_PATCH)
    assert (answer.status, answer.body["reason"]) == (422, "Invalid")
    assert (
        answer.body["message"] == "the server rejected our request due to an error in our request"
    )
    missing = [{"op": "remove", "path": "/metadata/annotations/nope"}]
    assert call(api, "PATCH", path, missing, JSON_PATCH).status == 422
    assert call(api, "PATCH", path, {"op": "add"}, JSON_PATCH).status == 400  # not a list
    assert call(api, "PATCH", path, b"{not json", MERGE_PATCH).status == 400
    stale = {"metadata": {"resourceVersion": "1", "labels": {"a": "b"}}}
    conflict = call(api, "PATCH", path, stale, MERGE_PATCH)
    assert (conflict.status, conflict.body["reason"]) == (409, "Conflict")
    current = {"metadata": {"resourceVersion": str(api.resource_version), "labels": {"a": "b"}}}
    assert call(api, "PATCH", path, current, MERGE_PATCH).status == 200
    unknown = call(api, "PATCH", path, {}, "application/json")
    assert (unknown.status, unknown.body["reason"]) == (415, "UnsupportedMediaType")
    assert call(api, "PATCH", "/api/v1/nodes/n9", {}, MERGE_PATCH).status == 404
    api.add_node_feature("nfd", "f", "n1")
    crd = call(api, "PATCH", f"{NF_PATH}/f", {"spec": {}}, STRATEGIC_PATCH)
    assert crd.status == 415  # no strategic merge patch for custom resources
    assert STRATEGIC_PATCH not in crd.body["message"]


def test_noop_writes_keep_the_resource_version(api: KubeApiServer, watch: Any) -> None:
    api.add_node("n1", labels={"a": "b"})
    rv = api.resource_version
    stream = watch(f"/api/v1/nodes?watch=1&resourceVersion={rv}&allowWatchBookmarks=true")
    same = call(api, "PATCH", "/api/v1/nodes/n1", {"metadata": {"labels": {"a": "b"}}}, MERGE_PATCH)
    assert same.body["metadata"]["resourceVersion"] == str(rv)
    assert call(api, "PUT", "/api/v1/nodes/n1", same.body).status == 200
    assert api.resource_version == rv
    api.bookmark()
    assert stream.event()["type"] == "BOOKMARK"  # and no MODIFIED before it


def test_status_subresource(api: KubeApiServer) -> None:
    api.add_pod("default", "p", "n1", phase="Pending")
    path = "/api/v1/namespaces/default/pods/p"
    both = {"metadata": {"labels": {"x": "1"}}, "status": {"phase": "Failed"}}
    main = call(api, "PATCH", path, both, MERGE_PATCH).body
    assert main["metadata"]["labels"] == {"x": "1"} and main["status"]["phase"] == "Pending"
    status = call(api, "PATCH", f"{path}/status", both | {"metadata": {"labels": {}}}, MERGE_PATCH)
    assert status.body["status"]["phase"] == "Failed"
    assert status.body["metadata"]["labels"] == {"x": "1"}
    assert call(api, "GET", f"{path}/log").status == 404


def test_validation(api: KubeApiServer) -> None:
    api.add_node("n1")
    bad = {"metadata": {"labels": {"gpuscope/model": "NVIDIA H100 80GB"}}}
    answer = call(api, "PATCH", "/api/v1/nodes/n1", bad, MERGE_PATCH)
    assert (answer.status, answer.body["reason"]) == (422, "Invalid")
    assert answer.body["message"].startswith(
        'Node "n1" is invalid: metadata.labels: Invalid value: "NVIDIA H100 80GB": a valid label'
    )
    assert answer.body["details"]["causes"][0]["field"] == "metadata.labels"
    long_key = {"metadata": {"labels": {"x" * 64: "v"}}}
    assert call(api, "PATCH", "/api/v1/nodes/n1", long_key, MERGE_PATCH).status == 422
    number = {"metadata": {"labels": {"count": 8}}}
    assert call(api, "PATCH", "/api/v1/nodes/n1", number, MERGE_PATCH).status == 422
    created = call(api, "POST", "/api/v1/nodes", {"metadata": {"name": "n2", "labels": {"c": 8}}})
    assert created.status == 400  # the decoder refuses it
    upper = call(api, "POST", "/api/v1/nodes", {"metadata": {"name": "Node2"}})
    assert upper.status == 422


# --- watch --------------------------------------------------------------------------------------


def test_watch_streams_changes_after_a_resource_version(api: KubeApiServer, watch: Any) -> None:
    seed(api)
    rv = api.resource_version
    stream = watch(f"/api/v1/pods?watch=1&resourceVersion={rv}&fieldSelector=spec.nodeName%3Dn1")
    assert stream.status == 200
    assert stream.headers["transfer-encoding"] == "chunked"
    assert stream.headers["content-type"] == "application/json"
    api.add_pod("default", "new", "n1")
    api.add_pod("default", "other-node", "n2")  # not selected
    api.update_pod("default", "new", phase="Succeeded")
    api.delete_pod("default", "new")
    api.update_pod("other", "pending", node="n1")  # moves in: ADDED
    api.update_pod("default", "b", node="n2")  # moves out: DELETED
    first = stream.event()
    assert first["object"]["kind"] == "Pod" and first["object"]["apiVersion"] == "v1"
    assert int(first["object"]["metadata"]["resourceVersion"]) == rv + 1
    assert first["type"] == "ADDED" and first["object"]["metadata"]["name"] == "new"
    assert stream.events(4) == [
        ("MODIFIED", "new"),
        ("DELETED", "new"),
        ("ADDED", "pending"),
        ("DELETED", "b"),
    ]


def test_watch_history_replay_and_selection_moves(api: KubeApiServer, watch: Any) -> None:
    seed(api)
    rv = api.resource_version
    api.add_pod("default", "new", "n1")
    api.update_pod("default", "new", phase="Succeeded")
    api.delete_pod("default", "new")
    api.update_pod("other", "pending", node="n1")  # moves into the selection: ADDED
    api.update_pod("default", "b", node="n2")  # moves out: DELETED, previous content
    stream = watch(f"/api/v1/pods?watch=1&resourceVersion={rv}&fieldSelector=spec.nodeName%3Dn1")
    events = [stream.event() for _ in range(5)]
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [
        ("ADDED", "new"),
        ("MODIFIED", "new"),
        ("DELETED", "new"),
        ("ADDED", "pending"),
        ("DELETED", "b"),
    ]
    assert [int(e["object"]["metadata"]["resourceVersion"]) for e in events] == list(
        range(rv + 1, rv + 6)
    )
    assert events[4]["object"]["spec"]["nodeName"] == "n1"  # as it was when it matched
    api.add_pod("default", "live", "n1")
    assert stream.events(1) == [("ADDED", "live")]


def test_watch_without_resource_version_starts_with_the_state(
    api: KubeApiServer, watch: Any
) -> None:
    seed(api)
    stream = watch(
        "/api/v1/namespaces/default/pods?watch=true&allowWatchBookmarks=true"
        "&sendInitialEvents=true&resourceVersionMatch=NotOlderThan"
    )
    assert stream.events(2) == [("ADDED", "a"), ("ADDED", "b")]
    end = stream.event()
    assert end["type"] == "BOOKMARK"
    assert end["object"]["metadata"]["annotations"] == {"k8s.io/initial-events-end": "true"}
    assert end["object"]["metadata"]["resourceVersion"] == str(api.resource_version)
    api.delete_pod("default", "a")
    assert stream.events(1) == [("DELETED", "a")]
    legacy = watch("/api/v1/watch/namespaces/default/pods/b")
    assert legacy.events(1) == [("ADDED", "b")]


def test_bookmarks(api: KubeApiServer, watch: Any) -> None:
    api.add_node("n1")
    plain = watch(f"/api/v1/nodes?watch=1&resourceVersion={api.resource_version}")
    marked = watch(
        f"/api/v1/nodes?watch=1&resourceVersion={api.resource_version}&allowWatchBookmarks=true"
    )
    api.bookmark()
    api.update_node("n1", labels={"x": "y"})
    bookmark = marked.event()
    assert bookmark == {
        "type": "BOOKMARK",
        "object": {
            "kind": "Node",
            "apiVersion": "v1",
            "metadata": {
                "resourceVersion": str(api.resource_version - 1),
                "creationTimestamp": None,
            },
        },
    }
    assert marked.events(1) == [("MODIFIED", "n1")]
    assert plain.events(1) == [("MODIFIED", "n1")]  # never a bookmark unless allowed
    api.bookmark_interval = 0.02
    periodic = watch("/api/v1/nodes?watch=1&resourceVersion=0&allowWatchBookmarks=1")
    assert periodic.events(1) == [("ADDED", "n1")]
    assert [periodic.event()["type"] for _ in range(2)] == ["BOOKMARK", "BOOKMARK"]


def test_watch_from_an_expired_resource_version_gets_410(api: KubeApiServer, watch: Any) -> None:
    seed(api)
    old = api.resource_version
    api.add_pod("default", "new", "n1")
    api.expire_history()
    stream = watch(f"/api/v1/pods?watch=1&resourceVersion={old}", wait=False)
    assert stream.status == 200  # the error is an event, not an HTTP status
    assert stream.event() == {
        "type": "ERROR",
        "object": {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": f"too old resource version: {old} ({api.resource_version})",
            "reason": "Expired",
            "code": 410,
        },
    }
    assert stream.ends_cleanly()
    current = watch(f"/api/v1/pods?watch=1&resourceVersion={api.resource_version}")
    api.delete_pod("default", "new")
    assert current.events(1) == [("DELETED", "new")]


def test_bounded_history_expires_old_resource_versions(watch: Any) -> None:
    with KubeApiServer(history_limit=3) as api:
        start = api.resource_version
        for i in range(5):
            api.add_node(f"n{i}")
        expired = RawWatch(api, f"/api/v1/nodes?watch=1&resourceVersion={start + 1}")
        assert expired.event()["object"]["code"] == 410
        kept = RawWatch(api, f"/api/v1/nodes?watch=1&resourceVersion={start + 2}")
        assert kept.events(3) == [("ADDED", "n2"), ("ADDED", "n3"), ("ADDED", "n4")]
        for stream in (expired, kept):
            stream.close()


def test_watch_ends_cleanly_at_its_timeout(api: KubeApiServer, watch: Any) -> None:
    started = time.monotonic()
    stream = watch("/api/v1/pods?watch=1&timeoutSeconds=1")  # whole seconds, as in the API
    assert stream.ends_cleanly()
    assert 1 <= time.monotonic() - started < 2.5
    api.max_watch_seconds = 0.05  # apiserver's own cap, whichever is shorter
    assert watch("/api/v1/pods?watch=1&timeoutSeconds=30").ends_cleanly()
    assert call(api, "GET", "/api/v1/pods?watch=1&timeoutSeconds=soon").status == 400


def test_a_bookmark_comes_before_the_watch_times_out(api: KubeApiServer, watch: Any) -> None:
    api.add_node("n1")
    rv = api.resource_version
    stream = watch(
        f"/api/v1/nodes?watch=1&resourceVersion={rv}&allowWatchBookmarks=1&timeoutSeconds=3"
    )
    event = stream.event()  # 2 s before the deadline, as the watch cache sends it
    assert event["type"] == "BOOKMARK" and event["object"]["metadata"]["resourceVersion"] == str(rv)
    assert stream.ends_cleanly()


def test_frozen_watches_send_nothing_and_end_with_their_client(
    api: KubeApiServer, watch: Any
) -> None:
    api.add_node("n1")
    api.bookmark_interval = 0.05
    frozen = watch(
        f"/api/v1/nodes?watch=1&resourceVersion={api.resource_version}"
        "&allowWatchBookmarks=true&timeoutSeconds=1"
    )
    assert frozen.event()["type"] == "BOOKMARK"  # alive until frozen
    assert api.freeze_watches() == 1
    api.update_node("n1", labels={"x": "y"})
    api.bookmark()
    frozen.sock.settimeout(1.5)  # past its timeoutSeconds: no event, bookmark or end of stream
    with pytest.raises(TimeoutError):
        frozen.chunk()
    assert api.frozen_watches == 1 and api.watch_count == 1  # the connection stays open
    fresh = watch(f"/api/v1/nodes?watch=1&resourceVersion={api.resource_version - 1}")
    assert fresh.events(1) == [("MODIFIED", "n1")]  # new watches are served as usual
    frozen.close()  # the client gives up: the server's side of the watch goes too
    wait_for(lambda: api.frozen_watches == 0, what="frozen watch released")
    assert api.watch_count == 1 and api.errors == []


def test_drop_watches_cuts_streams(api: KubeApiServer, watch: Any) -> None:
    api.add_node("n1")
    one = watch(f"/api/v1/nodes?watch=1&resourceVersion={api.resource_version}")
    two = watch(f"/api/v1/pods?watch=1&resourceVersion={api.resource_version}")
    assert api.drop_watches() == 2
    assert not one.ends_cleanly() and not two.ends_cleanly()
    assert api.get_node("n1") is not None and get(api, "/api/v1/nodes/n1")


def test_graceful_pod_deletion(api: KubeApiServer, watch: Any) -> None:
    api.add_pod(
        "default", "p", "n1", owner_references=[owner_reference("Job", "train", uid="job-uid")]
    )
    stream = watch(f"/api/v1/pods?watch=1&resourceVersion={api.resource_version}")
    api.delete_pod("default", "p", graceful=True)
    terminating, deleted = stream.event(), stream.event()
    assert terminating["type"] == "MODIFIED"
    assert terminating["object"]["metadata"]["deletionTimestamp"]
    assert terminating["object"]["metadata"]["ownerReferences"][0]["uid"] == "job-uid"
    assert deleted["type"] == "DELETED"


# --- faults, lifecycle, auth, request log ---------------------------------------------------------


def test_fail_next(api: KubeApiServer) -> None:
    api.add_node("n1")
    api.fail_next(2, code=503)
    first, second = call(api, "GET", "/api/v1/nodes"), call(api, "GET", "/api/v1/nodes/n1")
    assert (first.status, first.body["reason"]) == (503, "ServiceUnavailable")
    assert second.status == 503
    assert call(api, "GET", "/api/v1/nodes").status == 200
    api.fail_next(1, code=500, method="PATCH")
    assert call(api, "GET", "/api/v1/nodes").status == 200
    patch = call(api, "PATCH", "/api/v1/nodes/n1", {}, MERGE_PATCH)
    assert (patch.status, patch.body["reason"]) == (500, "InternalError")
    api.fail_next(1, code=429)
    throttled = call(api, "GET", "/api/v1/nodes")
    assert throttled.status == 429 and throttled.headers["Retry-After"] == "1"
    assert [r.code for r in api.requests] == [503, 503, 200, 200, 500, 429]


def test_delay(api: KubeApiServer) -> None:
    api.delay(0.2)
    started = time.monotonic()
    assert call(api, "GET", "/api/v1/nodes").status == 200
    assert time.monotonic() - started >= 0.2
    api.delay(0)


def test_stop_and_start_on_the_same_port(api: KubeApiServer, watch: Any) -> None:
    api.add_node("n1")
    port = api.port
    stream = watch(f"/api/v1/nodes?watch=1&resourceVersion={api.resource_version}")
    api.stop()
    assert not stream.ends_cleanly()
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
    api.start()
    assert api.port == port
    assert names(get(api, "/api/v1/nodes")) == ["n1"]  # state survives the restart


def test_token_and_request_log(api: KubeApiServer) -> None:
    api.add_node("n1")
    call(api, "GET", "/api/v1/nodes?limit=5", token="abc")
    call(api, "PATCH", "/api/v1/nodes/n1", {"metadata": {}}, MERGE_PATCH)
    listed, patched = api.requests
    assert (listed.method, listed.path, listed.query) == ("GET", "/api/v1/nodes", {"limit": "5"})
    assert (listed.verb, listed.resource, listed.token) == ("list", "nodes", "abc")
    assert (patched.verb, patched.name, patched.content_type) == ("patch", "n1", MERGE_PATCH)
    assert patched.body == {"metadata": {}}
    assert len(api.calls("list", "nodes")) == 1
    api.clear_requests()
    assert api.requests == []
    with KubeApiServer(token="secret") as strict:
        assert call(strict, "GET", "/api/v1/nodes", token="wrong").status == 401
        assert call(strict, "GET", "/api/v1/nodes", token="secret").status == 200


def test_kubeconfig(api: KubeApiServer, tmp_path: Path) -> None:
    text = api.kubeconfig(tmp_path / "config").read_text()
    assert f"server: {api.url}\n" in text
    assert "token: test-token\n" in text and "current-context: kube-apiserver-double\n" in text


# --- the patch algorithms -----------------------------------------------------------------------


def test_merge_patch_rfc7386() -> None:
    target = {"a": "b", "c": {"d": "e", "f": "g"}, "list": [1, 2]}
    patch = {"a": "z", "c": {"f": None}, "list": [3], "new": {"x": None, "y": 1}}
    assert merge_patch(target, patch) == {
        "a": "z",
        "c": {"d": "e"},
        "list": [3],
        "new": {"y": 1},
    }


def test_json_patch_rfc6902() -> None:
    doc = {"a": [1, 2], "b": {"c": 1}}
    ops = [
        {"op": "add", "path": "/a/1", "value": 9},
        {"op": "add", "path": "/a/-", "value": 3},
        {"op": "move", "from": "/b/c", "path": "/d"},
        {"op": "copy", "from": "/d", "path": "/b/e"},
        {"op": "test", "path": "/a", "value": [1, 9, 2, 3]},
    ]
    assert json_patch(doc, ops) == {"a": [1, 9, 2, 3], "b": {"e": 1}, "d": 1}
    assert doc == {"a": [1, 2], "b": {"c": 1}}  # not modified in place


def test_strategic_merge_patch_lists() -> None:
    target = {
        "metadata": {"finalizers": ["a"], "labels": {"x": "1"}},
        "spec": {
            "containers": [{"name": "main", "image": "v1"}, {"name": "side", "image": "s"}],
            "tolerations": [{"key": "t"}],
        },
    }
    patch = {
        "metadata": {"finalizers": ["b"], "labels": {"$patch": "replace", "y": "2"}},
        "spec": {
            "containers": [{"name": "main", "image": "v2"}, {"name": "side", "$patch": "delete"}],
            "tolerations": [{"key": "u"}],
        },
    }
    assert strategic_merge_patch(target, patch) == {
        "metadata": {"finalizers": ["a", "b"], "labels": {"y": "2"}},
        "spec": {"containers": [{"name": "main", "image": "v2"}], "tolerations": [{"key": "u"}]},
    }
