"""The `kubelet` source: who holds each device, from the kubelet's PodResources API.

Polled every `--kubelet-interval` seconds on a thread of its own, so a scrape never waits on
the kubelet and pod churn is seen within one interval whatever the scrape interval; a
collection that finds the last answer too old (the thread stalled, or tests without the
thread) polls on demand. A failed poll makes the source fail (`collector_success` 0): the
attribution stage then skips what depends on it and the device series carry on.

The answer is bounded (`MAX_ANSWER_BYTES`), because its cost in memory is not: a 16.4 MB
List answer once took the agent from 146 to 332 MB of RSS, over the DaemonSet's 320 Mi
limit, and left it at 230 MB. gRPC refuses a larger answer before parsing it, which is one
clear failure of this collector ("answer of N bytes is over the client's limit ..."); and
after each poll the memory of the previous answer is handed back to the system
(`release_memory`), since glibc keeps freed heap pages otherwise.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import gc
import logging
import threading
from collections.abc import Callable
from pathlib import Path

from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.k8s.podresources.client import PodResourcesClient
from gpuscope.agent.k8s.podresources.records import KubeletSnapshot
from gpuscope.agent.runtime.sources import SourceUnavailable

log = logging.getLogger("gpuscope.k8s.kubelet")

# A List answer is about 100 bytes per container plus 2 per exclusive CPU id: tens of KB on
# a dense GPU node, a few hundred KB for 250 pods with every CPU pinned. Parsing costs about
# ten times the answer's size at its peak (measured: 16.4 MB of answer, +164 MB of RSS), so
# 4 MiB (gRPC's own default) keeps a worst case near +45 MB over a ~150 MB agent, well
# inside the 320 Mi limit, while leaving ten times the largest real answer.
MAX_ANSWER_BYTES = 4 * 1024 * 1024


@functools.cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None where the C library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError, TypeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


def release_memory(*, collect_cycles: bool = False) -> None:
    """Give the memory a dropped answer took back to the system.

    The parsed records (tuples of frozen dataclasses) go by reference counting, but glibc
    keeps the freed heap, and gRPC's per-thread arenas, until `malloc_trim(0)` returns it
    (~0.1 ms). `collect_cycles` also runs `gc.collect` (tens of ms on a loaded node, with
    the GIL held), for a failure: an exception and its traceback form cycles that may hold
    the refused call's buffers.
    """
    if collect_cycles:
        gc.collect()
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


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
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self.client = PodResourcesClient(
            socket_path, timeout=timeout, max_message_bytes=max_answer_bytes
        )
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
            previous_error = self._error
            try:
                pods = self.client.list()
            except SourceUnavailable as exc:
                self._error = str(exc)
                self._latest = None
                # A new failure (the answer refused as too large, say): sweep up after it
                # once, not on every poll of a kubelet that stays down.
                release_memory(collect_cycles=self._error != previous_error)
                return None
            self._error = None
            self._latest = KubeletSnapshot(pods=pods, polled_at=self._clock.monotonic())
            del pods  # the snapshot holds the answer; the previous one is gone
            release_memory()
            return self._latest

    def read(self) -> KubeletSnapshot:
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
