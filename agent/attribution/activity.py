"""Busy on paper, idle in fact: allocated GPU-seconds whose NVML utilization was high while
the SMs did little.

NVML's utilization is "a kernel was running": one tiny kernel in a loop reads 100 %. GPM's
SM activity (Hopper and later) says how many SMs worked. Each evaluation takes, per
allocated GPU with GPM, the sampler's integrals since the previous evaluation: busy seconds
(NVML; on a MIG device its GPU instance's graphics-engine activity) and SM-active seconds,
both exact over the interval whatever the sampler tick. When the interval's mean busy ratio
is at or above --low-activity-busy-threshold and its mean SM activity below
--low-activity-sm-threshold, the whole interval counts, split equally between the GPU's
workloads (as idle seconds are) and weighted by the MIG device's share of its GPU.

The interval is the evaluation's (about the scrape interval), not the sampler tick: a GPU
that alternates within one interval is judged on its averages. A GPU without GPM counts
nothing and its workloads get no series (absent, not 0); a workload's counter is kept as the
idle counters are (--workload-prune-grace, --max-workloads: agent/attribution/retention.py).
Each workload's share is also charged to
one cause (agent/attribution/cause.py), as idle seconds are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscope.agent.attribution.cause import UNKNOWN
from gpuscope.agent.attribution.idle import Judge, WorkloadCounters, by_workload, idle_key
from gpuscope.agent.attribution.retention import DEFAULT_GRACE, DEFAULT_MAX_WORKLOADS

if TYPE_CHECKING:
    from gpuscope.agent.attribution.records import CauseKey, GpuHolding, IdleKey

DEFAULT_BUSY_THRESHOLD = 0.5
DEFAULT_SM_THRESHOLD = 0.1


@dataclass(frozen=True, slots=True)
class ActivityInput:
    """One allocatable device's integrals: a GPU (`key` its UUID) or a MIG device (its MIG
    UUID), with its share of the GPU."""

    key: str
    busy_seconds: float | None
    sm_active_seconds: float | None
    weight: float = 1.0


class LowActivityAccountant:
    def __init__(
        self,
        busy_threshold: float = DEFAULT_BUSY_THRESHOLD,
        sm_threshold: float = DEFAULT_SM_THRESHOLD,
        grace: float = DEFAULT_GRACE,
        max_workloads: int = DEFAULT_MAX_WORKLOADS,
    ) -> None:
        self._busy_threshold = busy_threshold
        self._sm_threshold = sm_threshold
        self._baseline: dict[str, tuple[float, float, float]] = {}  # at, busy, sm
        self._counters = WorkloadCounters(grace, max_workloads)

    @property
    def dropped_series(self) -> int:
        """Series left out because more than --max-workloads workloads needed a place."""
        return self._counters.dropped_series

    def forget_baselines(self) -> None:
        """Allocations are unknown (kubelet down): count nothing until they are known."""
        self._baseline.clear()

    def evaluate(
        self,
        devices: Iterable[ActivityInput],
        holdings: Mapping[str, list[GpuHolding]],
        *,
        monotonic: float,
        judge: Judge | None = None,
    ) -> None:
        measured: list[tuple[ActivityInput, float, float, list[GpuHolding]]] = []
        for d in devices:
            holders = holdings.get(d.key, [])
            if not holders or d.busy_seconds is None or d.sm_active_seconds is None:
                self._baseline.pop(d.key, None)
            else:
                measured.append((d, d.busy_seconds, d.sm_active_seconds, holders))
        # Only the holders of measured devices have (or keep) a series: a GPU without GPM
        # gives its workloads none.
        kept = self._counters.hold((idle_key(h) for *_, hs in measured for h in hs), monotonic)
        for d, busy_seconds, sm_seconds, holders in measured:
            workloads = by_workload(holders)
            previous = self._baseline.get(d.key)
            self._baseline[d.key] = (monotonic, busy_seconds, sm_seconds)
            if previous is None or monotonic <= previous[0]:
                continue
            elapsed = monotonic - previous[0]
            busy = (busy_seconds - previous[1]) / elapsed
            sm = (sm_seconds - previous[2]) / elapsed
            if busy >= self._busy_threshold and 0 <= sm < self._sm_threshold:
                share = elapsed * d.weight / len(workloads)
                for w, theirs in workloads.items():
                    if w in kept:  # one left without a place hands its share to nobody
                        self._counters.charge(w, judge(theirs) if judge else UNKNOWN, share)

    def totals(self) -> dict[IdleKey, float]:
        return self._counters.totals()

    def cause_totals(self) -> dict[CauseKey, float]:
        """The totals by cause: summed over the causes, a workload's are its total."""
        return self._counters.cause_totals()
