"""The attribution stage: one collection in, what the joins add to it out.

Runs after the sources on every scrape, serialized by a lock (the accountants keep state
between collections). `Attributor` builds the declared stages (agent/attribution/stages.py)
once and runs them in that order on each collection, handing one `Joined`
(agent/attribution/state.py) from each to the next, then assembles the `Attribution`. Each
join degrades on its own: without the kubelet there are no allocations (and no idle or
unallocated figures) but GPU processes are still attributed through their cgroups; without
the Kubernetes API, series carry `pod_uid` and the last names the API gave.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from gpuscope.agent.attribution.options import AttributionOptions
from gpuscope.agent.attribution.records import Attribution
from gpuscope.agent.attribution.spec import Stage, StageContext
from gpuscope.agent.attribution.stages import STAGES
from gpuscope.agent.attribution.state import Joined
from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.hostfs import HostFs, Reason
from gpuscope.agent.k8s.podresources.gpus import DEFAULT_GPU_RESOURCES

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import AnyAccelerators
    from gpuscope.agent.attribution.idle import IdleAccountant
    from gpuscope.agent.k8s.pod_cgroup_usage import PodCgroupReader
    from gpuscope.agent.runtime.sources import Collection, Keyed

log = logging.getLogger("gpuscope.attribution")


class Attributor:
    """The stages of `STAGES`, built once with what they share, run in order under a lock."""

    def __init__(
        self,
        procfs: Path = Path("/proc"),
        *,
        gpu_resource_names: Sequence[str] = DEFAULT_GPU_RESOURCES,
        clock: Clock | None = None,
        idle: IdleAccountant | None = None,
        options: AttributionOptions | None = None,
        pod_signals: PodCgroupReader | None = None,
        accelerators: Sequence[Keyed[AnyAccelerators]] | None = None,
    ) -> None:
        """`accelerators`: the collectors whose devices are attributed (the app passes the
        enabled ones of role ACCELERATOR); None: every result with accelerator records."""
        self.context = StageContext(
            procfs=procfs,
            gpu_resource_names=tuple(gpu_resource_names),
            options=options or AttributionOptions(),
            clock=clock or SystemClock(),
            pod_signals=pod_signals,
            fs=HostFs("attribution", logger=log),
            idle=idle,
            accelerators=accelerators,
        )
        # Built once, so that what a stage keeps lasts from one collection to the next.
        self.stages: dict[str, Stage] = {s.name: s.build(self.context) for s in STAGES}
        self._order = tuple(self.stages.values())
        self._lock = threading.Lock()

    def attribute(self, collection: Collection) -> Attribution:
        """What the joins add to `collection`; the sources' records are left as they are."""
        with self._lock:
            state = Joined()
            for stage in self._order:
                stage(collection, state)
            return _assemble(state, self._dropped())

    def _dropped(self) -> dict[Reason, int]:
        """The inputs the stages left out since the start, by reason: GPU processes' and
        pods' cgroup files. Counted where they are read (the stages' shared `HostFs` and the
        pod cgroup reader's), not joined: no stage adds them."""
        counts = dict(self.context.fs.counts())
        reader = self.context.pod_signals
        if reader is not None:
            for reason, n in reader.fs.counts().items():
                counts[reason] = counts.get(reason, 0) + n
        return counts


def _assemble(s: Joined, dropped: dict[Reason, int]) -> Attribution:
    """The record a scrape renders, from the fields of `Joined` that `Attribution` has."""
    return Attribution(
        holdings=s.holdings or (),
        gpus=s.gpus,
        usage=s.usage,
        pods=s.pods,
        idle_seconds_total=s.idle_seconds_total,
        migs=s.migs,
        low_activity_seconds_total=s.low_activity_seconds_total,
        energy=s.energy,
        pod_names=s.pod_names,
        dropped=dropped,
        pod_signals=s.pod_signals,
        idle_cause_seconds_total=s.idle_cause_seconds_total,
        low_activity_cause_seconds_total=s.low_activity_cause_seconds_total,
        startups=s.startups,
        series_dropped=s.series_dropped,
    )
