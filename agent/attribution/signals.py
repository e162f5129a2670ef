"""Stage `signals`: the cgroup signals of the pods that hold a GPU (by the kubelet, or
running GPU processes), or of every pod the API lists with --pod-signals-all-pods
(agent/k8s/pod_cgroup_usage.py), and the judge that charges each idle interval to a cause
from the holders' signals (agent/attribution/cause.py).

It runs before the accounts, which charge each interval through the judge. The reader reads
each pod at most once per interval, so scrapes in between cost a lookup and leave the
holders' rates as they were. A reader failure costs the signals only (counted as an
`invalid` input of the stage); the causes are then `unknown`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from gpuscope.agent.attribution.cause import Rates, SignalRates, idle_cause
from gpuscope.agent.attribution.records import GpuHolding, PodRef, PodSignals
from gpuscope.agent.attribution.spec import StageContext, StageSpec
from gpuscope.agent.attribution.state import NO_WORKLOAD, Joined, pod_ref
from gpuscope.agent.net.collector import NET
from gpuscope.agent.runtime.sources import Collection, describe

if TYPE_CHECKING:
    from gpuscope.agent.clock import Clock
    from gpuscope.agent.hostfs import HostFs
    from gpuscope.agent.k8s.pod_cgroup_usage import PodCgroupReader, PodCgroupUsage


class Signals:
    def __init__(
        self,
        reader: PodCgroupReader | None,
        *,
        all_pods: bool,
        thresholds: tuple[float, float],
        clock: Clock,
        fs: HostFs,
    ) -> None:
        self.reader = reader  # None: no per-pod cgroup signals
        self.all_pods = all_pods
        self._rates = SignalRates()  # the GPU holders' signals as rates, for the causes
        self._thresholds = thresholds  # pressure, retransmits per second
        self._clock = clock
        self._fs = fs

    def __call__(self, collection: Collection, state: Joined) -> None:
        by_uid, by_name = state.by_uid, state.by_name
        holdings = state.holdings or ()
        holder_uids = {m.uid for h in holdings if (m := by_name.get((h.namespace, h.pod)))}
        read: Mapping[str, PodCgroupUsage] = {}
        if self.reader is not None:
            if self.all_pods:
                uids = set(by_uid)
            else:
                uids = {u.pod.uid for u in state.usage if u.pod.uid} | holder_uids
            try:
                read = self.reader.read(uids)
            except Exception as exc:  # noqa: BLE001 - a reader bug costs these signals only
                self._fs.note("pod cgroups", "invalid", f"pod cgroup signals: {describe(exc)}")
        net = collection.records(NET)
        self._rates.update(holder_uids, read, net, self._clock.monotonic())
        rates, thresholds = self._rates, self._thresholds

        def judge(holders: Sequence[GpuHolding]) -> str:
            names = sorted({(h.namespace, h.pod) for h in holders})
            found = [by_name.get(n) for n in names]
            return idle_cause(
                (rates.of(m.uid) if m is not None else Rates() for m in found), *thresholds
            )

        state.judge = judge
        state.pod_signals = tuple(
            PodSignals(
                pod_ref(by_uid[uid]) if uid in by_uid else PodRef(uid, "", "", NO_WORKLOAD),
                read[uid],
            )
            for uid in sorted(read)
        )


def _build(ctx: StageContext) -> Signals:
    opts = ctx.options
    return Signals(
        ctx.pod_signals,
        all_pods=opts.pod_signals_all_pods,
        thresholds=(opts.idle_cause_pressure_threshold, opts.idle_cause_retransmit_threshold),
        clock=ctx.clock,
        fs=ctx.fs,
    )


SIGNALS = StageSpec(
    name="signals",
    summary="The cgroup signals of the pods that hold or use a GPU (or of every pod), and "
    "the judge of idle causes from the holders' signals and TCP retransmits.",
    sources=(NET,),
    reads=("by_uid", "by_name", "holdings", "usage"),
    adds=("pod_signals", "judge"),
    build=_build,
)
