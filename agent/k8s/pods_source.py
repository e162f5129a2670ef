"""The `pods` source: this node's pods and their workloads, from the Kubernetes API.

A thin source over `PodWatcher` (list + watch on its own thread). While the API server is
unreachable the watcher keeps the last pods it knew and this source reports failure, so
`collector_success{collector="pods"}` shows the outage while series keep their names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpuscope.agent.k8s.pods import PodWatcher
from gpuscope.agent.k8s.records import PodsSnapshot
from gpuscope.agent.k8s.workloads import DEFAULT_ORDER
from gpuscope.agent.sources import SourceStale, SourceUnavailable


class PodsSource:
    name = "pods"

    def __init__(
        self,
        client_factory: Callable[[], Any],
        node_name: str,
        *,
        order: Sequence[str] = DEFAULT_ORDER,
        sync_timeout: float = 5.0,
    ) -> None:
        self.watcher = PodWatcher(client_factory, node_name, order=order)
        self._sync_timeout = sync_timeout
        self._started = False

    def start(self) -> None:
        if not self._started:
            self.watcher.start()
            self._started = True
        # Give the first list a moment so the first scrape already has names; an API server
        # that fails or does not answer is reported by collect, and the watcher keeps trying.
        self.watcher.attempted.wait(self._sync_timeout)

    def collect(self) -> PodsSnapshot:
        if not self.watcher.synced.is_set():
            raise SourceUnavailable(
                f"no pod list from the Kubernetes API yet: {self.watcher.error or 'waiting'}"
            )
        snapshot = PodsSnapshot(pods=self.watcher.pods())
        if self.watcher.error is not None:
            raise SourceStale(f"Kubernetes API: {self.watcher.error}", snapshot)
        return snapshot

    def stop(self) -> None:
        if self._started:
            self.watcher.stop()
            self._started = False
