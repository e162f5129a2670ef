"""The shape of one metric declaration (see catalog.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["gauge", "counter", "histogram"]
# What --metrics-detail=default serves of a family: all its series, some (the exceptions a
# healthy node does not have: links down, reasons that apply; the note says which) or none.
# --metrics-detail=full and --metrics-include serve every series (exporters/prometheus/detail.py).
AtDefault = Literal["all", "some", "none"]

GPU = ("gpu", "uuid")


@dataclass(frozen=True, slots=True)
class MetricSpec:
    """One metric family as the catalog declares it: the only name and labels the exporter emits
    it with, what produces it (`source`: a collector, `attribution`, `agent`, `process`) and
    when its series are present (`note` for the docs, `at_default` for --metrics-detail)."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    source: str
    note: str = ""  # when the series is present, for the docs
    at_default: AtDefault = "all"

    @property
    def family_name(self) -> str:
        """prometheus_client wants counter families named without `_total`."""
        if self.kind == "counter":
            return self.name.removesuffix("_total")
        return self.name
