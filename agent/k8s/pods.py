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

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any

from gpuscope.agent.k8s.listwatch import ListWatch
from gpuscope.agent.k8s.records import PodMeta
from gpuscope.agent.k8s.workloads import DEFAULT_ORDER, resolve


def scheduled_at(status: Mapping[str, Any]) -> float | None:
    """The `PodScheduled` condition's `lastTransitionTime` (RFC 3339, `2024-05-01T12:00:00Z`)
    as Unix time, if the condition is True; None otherwise or for a time that does not parse."""
    for condition in status.get("conditions") or ():
        if not isinstance(condition, Mapping) or condition.get("type") != "PodScheduled":
            continue
        when = condition.get("lastTransitionTime")
        if condition.get("status") != "True" or not isinstance(when, str):
            return None
        try:
            parsed = datetime.fromisoformat(when)
        except ValueError:
            return None
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=UTC)  # the API writes UTC
        return parsed.timestamp()
    return None


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
        scheduled_at=scheduled_at(status),
    )


class PodWatcher(ListWatch[str, PodMeta]):
    """This node's pods by UID, kept by the generic list + watch cache (agent/k8s/listwatch.py:
    bookmarks, read timeout, relist on silence or 410, backoff), over `Pod` with the node's
    field selector.

    `watch_timeout`: the shortest server-side watch timeout asked for (each watch asks for a
    random one up to twice that); `read_timeout`: the longest silence tolerated on a watch
    before it is dropped, to be longer than the API server's bookmark gap.
    """

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
        from lightkube.resources.core_v1 import Pod

        self._order = tuple(order)
        super().__init__(
            client_factory,
            Pod,
            self._parse_pod,
            what=f"pods of node {node_name}",
            namespace="*",
            fields={"spec.nodeName": node_name},
            backoff_first=backoff_first,
            backoff_max=backoff_max,
            watch_timeout=watch_timeout,
            read_timeout=read_timeout,
            monotonic=monotonic,
        )

    def _parse_pod(self, obj: Mapping[str, Any]) -> tuple[str, PodMeta]:
        meta = pod_meta(obj, self._order)
        return meta.uid, meta

    def pods(self) -> Mapping[str, PodMeta]:
        """This node's pods by UID (an immutable map, swapped atomically)."""
        return self.items()
