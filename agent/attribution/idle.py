"""Reserved-but-idle accounting: how long each allocated GPU has done nothing, and the
GPU-seconds each workload has held idle.

Idle means the GPU's utilization stayed at or below --idle-threshold, whatever memory its
holder keeps allocated: a GPU whose memory is held while no kernel runs ("idle-held") is
exactly the waste this measures. Both figures come from the GPU sampler, not from scrapes:

- the gauge is now minus the later of the allocation's start and the sampler's exact last
  active moment, so it is right to within one sampler interval whatever the scrape interval;
- the counter adds the sampler's integral of idle time between two evaluations, so it counts
  exactly the idle GPU-seconds in between, even when the GPU woke up and fell idle again
  between two scrapes (a gauge-difference would lose that).

The allocation's start is when this agent first saw it in the kubelet's answer: within one
kubelet poll of the container's start, or the agent's own start for older allocations (what
happened before the agent ran is not known, so it is not claimed). A GPU shared by several
workloads (time-slicing) splits its idle seconds between them equally, so the counters still
add up to the GPU's idle time. A MIG device counts its GPU instance's idle time (from GPM)
times its share of the GPU: seven idle 1g instances add up to one idle GPU.

Each workload's share of an interval is also charged to one cause (agent/attribution/cause.py),
judged by the stage from that workload's holder pods of the device (`unknown` when the
accountant is given no judge), so the cause counters add up to the workload's counter.

A workload's counters go --workload-prune-grace after it last held a GPU, and at most
--max-workloads are kept (agent/attribution/retention.py). A workload left without a place
gets no share of an interval, and its share is not handed to the others: the counters never
claim more idle time than a GPU had.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from gpuscope.agent.attribution.cause import CAUSES, UNKNOWN, CauseTotals
from gpuscope.agent.attribution.records import CauseKey, GpuHolding, IdleKey
from gpuscope.agent.attribution.retention import (
    DEFAULT_GRACE,
    DEFAULT_MAX_WORKLOADS,
    WorkloadRetention,
)

# The series one workload has in each of the idle and low-activity families: its counter and
# one per cause. What a workload left out (agent/attribution/retention.py) costs.
SERIES_PER_WORKLOAD = 1 + len(CAUSES)


@dataclass(frozen=True, slots=True)
class GpuIdleInput:
    """One device as the idle accountant reads it: a whole GPU, or a MIG device weighted by its
    share of its GPU."""

    uuid: str
    idle_integral: float | None  # the sampler's idle seconds (None: utilization unknown)
    last_active: float | None  # wall time of the last sample above the threshold
    weight: float = 1.0  # the device's share of a GPU (a MIG device's: agent/attribution/mig.py)


# The cause of one interval, from one workload's holders of one device.
Judge = Callable[[Sequence[GpuHolding]], str]


def idle_key(holding: GpuHolding) -> IdleKey:
    return (holding.namespace, holding.workload.kind, holding.workload.name)


def by_workload(holders: Sequence[GpuHolding]) -> dict[IdleKey, list[GpuHolding]]:
    """A device's holders grouped by workload, in the holders' order."""
    out: dict[IdleKey, list[GpuHolding]] = {}
    for h in holders:
        out.setdefault(idle_key(h), []).append(h)
    return out


class WorkloadCounters:
    """Per-workload totals and their causes, kept while `WorkloadRetention` keeps the
    workload: what the idle and the low-activity accountants share."""

    def __init__(self, grace: float, limit: int) -> None:
        self._retention = WorkloadRetention(grace, limit)
        self._totals: dict[IdleKey, float] = {}
        self._causes = CauseTotals()
        self.dropped_series = 0  # series left out for --max-workloads, since the start

    def hold(self, held: Iterable[IdleKey], monotonic: float) -> frozenset[IdleKey]:
        """This evaluation's holders: those not kept (grace over, or evicted) go, those
        kept start at 0 with every cause; returns the workloads that may be charged."""
        admission = self._retention.admit(set(held), monotonic)
        for w in admission.gone:
            self._totals.pop(w, None)
            self._causes.drop(w)
        for w in admission.kept:
            self._totals.setdefault(w, 0.0)
            self._causes.hold(w)
        self.dropped_series += (admission.evicted + admission.refused) * SERIES_PER_WORKLOAD
        return admission.kept

    def charge(self, workload: IdleKey, cause: str, seconds: float) -> None:
        self._totals[workload] += seconds
        self._causes.charge(workload, cause, seconds)

    def __len__(self) -> int:
        return len(self._retention)

    @property
    def limit(self) -> int:
        return self._retention.limit

    def totals(self) -> dict[IdleKey, float]:
        return dict(self._totals)

    def cause_totals(self) -> dict[CauseKey, float]:
        return self._causes.totals()


class IdleAccountant:
    def __init__(
        self, grace: float = DEFAULT_GRACE, max_workloads: int = DEFAULT_MAX_WORKLOADS
    ) -> None:
        self._first_seen: dict[tuple[str, str, str, str], float] = {}  # uuid, ns, pod, ctr
        self._baseline: dict[str, float] = {}  # uuid -> idle integral at the last evaluation
        self._counters = WorkloadCounters(grace, max_workloads)

    @property
    def dropped_series(self) -> int:
        """Series left out because more than --max-workloads workloads needed a place."""
        return self._counters.dropped_series

    @property
    def workloads(self) -> int:
        """Workloads whose counters are kept now."""
        return len(self._counters)

    @property
    def limit(self) -> int:
        """--max-workloads."""
        return self._counters.limit

    def forget_baselines(self) -> None:
        """Allocations are unknown (kubelet down): stop counting rather than guess who held
        a GPU meanwhile. The allocation starts are kept, so a GPU held throughout keeps its
        idle gauge when the kubelet answers again."""
        self._baseline.clear()

    def evaluate(
        self,
        gpus: Iterable[GpuIdleInput],
        holdings: Mapping[str, list[GpuHolding]],
        *,
        now: float,
        monotonic: float,
        judge: Judge | None = None,
    ) -> dict[str, float | None]:
        """Update the counters; return the idle gauge per GPU UUID (0 when unallocated).
        `judge` names the cause each workload's share of an interval is charged to."""
        gauges: dict[str, float | None] = {}
        seen_holders: set[tuple[str, str, str, str]] = set()
        evaluated: set[str] = set()
        gpus = list(gpus)
        kept = self._counters.hold(
            (idle_key(h) for gpu in gpus for h in holdings.get(gpu.uuid, ())), monotonic
        )
        for gpu in gpus:
            evaluated.add(gpu.uuid)
            holders = holdings.get(gpu.uuid, [])
            if not holders:
                self._baseline.pop(gpu.uuid, None)
                gauges[gpu.uuid] = 0.0 if gpu.idle_integral is not None else None
                continue
            keys = [(gpu.uuid, h.namespace, h.pod, h.container) for h in holders]
            for key in keys:
                self._first_seen.setdefault(key, now)
            seen_holders.update(keys)
            start = min(self._first_seen[key] for key in keys)
            workloads = by_workload(holders)
            if gpu.idle_integral is None:
                gauges[gpu.uuid] = None
                continue
            since = max(start, gpu.last_active) if gpu.last_active is not None else start
            gauges[gpu.uuid] = max(0.0, now - since)
            previous = self._baseline.get(gpu.uuid)
            if previous is not None and gpu.idle_integral > previous:
                # Split between every workload on the device, counted or not: a workload
                # left without a place never hands its share to the others.
                share = (gpu.idle_integral - previous) * gpu.weight / len(workloads)
                for w, theirs in workloads.items():
                    if w in kept:
                        self._counters.charge(w, judge(theirs) if judge else UNKNOWN, share)
            self._baseline[gpu.uuid] = gpu.idle_integral
        for key in list(self._first_seen):
            if key[0] in evaluated and key not in seen_holders:
                del self._first_seen[key]
        return gauges

    def totals(self) -> dict[IdleKey, float]:
        return self._counters.totals()

    def cause_totals(self) -> dict[CauseKey, float]:
        """The totals by cause: summed over the causes, a workload's are its total."""
        return self._counters.cause_totals()
