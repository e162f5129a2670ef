"""The pods of this node, kept current by a list + watch on the Kubernetes API (lightkube).

Only this node's pods are requested (`fieldSelector=spec.nodeName=<node>`), so the cost
does not grow with the cluster. A watch that ends is resumed from the last resourceVersion;
a 410 Gone (history compacted) relists and replaces the cache, so pods deleted meanwhile
disappear and none are duplicated. While the API server is unreachable the last known
pods stay (series keep their names) and the connection is retried with a backoff.

A watch can also stop delivering without closing (a half-open connection, a wedged proxy):
that once left a new GPU pod unnamed for 7 minutes while everything looked fine. So each
watch asks for bookmarks, which a real API server sends about once a minute on a quiet
watch, and for a server-side timeout of 5 to 10 minutes (client-go's reflector's choice,
jittered so that a fleet of agents does not reconnect in step), and reads with a timeout
longer than the bookmark gap: silence past it drops the connection, relists and watches
anew. `alive_at` is when the watcher last heard from the API server (a list, an event, a
bookmark), which the `pods` source turns into a staleness bound.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any

from gpuscope.agent.k8s.client import WatchSilent, watch_once
from gpuscope.agent.k8s.records import PodMeta
from gpuscope.agent.k8s.workloads import DEFAULT_ORDER, resolve

log = logging.getLogger("gpuscope.k8s.pods")

SHORT_WATCH = 1.0  # seconds: a watch that ends sooner with no event is a failure (client-go)


def pod_meta(obj: Mapping[str, Any], order: Sequence[str] = DEFAULT_ORDER) -> PodMeta:
    meta = obj.get("metadata") or {}
    status = obj.get("status") or {}
    containers: dict[str, str] = {}
    for key in ("initContainerStatuses", "containerStatuses", "ephemeralContainerStatuses"):
        for cs in status.get(key) or ():
            runtime_id = str(cs.get("containerID") or "")
            if runtime_id and cs.get("name"):
                # "containerd://<id>", "cri-o://<id>", "docker://<id>"
                containers[runtime_id.rpartition("://")[2]] = str(cs["name"])
    return PodMeta(
        uid=str(meta.get("uid", "")),
        namespace=str(meta.get("namespace", "")),
        name=str(meta.get("name", "")),
        workload=resolve(obj, order),
        containers=MappingProxyType(containers),
    )


class PodWatcher:
    def __init__(
        self,
        client_factory: Callable[[], Any],
        node_name: str,
        *,
        order: Sequence[str] = DEFAULT_ORDER,
        backoff_first: float = 1.0,
        backoff_max: float = 30.0,
        watch_timeout: int = 300,
        read_timeout: float = 75.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        """`watch_timeout`: the shortest server-side watch timeout asked for (each watch asks
        for a random one up to twice that); `read_timeout`: the longest silence tolerated on
        a watch before it is dropped, to be longer than the API server's bookmark gap."""
        self._client_factory = client_factory
        self._node = node_name
        self._order = tuple(order)
        self._backoff_first = backoff_first
        self._backoff_max = backoff_max
        self._watch_timeout = watch_timeout
        self._read_timeout = read_timeout
        self._monotonic = monotonic
        self._silent = False  # the last watch ended in silence, with no event since
        self.alive_at: float | None = None  # when the API server last answered (monotonic)
        self.silences = 0  # watches dropped for silence
        self._pods: Mapping[str, PodMeta] = MappingProxyType({})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()  # set after the first successful list
        self.attempted = threading.Event()  # set after the first list, whatever its outcome
        self.lists = 0
        self.error: str | None = None

    def pods(self) -> Mapping[str, PodMeta]:
        """This node's pods by UID (an immutable map, swapped atomically)."""
        return self._pods

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pod-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop; a watch blocked on a quiet API server ends within the read timeout (daemon
        thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def _run(self) -> None:
        delay = self._backoff_first
        client: Any = None
        while not self._stop.is_set():
            try:
                if client is None:
                    client = self._client_factory()
                rv = self._list(client)
                delay = self._backoff_first
                self._watch(client, rv)  # returns when the history expired: relist
            except WatchSilent as exc:
                # Presumed dead: a fresh client (a fresh connection), relist and watch anew
                # at once. Logged once, not again while watch after watch stays silent (an
                # API server that sends no bookmarks, on a node where nothing changes).
                self.silences += 1
                if not self._silent:
                    log.warning("watching pods of node %s: %s; relisting", self._node, exc)
                self._silent = True
                _close(client)
                client = None
            except Exception as exc:  # noqa: BLE001 - any failure: keep the last pods, retry
                message = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                if message != self.error:
                    log.warning("watching pods of node %s: %s", self._node, message)
                self.error = message
                self.attempted.set()
                _close(client)
                client = None
                self._stop.wait(delay)
                delay = min(self._backoff_max, delay * 2)

    def _list(self, client: Any) -> str:
        from lightkube.resources.core_v1 import Pod

        listing = client.list(Pod, namespace="*", fields={"spec.nodeName": self._node})
        pods = {}
        for obj in listing:
            meta = pod_meta(obj.to_dict(), self._order)
            pods[meta.uid] = meta
        self._pods = MappingProxyType(pods)
        self.lists += 1
        self.alive_at = self._monotonic()
        if self.error is not None:
            log.info("watching pods of node %s: recovered", self._node)
        self.error = None
        self.synced.set()
        self.attempted.set()
        return str(listing.resourceVersion)

    def _watch(self, client: Any, rv: str) -> None:
        """Watch from `rv`, watch after watch, until the history expires (410: return, to
        relist) or something fails (raise)."""
        from lightkube import ApiError
        from lightkube.resources.core_v1 import Pod

        while not self._stop.is_set():
            server_timeout = int(self._watch_timeout * (1 + random.random()))
            began, events = self._monotonic(), 0
            try:
                for op, obj in watch_once(
                    client,
                    Pod,
                    namespace="*",
                    fields={"spec.nodeName": self._node},
                    resource_version=rv,
                    server_timeout=server_timeout,
                    read_timeout=self._read_timeout,
                ):
                    if self._stop.is_set():
                        return
                    self.alive_at = self._monotonic()
                    events += 1
                    rv = str(obj.metadata.resourceVersion or rv)
                    if op == "BOOKMARK":
                        continue  # nothing changed up to rv: only proof of life
                    self._silent = False
                    meta = pod_meta(obj.to_dict(), self._order)
                    pods = dict(self._pods)
                    if op == "DELETED":
                        pods.pop(meta.uid, None)
                    else:
                        pods[meta.uid] = meta
                    self._pods = MappingProxyType(pods)
            except ApiError as exc:
                if exc.status.code == 410:
                    log.debug("pod watch expired (410 Gone): relisting")
                    return
                raise
            # The server ended the watch (its timeout): resume from the last version seen,
            # unless it ended at once with nothing (a proxy cutting every stream, say): then
            # fail, to relist after a backoff rather than reconnect in a busy loop.
            if events == 0 and self._monotonic() - began < SHORT_WATCH:
                raise RuntimeError("the API server ended the pod watch at once, sending nothing")


def _close(client: Any) -> None:
    """Release a client's connections; a client that fails to close is dropped anyway."""
    if client is not None:
        try:
            client.close()
        except Exception:  # closing is best effort
            log.debug("closing the Kubernetes API client failed", exc_info=True)
