"""The `pods` source: this node's pods and their workloads, from the Kubernetes API.

A thin source over `PodWatcher` (list + watch on its own thread). While the API server is
unreachable the watcher keeps the last pods it knew and this source reports failure, so
`collector_success{collector="pods"}` shows the outage while series keep their names.

An API server that stops talking without closing the watch is not an error the watcher can
see at once, so the source also bounds how old its knowledge may be: when the watcher has
heard nothing from the API server (no list, event or bookmark) for `stale_after` seconds,
collections fail the same way (`SourceStale`: last pods kept, one log line from the runner)
until the watcher, which drops a silent watch and relists, hears from it again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.k8s.pods import PodWatcher
from gpuscope.agent.k8s.records import PodsSnapshot
from gpuscope.agent.k8s.workloads import DEFAULT_ORDER
from gpuscope.agent.runtime.sources import SourceStale, SourceUnavailable


class PodsSource:
    name = "pods"

    def __init__(
        self,
        client_factory: Callable[[], Any],
        node_name: str,
        *,
        order: Sequence[str] = DEFAULT_ORDER,
        sync_timeout: float = 5.0,
        stale_after: float = 90.0,
        read_timeout: float = 75.0,
        clock: Clock | None = None,
        **watcher_options: Any,
    ) -> None:
        """`watcher_options` go to `PodWatcher` (backoffs, the server-side watch timeout)."""
        self._clock = clock or SystemClock()
        self.watcher = PodWatcher(
            client_factory,
            node_name,
            order=order,
            read_timeout=read_timeout,
            monotonic=self._clock.monotonic,
            **watcher_options,
        )
        self._sync_timeout = sync_timeout
        self._stale_after = stale_after
        self._started = False

    def start(self) -> None:
        if not self._started:
            self.watcher.start()
            self._started = True
        # Give the first list a moment so the first scrape already has names; an API server
        # that fails or does not answer is reported by read, and the watcher keeps trying.
        self.watcher.attempted.wait(self._sync_timeout)

    def read(self) -> PodsSnapshot:
        if not self.watcher.synced.is_set():
            raise SourceUnavailable(
                f"no pod list from the Kubernetes API yet: {self.watcher.error or 'waiting'}"
            )
        snapshot = PodsSnapshot(pods=self.watcher.pods())
        trouble = self.watcher.trouble(self._stale_after)
        if trouble is not None:  # the last pods keep their names meanwhile
            raise SourceStale(f"Kubernetes API: {trouble}", snapshot)
        return snapshot

    def stop(self) -> None:
        if self._started:
            self.watcher.stop()
            self._started = False
