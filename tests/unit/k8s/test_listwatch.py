"""The generic list + watch cache: what it logs while it stops."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from gpuscope.agent.k8s.listwatch import ListWatch


class _ClosingClient:
    """A client whose list blocks until released, then fails the way a connection that the
    API server (or the test double) closes does."""

    def __init__(self, listing: threading.Event, release: threading.Event) -> None:
        self._listing = listing
        self._release = release
        self.closed = False

    def list(self, *_args: Any, **_kwargs: Any) -> Any:
        self._listing.set()
        self._release.wait(5)
        raise ConnectionError("peer closed connection without sending complete message body")

    def close(self) -> None:
        self.closed = True


def test_a_watch_that_is_stopping_does_not_log_the_connection_closing_under_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Shutting down closes the connection a watch is blocked on: that is no warning (and a
    watch whose thread outlives stop() must not log into whatever runs next)."""
    caplog.set_level(logging.DEBUG, logger="gpuscope.k8s.listwatch")
    listing, release = threading.Event(), threading.Event()
    client = _ClosingClient(listing, release)
    cache: ListWatch[str, str] = ListWatch(
        lambda: client, object, lambda obj: ("k", None), what="pods of node n1"
    )
    cache.start()
    assert listing.wait(5)
    cache.stop(timeout=0.01)  # returns while the list is still blocked
    release.set()
    thread = next(t for t in threading.enumerate() if t.name == "watch-pods of node n1")
    thread.join(5)
    assert not thread.is_alive()
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO] == []
    assert client.closed
    assert cache.error is None


def test_a_watch_that_fails_while_running_says_so_once(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="gpuscope.k8s.listwatch")
    release = threading.Event()
    release.set()
    client = _ClosingClient(threading.Event(), release)
    cache: ListWatch[str, str] = ListWatch(
        lambda: client, object, lambda obj: ("k", None), what="pods of node n1",
        backoff_first=0.01, backoff_max=0.02,
    )  # fmt: skip
    cache.start()
    try:
        assert cache.attempted.wait(5)
        for _ in range(100):
            if client.closed:
                break
            threading.Event().wait(0.01)
    finally:
        cache.stop()
    assert cache.error is not None and "peer closed connection" in cache.error
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1 and warnings[0].startswith("watching pods of node n1: "), warnings
