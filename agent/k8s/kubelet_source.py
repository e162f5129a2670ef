"""The `kubelet` source: who holds each device, from the kubelet's PodResources API.

Polled every `--kubelet-interval` seconds on a thread of its own, so a scrape never waits on
the kubelet and pod churn is seen within one interval whatever the scrape interval; a
collection that finds the last answer too old (the thread stalled, or tests without the
thread) polls on demand. A failed poll makes the source fail (`collector_success` 0): the
attribution stage then skips what depends on it and the device series carry on.
"""

from __future__ import annotations

import threading
from pathlib import Path

from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.k8s.podresources.client import PodResourcesClient
from gpuscope.agent.k8s.podresources.records import KubeletSnapshot
from gpuscope.agent.sources import SourceUnavailable


class KubeletSource:
    name = "kubelet"

    def __init__(
        self,
        socket_path: Path,
        *,
        interval: float = 10.0,
        clock: Clock | None = None,
        background: bool = True,
        timeout: float = 5.0,
    ) -> None:
        self.client = PodResourcesClient(socket_path, timeout=timeout)
        self.interval = interval
        self._clock = clock or SystemClock()
        self._background = background
        self._lock = threading.Lock()
        self._latest: KubeletSnapshot | None = None
        self._error: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        # A kubelet that is down at start is not a start failure: the poller keeps trying
        # every interval (recovery within one poll), and collections report the error.
        self.poll()
        if self._background:
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="kubelet-poll", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self) -> KubeletSnapshot | None:
        """Ask the kubelet now; returns the answer, or None (and remembers why) on failure."""
        with self._lock:
            try:
                pods = self.client.list()
            except SourceUnavailable as exc:
                self._error = str(exc)
                self._latest = None
                return None
            self._error = None
            self._latest = KubeletSnapshot(pods=pods, polled_at=self._clock.monotonic())
            return self._latest

    def collect(self) -> KubeletSnapshot:
        latest, error = self._latest, self._error
        stale = (
            latest is None
            or not self._background
            or self._clock.monotonic() - latest.polled_at > 2 * self.interval
        )
        if stale and (error is None or not self._background):
            latest = self.poll()
            error = self._error
        if latest is None:
            raise SourceUnavailable(error or "no answer from the kubelet yet")
        return latest

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
            self._thread = None
        self.client.close()
