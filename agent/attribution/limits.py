"""Stage `limits`: what --max-workloads left out, counted for
`gpuscope_series_dropped_total{reason="workload_limit"}` and said in the log once when the
workloads pass the limit and once when they are well under it again (90%), never once per
evaluation (agent/attribution/retention.py says what is left out and why).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from gpuscope.agent.attribution.records import WORKLOAD_LIMIT
from gpuscope.agent.attribution.spec import StageContext, StageSpec

if TYPE_CHECKING:
    from gpuscope.agent.attribution.state import Joined, WorkloadsKept
    from gpuscope.agent.runtime.sources import Collection

log = logging.getLogger("gpuscope.attribution")


class WorkloadLimit:
    def __init__(self) -> None:
        self._over = False  # past --max-workloads, until back under 90% of it
        self._dropped = 0  # series left out since the start, as of the last evaluation

    def __call__(self, collection: Collection, state: Joined) -> None:
        if state.workloads is not None:
            self._say(state.workloads)
        state.series_dropped = {WORKLOAD_LIMIT: self._dropped}

    def _say(self, now: WorkloadsKept) -> None:
        if now.dropped_series > self._dropped and not self._over:
            log.warning(
                "more than --max-workloads %d workloads held a GPU within --workload-prune-grace: "
                "the counters of those that held none for longest are dropped early, and "
                "holders without a place are not counted (gpuscope_series_dropped_total"
                '{reason="workload_limit"})',
                now.limit,
            )
            self._over = True
        elif self._over and now.kept < 0.9 * now.limit:
            log.info("%d workloads kept, within --max-workloads %d again", now.kept, now.limit)
            self._over = False
        self._dropped = now.dropped_series


def _build(_: StageContext) -> WorkloadLimit:
    return WorkloadLimit()


LIMITS = StageSpec(
    name="limits",
    summary="The per-workload series --max-workloads left out; a log line as the node "
    "passes the limit and as it is back under it.",
    sources=(),
    reads=("workloads",),
    adds=("series_dropped",),
    build=_build,
)
