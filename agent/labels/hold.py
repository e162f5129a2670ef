"""Node labels that hold through faults: what a labels round publishes when the GPUs cannot
be read, and when their absence is confirmed.

A scheduler reads a missing `gpu.present=true` as "this node has no GPUs", so withdrawing
labels is a decision with consequences, and a fault is not evidence of absence. The GPU
collector failing (driver not loaded yet after a reboot, NVML errors, GPUs not answering)
keeps the labels last published, and `gpu.healthy` says the truth meanwhile: 0 while no GPU
can be read. Only a confirmed absence lasting `--labels-absence-grace` seconds withdraws them:
the collector succeeding with no GPUs, or failing because its library or driver is not on
the host (`SourceResult.absent`), and nothing else in between. "Last published" survives a
restart: it is read back from where the labels are published (the Node, the NodeFeature
object or the features file).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import AnyAccelerators
    from gpuscope.agent.runtime.sources import SourceResult

PRESENT, COUNT, HEALTHY = "gpu.present", "gpu.count", "gpu.healthy"
# Labels that follow reality even while some GPUs do not answer: how many there are and how
# many are healthy, and what comes from the driver or the NICs rather than from each GPU.
FOLLOW = (
    PRESENT,
    COUNT,
    HEALTHY,
    "gpu.driver.major",
    "gpu.driver.minor",
    "cuda.driver.major",
    "cuda.driver.minor",
    "rdma.present",
)


class Reading(enum.Enum):
    """What one collection says about the GPUs."""

    READ = "read"  # every GPU answered
    PARTIAL = "partial"  # GPUs enumerated, some not answering
    FAILED = "failed"  # the collector failed: a fault, not evidence of absence
    ABSENT = "absent"  # no GPU, or no driver: absence, if it lasts


def classify(result: SourceResult[AnyAccelerators] | None) -> Reading:
    """One accelerator collection's `Reading` (None: the collector did not run at all). Only
    a failure the source calls an absence (`SourceAbsent`: no driver, no library) counts
    towards a confirmed absence; every other failure is a fault."""
    if result is None:
        return Reading.FAILED
    if not result.success or result.records is None:
        return Reading.ABSENT if result.absent else Reading.FAILED
    gpus = result.records.gpus
    if not gpus:
        return Reading.ABSENT
    return Reading.READ if all(g.up for g in gpus) else Reading.PARTIAL


def held_labels(
    last: Mapping[str, str], fresh: Mapping[str, str], prefix: str, reading: Reading
) -> dict[str, str]:
    """The labels to publish while holding `last` (published labels with `gpu.present=true`).

    No GPU records at all: the last labels, with what does not come from the GPUs (RDMA
    presence) fresh, and `gpu.healthy` 0. Some GPUs not answering: the labels that describe
    the GPUs (product, memory, links, topology...) keep their last values, since the
    answering GPUs alone would misstate them; `FOLLOW` labels are fresh.
    """
    if reading in (Reading.FAILED, Reading.ABSENT):
        present = f"{prefix}{PRESENT}"
        kept = {k: v for k, v in fresh.items() if k != present}
        return {**last, **kept, f"{prefix}{HEALTHY}": "0"}
    follow = {f"{prefix}{name}" for name in FOLLOW}
    return {**fresh, **{k: v for k, v in last.items() if k not in follow}}


@dataclass(frozen=True, slots=True)
class Decision:
    """What a round publishes and why."""

    labels: dict[str, str]
    annotations: dict[str, str]
    holding: bool  # labels last published are kept in place of (some of) the fresh ones
    withdrawn: bool  # a confirmed absence outlasted the grace: the fresh labels replace them


class AbsenceClock:
    """How long a confirmed absence has lasted, on the loop's monotonic clock."""

    def __init__(self, grace: float) -> None:
        self.grace = grace
        self.since: float | None = None

    def observe(self, reading: Reading, now: float) -> bool:
        """Record this round's reading; True once the absence has lasted the grace."""
        if reading is not Reading.ABSENT:
            self.since = None
            return False
        if self.since is None:
            self.since = now
        return now - self.since >= self.grace

    def deadline(self) -> float | None:
        """When an absence that goes on would be confirmed (None: no absence now)."""
        return None if self.since is None else self.since + self.grace


def decide(
    reading: Reading,
    confirmed_absent: bool,
    last_labels: Mapping[str, str] | None,
    last_annotations: Mapping[str, str] | None,
    fresh_labels: Mapping[str, str],
    fresh_annotations: Mapping[str, str],
    prefix: str,
) -> Decision:
    """The labels and annotations of one round. Holding needs something to hold: labels
    last published that said the GPUs were present."""
    has_gpus = last_labels is not None and last_labels.get(f"{prefix}{PRESENT}") == "true"
    if reading is Reading.READ or not has_gpus or last_labels is None:
        return Decision(dict(fresh_labels), dict(fresh_annotations), False, False)
    if confirmed_absent:
        return Decision(dict(fresh_labels), dict(fresh_annotations), False, True)
    labels = held_labels(last_labels, fresh_labels, prefix, reading)
    annotations = {**fresh_annotations, **(last_annotations or {})}
    holding = labels != dict(fresh_labels) or annotations != dict(fresh_annotations)
    return Decision(labels, annotations, holding, False)
