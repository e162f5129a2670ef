"""Stage `accounts`: per GPU and per MIG device, whether it is allocated, how long it has
sat idle and how much memory runs outside its allocation; per workload, the idle and
low-activity GPU-seconds and their causes.

MIG devices are accounted as devices of their own, keyed by MIG UUID, with GPM's idle time
of their GPU instance and their share of the GPU (agent/attribution/mig.py); the idle and
low-activity accountants (agent/attribution/idle.py, activity.py) keep the counters, and
charge each interval to a cause through stage `signals`' judge. Without the kubelet nothing
is figured: the accountants forget their baselines rather than guess who held a GPU
meanwhile, and the counters are not exported.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

from gpuscope.agent.attribution import mig
from gpuscope.agent.attribution.activity import ActivityInput, LowActivityAccountant
from gpuscope.agent.attribution.idle import GpuIdleInput, IdleAccountant, Judge
from gpuscope.agent.attribution.records import GpuHolding, GpuStatus, MigStatus, PodGpuUsage
from gpuscope.agent.attribution.spec import StageContext, StageSpec
from gpuscope.agent.attribution.state import Joined, WorkloadsKept
from gpuscope.agent.clock import Clock
from gpuscope.agent.gpu.collector import GPU
from gpuscope.agent.gpu.records import GpuReading
from gpuscope.agent.runtime.sources import Collection


class Accounts:
    def __init__(self, idle: IdleAccountant, low: LowActivityAccountant, clock: Clock) -> None:
        self.idle = idle
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
        gpu = collection.records(GPU)
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
        readings: Sequence[GpuReading],
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
        devices = {m.mig_uuid: (r, m) for r in readings for m in r.mig_instances}
        by_device: dict[str, list[GpuHolding]] = dict(holders)
        for h in (h for hs in holders.values() for h in hs if h.mig_uuid):
            by_device.setdefault(h.mig_uuid, []).append(h)
        weight = {u: w for r in readings if r.mig_instances for u, w in mig.shares(r).items()}
        last_active = self.mig_active.update({u: m for u, (_, m) in devices.items()}, now)
        mig_inputs = [
            GpuIdleInput(
                u,
                m.integrals.idle_seconds if m.integrals is not None else None,
                last_active.get(u),
                weight.get(u, 0.0),
            )
            for u, (_, m) in devices.items()
        ]
        gpu_inputs = [
            GpuIdleInput(r.identity.uuid, r.idle_seconds, r.last_active_timestamp) for r in readings
        ]
        gauges = self.idle.evaluate(
            [*gpu_inputs, *mig_inputs], by_device, now=now, monotonic=monotonic, judge=judge
        )
        self.low.evaluate(
            [
                *(
                    ActivityInput(r.identity.uuid, r.busy_seconds, r.sm_active_seconds)
                    for r in readings
                    if not r.mig_instances
                ),
                *(
                    ActivityInput(
                        u, m.integrals.busy_seconds, m.integrals.sm_active_seconds, weight[u]
                    )
                    for u, (_, m) in devices.items()
                    if m.integrals is not None
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
            for u, (r, m) in devices.items()
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
    )


ACCOUNTS = StageSpec(
    name="accounts",
    summary="Per GPU and MIG device: allocated, idle, unallocated memory; per workload: "
    "idle and low-activity GPU-seconds, each charged to a cause.",
    sources=(GPU,),
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
