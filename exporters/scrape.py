"""What one scrape renders: the sources' collection, the attribution stage's result and the
agent's own process figures. Built by `Agent.scrape` (agent/app/agent.py), read by every
exporter: the exporters define what they are handed."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuscope.agent.attribution.records import Attribution
    from gpuscope.agent.runtime.self_stats import ProcessStats
    from gpuscope.agent.runtime.sources import Collection, SourceResult

ATTRIBUTION_STAGE = "attribution"  # its status is exported as collector="attribution"


@dataclass(frozen=True, slots=True)
class Scrape:
    """`attribution` is None where the stage failed or is stuck with nothing good to serve
    (the collectors' series are then rendered without names); `attribution_status` says which,
    like a source's result (None before the first collection)."""

    collection: Collection
    attribution: Attribution | None
    attribution_status: SourceResult[Attribution] | None = None
    process: ProcessStats | None = None
