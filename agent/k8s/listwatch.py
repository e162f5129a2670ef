"""A cache of one kind of Kubernetes object, kept current by list + watch on its own thread.

The pod watcher (agent/k8s/pods.py) and the DRA caches are instances. For any resource: a watch that
ends resumes from the last resourceVersion, a 410 Gone relists and replaces the cache, each
watch asks for bookmarks and a jittered server-side timeout and reads with a timeout longer
than the bookmark gap (silence drops the connection and relists), and while the API server is
unreachable the last objects stay and the connection is retried with a backoff.

A resource served in several versions (DRA's `resource.k8s.io` v1, v1beta2, v1beta1) is given
as its candidates, newest first: before each list the API group's discovery document
(`GET /apis/<group>`, as kubectl and client-go read it) says which versions the API server
serves, the list takes the first candidate among them and the watch follows in that version.
So an agent reads a 1.32 cluster as it reads a 1.34 one, and moves to the newer version at
its next relist after an upgrade; a server that serves none of them fails the list with one
line naming what it does serve.

What is cached is not the object but what `parse` keeps of it: `parse(obj) -> (key, value)`,
a value of None meaning "nothing worth keeping" (removed from the cache), so a watch over
every ResourceClaim of a cluster holds a few small records, not the objects.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, Generic, TypeVar

from gpuscope.agent.k8s.client import WatchSilent, watch_once

log = logging.getLogger("gpuscope.k8s.listwatch")

K = TypeVar("K")
V = TypeVar("V")

SHORT_WATCH = 1.0  # seconds: a watch that ends sooner with no event is a failure (client-go)


class ListWatch(Generic[K, V]):
    """This cache's objects, by key, in `items()` (an immutable map, swapped atomically).

    `resource` is a lightkube resource class, or its versions newest first (module
    docstring); `served` is the one the last list used. `namespace` "*" watches every
    namespace (None for a cluster-scoped resource); `fields` is a field selector. `what`
    names the cache in log lines and errors ("resourceslices of node n1"). `synced` is set
    after the first successful list, `attempted` after the first list whatever its outcome;
    `error` is the last failure (one line) until a list succeeds again; `alive_at` is when
    the API server last answered (a list, an event, a bookmark), on `monotonic`.
    """

    def __init__(
        self,
        client_factory: Callable[[], Any],
        resource: type[Any] | Sequence[type[Any]],
        parse: Callable[[Mapping[str, Any]], tuple[K, V | None]],
        *,
        what: str,
        namespace: str | None = None,
        fields: Mapping[str, str] | None = None,
        backoff_first: float = 1.0,
        backoff_max: float = 30.0,
        watch_timeout: int = 300,
        read_timeout: float = 75.0,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self._client_factory = client_factory
        self._candidates: tuple[type[Any], ...] = (
            tuple(resource) if isinstance(resource, Sequence) else (resource,)
        )
        self.served: type[Any] = self._candidates[0]
        self._parse = parse
        self.what = what
        self._namespace = namespace
        self._fields = dict(fields) if fields else None
        self._backoff_first = backoff_first
        self._backoff_max = backoff_max
        self._watch_timeout = watch_timeout
        self._read_timeout = read_timeout
        self._monotonic = monotonic
        self._silent = False
        self._items: Mapping[K, V] = MappingProxyType({})
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()
        self.attempted = threading.Event()
        self.alive_at: float | None = None
        self.lists = 0
        self.silences = 0
        self.error: str | None = None

    def items(self) -> Mapping[K, V]:
        return self._items

    def trouble(self, stale_after: float) -> str | None:
        """Why the cache may be out of date, in one fixed line (the runner logs it once), or
        None: the last list or watch failed, or nothing (no event, no bookmark) was heard for
        over `stale_after` seconds on `monotonic`."""
        if self.error is not None:
            return f"{self.what}: {self.error}"
        if self.alive_at is None or self._monotonic() - self.alive_at > stale_after:
            return (
                f"nothing heard on the watch of {self.what} for over {stale_after:g}s "
                "(no event or bookmark); reconnecting"
            )
        return None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name=f"watch-{self.what}", daemon=True)
        self._thread.start()

    def signal_stop(self) -> None:
        """Ask the thread to stop without waiting for it (to stop several watches at once)."""
        self._stop.set()

    def stop(self, timeout: float = 1.0) -> None:
        """Stop; a watch blocked on a quiet API server ends within the read timeout (daemon
        thread)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None

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
                if self._stop.is_set():
                    break  # stopping: the connection closing under us is not news
                self.silences += 1
                if not self._silent:
                    log.warning("watching %s: %s; relisting", self.what, exc)
                self._silent = True
                _close(client)
                client = None
            except Exception as exc:  # noqa: BLE001 - any failure: keep the cache, retry
                if self._stop.is_set():
                    break  # stopping: the connection closing under us is not news
                message = _one_line(exc)
                if message != self.error:
                    log.warning("watching %s: %s", self.what, message)
                self.error = message
                self.attempted.set()
                _close(client)
                client = None
                self._stop.wait(delay)
                delay = min(self._backoff_max, delay * 2)
        _close(client)

    def _list(self, client: Any) -> str:
        listing = self._list_served(client)
        items: dict[K, V] = {}
        for obj in listing:
            key, value = self._parse(obj.to_dict())
            if value is not None:
                items[key] = value
        self._items = MappingProxyType(items)
        self.lists += 1
        self.alive_at = self._monotonic()
        if self.error is not None:
            log.info("watching %s: recovered", self.what)
        self.error = None
        self.synced.set()
        self.attempted.set()
        return str(listing.resourceVersion)

    def _list_served(self, client: Any) -> Any:
        """The list in the newest candidate version the API server serves (module docstring)."""
        resource = self._candidates[0]
        if len(self._candidates) > 1:
            resource = _newest_served(client, self._candidates)
            if resource is not self.served or (
                resource is not self._candidates[0] and not self.lists
            ):
                newer = self._candidates[: self._candidates.index(resource)]
                log.info(
                    "watching %s in %s%s",
                    self.what,
                    _version(resource),
                    f" (the API server serves no {', '.join(map(_version, newer))})"
                    if newer
                    else "",
                )
        self.served = resource
        return client.list(resource, namespace=self._namespace, fields=self._fields)

    def _watch(self, client: Any, rv: str) -> None:
        from lightkube import ApiError

        while not self._stop.is_set():
            server_timeout = int(self._watch_timeout * (1 + random.random()))
            began, events = self._monotonic(), 0
            try:
                for op, obj in watch_once(
                    client,
                    self.served,
                    namespace=self._namespace,
                    fields=self._fields,
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
                        continue
                    self._silent = False
                    key, value = self._parse(obj.to_dict())
                    items = dict(self._items)
                    if op == "DELETED" or value is None:
                        items.pop(key, None)
                    else:
                        items[key] = value
                    self._items = MappingProxyType(items)
            except ApiError as exc:
                if exc.status.code == 410:
                    log.debug("watch of %s expired (410 Gone): relisting", self.what)
                    return
                raise
            if events == 0 and self._monotonic() - began < SHORT_WATCH:
                raise RuntimeError(
                    f"the API server ended the watch of {self.what} at once, sending nothing"
                )


def _version(resource: type[Any]) -> str:
    """`group/version` of a lightkube resource class, for log lines."""
    info = _info(resource)
    return f"{info.group}/{info.version}" if info.group else str(info.version)


class NotServed(Exception):
    """The API server serves none of a resource's candidate versions."""


def served_versions(client: Any, group: str) -> tuple[str, ...]:
    """The versions of `group` the API server serves, by its discovery document
    (`GET /apis/<group>`: an APIGroup, its `versions[].version`); () when it serves no such
    group (404). lightkube has no discovery call: the request goes through its HTTP client,
    with the client's own server, credentials and timeouts."""
    generic = client._client  # lightkube's GenericSyncClient, as in watch_once
    response = generic.send(generic._client.build_request("GET", f"/apis/{group}"))
    if response.status_code == 404:
        return ()
    generic.raise_for_status(response)  # lightkube's ApiError, with the Status
    versions = response.json().get("versions")
    return tuple(
        str(v["version"]) for v in versions or () if isinstance(v, dict) and "version" in v
    )


def _newest_served(client: Any, candidates: Sequence[type[Any]]) -> type[Any]:
    group = _info(candidates[0]).group
    served = served_versions(client, group)
    for resource in candidates:
        if _info(resource).version in served:
            return resource
    wanted = ", ".join(_version(r) for r in candidates)
    raise NotServed(
        f"the API server serves none of {wanted}"
        + (f" (it serves {', '.join(f'{group}/{v}' for v in served)})" if served else "")
    )


def _info(resource: type[Any]) -> Any:
    return resource._api_info.resource  # lightkube's only record of a class's group/version


def _one_line(exc: BaseException) -> str:
    """A failure in one line; a 404 on a whole resource says the API does not serve it."""
    status = getattr(exc, "status", None)
    if getattr(status, "code", None) == 404:
        return "the API server does not serve this resource (404)"
    text = str(exc)
    return text.splitlines()[0] if text else type(exc).__name__


def _close(client: Any) -> None:
    if client is not None:
        try:
            client.close()
        except Exception:  # closing is best effort
            log.debug("closing the Kubernetes API client failed", exc_info=True)
