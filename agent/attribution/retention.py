"""Which workloads' counters are kept: for how long after their last GPU allocation, and how
many at most.

A workload's idle and low-activity counters (and their causes) are keyed by namespace,
workload kind and name, so a node that runs a stream of short pods, each its own workload,
would otherwise keep a series set for every one it ever saw. Two bounds:

- **--workload-prune-grace** (default 300 s): a workload's counters go that long after the
  last evaluation in which it held a GPU. Long enough for a Job or JobSet that restarts its
  pods (a backoff, scheduling and an image pull, usually within five minutes, Prometheus'
  own lookback) to keep one continuous counter; a workload that comes back after the grace
  starts again at 0, which increase() and rate() read as a counter reset, so no GPU-second is
  counted twice or lost from what Prometheus scraped. The counter stops growing the moment
  the last pod leaves, so the grace costs series, never accuracy, provided it spans at least
  one scrape (the final value is scraped).
- **--max-workloads** (default 256): the most workloads kept at once. When a workload that
  holds a GPU needs a place and none is free, the workload that held a GPU least recently
  (and none now) is dropped before its grace is over; a workload that holds a GPU is never
  dropped for another. If every place is taken by workloads holding GPUs now, the newcomer
  is not counted until one frees. Both are counted as series dropped
  (`gpuscope_series_dropped_total{reason="workload_limit"}`): an early drop once, its
  series; an uncounted holder at every evaluation it is left out.

So the per-workload series are bounded by the churn over the grace, and by the cap whatever
the churn; memory with them.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuscope.agent.attribution.records import IdleKey

DEFAULT_GRACE = 300.0  # seconds: see the module docstring
# Workloads holding GPUs at once on one node are at most GPUs x shares: 8 GPUs of 7 MIG
# devices each (56), or time-sliced 16 ways (128); twice that leaves room for those in grace.
DEFAULT_MAX_WORKLOADS = 256


@dataclass(frozen=True, slots=True)
class Admission:
    """What one evaluation may count: `kept` are this evaluation's holders that have a place;
    `gone` the workloads whose counters must go now (grace over, or `evicted` early for
    room); `refused` the holders left without a place."""

    kept: frozenset[IdleKey]
    gone: tuple[IdleKey, ...]
    evicted: int
    refused: int


class WorkloadRetention:
    """The workloads kept, with the last time (monotonic) each held a GPU."""

    def __init__(self, grace: float = DEFAULT_GRACE, limit: int = DEFAULT_MAX_WORKLOADS) -> None:
        self._grace = grace
        self._limit = limit
        self._last_held: dict[IdleKey, float] = {}

    @property
    def limit(self) -> int:
        return self._limit

    def __len__(self) -> int:
        return len(self._last_held)

    def admit(self, held: Collection[IdleKey], monotonic: float) -> Admission:
        """Mark `held` (the workloads holding a GPU in this evaluation) as held now, after
        dropping those whose grace ran out, and make room for newcomers (module docstring)."""
        gone = [
            w for w, at in self._last_held.items() if w not in held and monotonic - at > self._grace
        ]
        for w in gone:
            del self._last_held[w]
        new = sorted(w for w in held if w not in self._last_held)
        for w in held:
            if w in self._last_held:
                self._last_held[w] = monotonic
        evicted = 0
        short = len(new) - (self._limit - len(self._last_held))
        if short > 0:
            # Least recently held first; ties by name, so the choice is repeatable.
            spare = sorted((at, w) for w, at in self._last_held.items() if w not in held)
            for _, w in spare[:short]:
                del self._last_held[w]
                gone.append(w)
                evicted += 1
        admitted = new[: max(0, self._limit - len(self._last_held))]
        for w in admitted:
            self._last_held[w] = monotonic
        return Admission(
            kept=frozenset(w for w in held if w in self._last_held),
            gone=tuple(gone),
            evicted=evicted,
            refused=len(new) - len(admitted),
        )
