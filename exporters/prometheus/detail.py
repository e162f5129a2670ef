"""Which metrics a scrape serves: the detail level and the include/exclude filters.

At cluster scale the cost of a node agent is its series. Most of a healthy GPU's detail is
constant (18 NVLinks up, 66 NVLink error counters at 0, nine throttle flags at 0), so the
default level serves per-GPU summaries and only the exceptions (a link down or erroring,
a reason that holds the clocks down), and `--metrics-detail=full` serves every series, as
before. Each family declares what the default level serves of it (`MetricSpec.at_default`:
all, some, none); a renderer asks `Families.full(name)` whether to render every series of a
"some" family.

The filters work as node_exporter's collector filters do, on metric names (full match, RE2
syntax as in Prometheus's relabelling: agent/name_patterns.py says why not Python's `re`):
`--metrics-include` serves every series of the families it matches at any level, and
`--metrics-exclude` removes families whatever else says (it wins). The agent's own health
series (`gpuscope_collector_*`, `gpuscope_build_info`) cannot be excluded: a scrape must
always say whether its collectors worked.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from gpuscope.agent.name_patterns import NamePattern, compile_name_pattern

if TYPE_CHECKING:
    from gpuscope.exporters.prometheus.spec import AtDefault, MetricSpec

Mode = Literal["full", "some", "off"]

LEVELS = ("default", "full")
PROTECTED = re.compile(r"gpuscope_collector_.*|gpuscope_build_info")


@dataclass(frozen=True, slots=True)
class MetricSelection:
    """What to serve. The default instance serves everything (renderer tests, tools); the
    agent builds its own from the flags (`from_flags`)."""

    full: bool = True
    include: NamePattern | None = None
    exclude: NamePattern | None = None

    @classmethod
    def from_flags(
        cls, level: str, include: str = "", exclude: str = "", *, also_include: str = ""
    ) -> MetricSelection:
        """`also_include`: a pattern a renderer option implies (--nvlink-per-link)."""
        if level not in LEVELS:
            raise ValueError(f"unknown detail level {level!r}")
        patterns = [p for p in (include, also_include) if p]
        return cls(
            full=level == "full",
            include=(
                compile_name_pattern("|".join(f"(?:{p})" for p in patterns)) if patterns else None
            ),
            exclude=compile_name_pattern(exclude) if exclude else None,
        )

    def mode(self, spec: MetricSpec) -> Mode:
        excluded = self.exclude is not None and self.exclude.fullmatch(spec.name)
        if excluded and not PROTECTED.fullmatch(spec.name):
            return "off"
        if self.full or (self.include is not None and self.include.fullmatch(spec.name)):
            return "full"
        return _AT_DEFAULT[spec.at_default]


_AT_DEFAULT: Mapping[AtDefault, Mode] = {"all": "full", "some": "some", "none": "off"}
EVERYTHING = MetricSelection()
