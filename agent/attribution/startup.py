"""Start-up time: from a pod's scheduling to the first GPU activity of its processes, which
covers image pulls, data staging and initialisation (gpuscope_pod_gpu_startup_seconds).

Scheduling is the pod's `PodScheduled` condition's `lastTransitionTime` (the Kubernetes API,
agent/k8s/pods.py). First GPU activity is the first attribution evaluation at which one of
the pod's processes on a GPU has nonzero SM utilization (NVML's per-process samples since
the previous read), or, where per-process utilization is unknown (MIG), its device's
activity is nonzero (the GPU instance's GPM graphics-engine activity; a whole GPU's
utilization). Activity is followed by pod UID from the processes' cgroups, so a pod the API
names late still gets the moment it was first active.

Precise to one evaluation (about a scrape interval): activity is seen at the evaluation
after it began. Never a guess: a pod scheduled before the agent's watch began (the first
evaluation with GPU records, and again after any evaluation without them) may have been
active unseen, so its start-up is not known and it has no series, and neither has a pod
already active when the agent first saw it (the same case). Control-plane and node clocks are
taken to agree (NTP); a negative difference from a skew reads 0. A known start-up is kept
while the pod is in the pods list and forgotten when it leaves.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING

from gpuscope.agent.attribution.devices import ACCELERATORS, devices
from gpuscope.agent.attribution.records import PodStartup
from gpuscope.agent.attribution.spec import StageContext, StageSpec
from gpuscope.agent.attribution.state import Joined, pod_ref

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import AnyAccelerators
    from gpuscope.agent.clock import Clock
    from gpuscope.agent.k8s.records import PodMeta
    from gpuscope.agent.runtime import sources


class StartupTracker:
    def __init__(self) -> None:
        self._watch_from: float | None = None  # wall time the current watch began
        # pod UID -> (evaluation it was first active, when the watch then in effect began)
        self._first_active: dict[str, tuple[float, float]] = {}
        self._known: dict[str, float] = {}  # pod UID -> start-up seconds

    def blind(self) -> None:
        """An evaluation without GPU records: activity meanwhile is unseen, so pods
        scheduled before the next evaluation with them cannot be judged."""
        self._watch_from = None

    def evaluate(
        self, active: Collection[str], pods: Mapping[str, PodMeta], now: float
    ) -> dict[str, float]:
        """`active`: UIDs of pods with GPU activity at this evaluation; `pods`: the pods
        list. Returns the known start-ups by pod UID."""
        if self._watch_from is None:
            self._watch_from = now
        for uid in active:
            self._first_active.setdefault(uid, (now, self._watch_from))
        # Bounded by the pods on the node: a UID the pods list lacks is kept only while its
        # processes run (the API may name it late).
        self._first_active = {
            u: t for u, t in self._first_active.items() if u in pods or u in active
        }
        self._known = {u: s for u, s in self._known.items() if u in pods}
        for uid, (first, watched_from) in self._first_active.items():
            meta = pods.get(uid)
            if uid in self._known or meta is None or meta.scheduled_at is None:
                continue
            if meta.scheduled_at < watched_from:
                continue  # it may have run before the agent could see: not known
            self._known[uid] = max(0.0, first - meta.scheduled_at)
        return dict(self._known)


class Startups:
    """Stage `startups`: the tracker fed with the pods active now. An evaluation without GPU
    records blinds it (activity meanwhile is unseen)."""

    def __init__(
        self, clock: Clock, accelerators: Sequence[sources.Keyed[AnyAccelerators]] | None
    ) -> None:
        self.tracker = StartupTracker()
        self._clock = clock
        self._accelerators = accelerators

    def __call__(self, collection: sources.Collection, state: Joined) -> None:
        if devices(collection, self._accelerators) is None:
            self.tracker.blind()
            state.startups = ()
            return
        by_uid = state.by_uid
        known = self.tracker.evaluate(state.active, by_uid, self._clock.time())
        state.startups = tuple(PodStartup(pod_ref(by_uid[u]), s) for u, s in sorted(known.items()))


def _build(ctx: StageContext) -> Startups:
    return Startups(ctx.clock, ctx.accelerators)


STARTUPS = StageSpec(
    name="startups",
    summary="Seconds from each pod's scheduling to its first GPU activity, where known.",
    sources=(ACCELERATORS,),
    reads=("by_uid", "active"),
    adds=("startups",),
    build=_build,
)
