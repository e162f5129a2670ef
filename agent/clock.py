"""Time sources.

Everything that integrates over time (the GPU sampler, later the idle accounting) takes a
`Clock` instead of calling `time` directly, so tests can simulate minutes in milliseconds and
get exact, repeatable answers.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    def time(self) -> float:
        """Wall-clock seconds since the epoch (what timestamps in metrics are)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a clock that never goes backwards (what intervals are measured on)."""
        ...


class SystemClock:
    def time(self) -> float:
        return time.time()

    def monotonic(self) -> float:
        return time.monotonic()


class ManualClock:
    """A clock that moves only when told to; wall and monotonic time advance together."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self._now = start
        self._lock = threading.Lock()

    def time(self) -> float:
        with self._lock:
            return self._now

    def monotonic(self) -> float:
        return self.time()

    def advance(self, seconds: float) -> None:
        if seconds < 0:
            raise ValueError("a clock cannot go backwards")
        with self._lock:
            self._now += seconds

    def set(self, now: float) -> None:
        with self._lock:
            self._now = now
