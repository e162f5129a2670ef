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
nothing and its workloads get no series (absent, not 0); a workload's counter outlives its
last allocation by the idle counters' retention. Each workload's share is also charged to
one cause (agent/attribution/cause.py), as idle seconds are.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuscope.agent.attribution.cause import UNKNOWN, CauseTotals
from gpuscope.agent.attribution.idle import RETENTION_SECONDS, Judge, by_workload
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
        retention: float = RETENTION_SECONDS,
    ) -> None:
        self._busy_threshold = busy_threshold
        self._sm_threshold = sm_threshold
        self._retention = retention
        self._baseline: dict[str, tuple[float, float, float]] = {}  # at, busy, sm
        self._totals: dict[IdleKey, float] = {}
        self._last_held: dict[IdleKey, float] = {}
        self._causes = CauseTotals()

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
        for d in devices:
            holders = holdings.get(d.key, [])
            if not holders or d.busy_seconds is None or d.sm_active_seconds is None:
                self._baseline.pop(d.key, None)
                continue
            workloads = by_workload(holders)
            for w in workloads:
                self._last_held[w] = monotonic
                self._totals.setdefault(w, 0.0)
                self._causes.hold(w)
            previous = self._baseline.get(d.key)
            self._baseline[d.key] = (monotonic, d.busy_seconds, d.sm_active_seconds)
            if previous is None or monotonic <= previous[0]:
                continue
            elapsed = monotonic - previous[0]
            busy = (d.busy_seconds - previous[1]) / elapsed
            sm = (d.sm_active_seconds - previous[2]) / elapsed
            if busy >= self._busy_threshold and 0 <= sm < self._sm_threshold:
                share = elapsed * d.weight / len(workloads)
                for w, theirs in workloads.items():
                    self._totals[w] += share
                    self._causes.charge(w, judge(theirs) if judge else UNKNOWN, share)
        for w, held in list(self._last_held.items()):
            if monotonic - held > self._retention:
                del self._last_held[w]
                self._totals.pop(w, None)
                self._causes.drop(w)

    def totals(self) -> dict[IdleKey, float]:
        return dict(self._totals)

    def cause_totals(self) -> dict[CauseKey, float]:
        """The totals by cause: summed over the causes, a workload's are its total."""
        return self._causes.totals()
