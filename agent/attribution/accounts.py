"""Stage `accounts`: per GPU and per MIG device, whether it is allocated, how long it has
sat idle and how much memory runs outside its allocation; per workload, the idle and
low-activity GPU-seconds and their causes.

Partitions (MIG devices) are accounted as devices of their own, keyed by their UUID, with
their own idle time (NVIDIA: GPM's, of their GPU instance) and their share of the GPU
(agent/accelerators/records.py, `Partition`); the idle and
low-activity accountants (agent/attribution/idle.py, activity.py) keep the counters, and
charge each interval to a cause through stage `signals`' judge. Without the kubelet nothing
is figured: the accountants forget their baselines rather than guess who held a GPU
meanwhile, and the counters are not exported.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gpuscope.agent.attribution import mig
from gpuscope.agent.attribution.activity import ActivityInput, LowActivityAccountant
from gpuscope.agent.attribution.devices import ACCELERATORS, devices
from gpuscope.agent.attribution.idle import GpuIdleInput, IdleAccountant, Judge
from gpuscope.agent.attribution.records import GpuHolding, GpuStatus, MigStatus, PodGpuUsage
from gpuscope.agent.attribution.spec import StageContext, StageSpec
from gpuscope.agent.attribution.state import Joined, WorkloadsKept

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import AnyAccelerators, AnyReading
    from gpuscope.agent.clock import Clock
    from gpuscope.agent.runtime.sources import Collection, Keyed


class Accounts:
    def __init__(
        self,
        idle: IdleAccountant,
        low: LowActivityAccountant,
        clock: Clock,
        accelerators: Sequence[Keyed[AnyAccelerators]] | None,
    ) -> None:
        self.idle = idle
        self._accelerators = accelerators
        self.low = low
        self.mig_active = mig.LastActive()
        self._clock = clock

    def __call__(self, collection: Collection, state: Joined) -> None:
        if state.holdings is None:
            self.idle.forget_baselines()
            self.low.forget_baselines()
            state.gpus, state.migs, state.workloads = (), (), None
            state.idle_seconds_total, state.low_activity_seconds_total = {}, {}
            state.idle_cause_seconds_total, state.low_activity_cause_seconds_total = {}, {}
            return
        gpu = devices(collection, self._accelerators)
        refused = gpu.processes_refused if gpu is not None else frozenset()
        state.gpus, state.migs = self._statuses(
            state.readings, state.holders, state.usage, refused, state.judge
        )
        idle, low = self.idle, self.low
        state.idle_seconds_total = idle.totals()
        state.low_activity_seconds_total = low.totals()
        state.idle_cause_seconds_total = idle.cause_totals()
        state.low_activity_cause_seconds_total = low.cause_totals()
        state.workloads = WorkloadsKept(
            idle.workloads, idle.limit, idle.dropped_series + low.dropped_series
        )

    def _statuses(
        self,
        readings: Sequence[AnyReading],
        holders: Mapping[str, list[GpuHolding]],
        usage: Sequence[PodGpuUsage],
        refused: frozenset[str],
        judge: Judge,
    ) -> tuple[tuple[GpuStatus, ...], tuple[MigStatus, ...]]:
        unallocated: dict[str, int] = defaultdict(int)
        for u in usage:
            if u.memory_bytes is None:
                continue
            held_by = {(h.namespace, h.pod) for h in holders.get(u.uuid, [])}
            if not u.pod.uid:
                unallocated[u.uuid] += u.memory_bytes  # a host process
            elif u.pod.name and (u.pod.namespace, u.pod.name) not in held_by:
                unallocated[u.uuid] += u.memory_bytes  # a pod using a GPU it was not given
            # A pod whose name the API never gave cannot be compared: not counted.
        now, monotonic = self._clock.time(), self._clock.monotonic()
        parts = {p.uuid: (r, p) for r in readings for p in r.partitions}
        # Copies: the lists are extended below and must not be the ones walked (a partition
        # keyed as its GPU once made that loop endless).
        by_device: dict[str, list[GpuHolding]] = {u: list(hs) for u, hs in holders.items()}
        for h in [h for hs in holders.values() for h in hs if h.mig_uuid]:
            held = by_device.setdefault(h.mig_uuid, [])
            if h not in held:
                held.append(h)
        last_active = self.mig_active.update({u: p for u, (_, p) in parts.items()}, now)
        mig_inputs = [
            GpuIdleInput(u, p.idle_seconds, last_active.get(u), p.share)
            for u, (_, p) in parts.items()
        ]
        # A partitioned GPU is accounted by its partitions, as for low activity: its own
        # (device-wide) idle time would charge every partition's holder for the others'.
        gpu_inputs = [
            GpuIdleInput(r.identity.uuid, r.idle_seconds, r.last_active_timestamp)
            for r in readings
            if not r.partitions
        ]
        gauges = self.idle.evaluate(
            [*gpu_inputs, *mig_inputs], by_device, now=now, monotonic=monotonic, judge=judge
        )
        self.low.evaluate(
            [
                *(
                    ActivityInput(r.identity.uuid, r.busy_seconds, r.sm_active_seconds)
                    for r in readings
                    if not r.partitions
                ),
                *(  # partitions whose activity is measured (NVIDIA: GPM of their instance)
                    ActivityInput(u, p.busy_seconds, p.sm_active_seconds, p.share)
                    for u, (_, p) in parts.items()
                    if p.busy_seconds is not None
                ),
            ],
            by_device,
            monotonic=monotonic,
            judge=judge,
        )
        statuses = tuple(
            GpuStatus(
                gpu=r.identity.index,
                uuid=r.identity.uuid,
                allocated=bool(holders.get(r.identity.uuid)),
                unallocated_memory_bytes=(
                    None if r.identity.uuid in refused else unallocated.get(r.identity.uuid, 0)
                ),
                idle_seconds=gauges.get(r.identity.uuid),
            )
            for r in readings
        )
        migs = tuple(
            MigStatus(
                gpu=r.identity.index,
                uuid=r.identity.uuid,
                mig_uuid=u,
                allocated=any(h.mig_uuid == u for h in holders.get(r.identity.uuid, [])),
                idle_seconds=gauges.get(u),
            )
            for u, (r, _) in parts.items()
        )
        return statuses, migs


def _build(ctx: StageContext) -> Accounts:
    opts = ctx.options
    return Accounts(
        ctx.idle or IdleAccountant(opts.workload_prune_grace, opts.max_workloads),
        LowActivityAccountant(
            opts.low_activity_busy_threshold,
            opts.low_activity_sm_threshold,
            opts.workload_prune_grace,
            opts.max_workloads,
        ),
        ctx.clock,
        ctx.accelerators,
    )


ACCOUNTS = StageSpec(
    name="accounts",
    summary="Per GPU and MIG device: allocated, idle, unallocated memory; per workload: "
    "idle and low-activity GPU-seconds, each charged to a cause.",
    sources=(ACCELERATORS,),
    reads=("holdings", "readings", "holders", "usage", "judge"),
    adds=(
        "gpus",
        "migs",
        "idle_seconds_total",
        "low_activity_seconds_total",
        "idle_cause_seconds_total",
        "low_activity_cause_seconds_total",
        "workloads",
    ),
    build=_build,
)
