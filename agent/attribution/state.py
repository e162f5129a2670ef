"""What the attribution stages hand each other while they attribute one collection.

`Joined` has one field per thing a stage adds (agent/attribution/stages.py names who adds
and who reads each). A field is set once, by the stage that adds it; one read before that
raises AttributeError rather than reading a default, so a stage put before what it needs
fails at once in every test that runs it. The fields `Attribution` has keep its names and
types, and the runner (agent/attribution/stage.py) copies them into it.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscope.agent.attribution.records import (
    CauseKey,
    GpuHolding,
    GpuStatus,
    IdleKey,
    MigStatus,
    PodEnergy,
    PodGpuUsage,
    PodName,
    PodRef,
    PodSignals,
    PodStartup,
)
from gpuscope.agent.k8s.workloads import Workload

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import AnyReading
    from gpuscope.agent.attribution.idle import Judge
    from gpuscope.agent.k8s.records import PodMeta

NO_WORKLOAD = Workload("", "")


def pod_ref(meta: PodMeta) -> PodRef:
    """A pod as the Kubernetes API names it."""
    return PodRef(meta.uid, meta.namespace, meta.name, meta.workload)


@dataclass(frozen=True, slots=True)
class WorkloadsKept:
    """The per-workload counters after one evaluation of the accounts: what the warning
    about --max-workloads and `gpuscope_series_dropped_total` need."""

    kept: int  # workloads whose idle counters are kept now
    limit: int  # --max-workloads
    dropped_series: int  # idle and low-activity series left out since the start


@dataclass(slots=True, init=False, repr=False, eq=False)
class Joined:
    """One collection's attribution while the stages build it (the module docstring)."""

    # names: the pods source's last answer (names survive an API outage)
    by_uid: Mapping[str, PodMeta]
    by_name: Mapping[tuple[str, str], PodMeta]
    pod_names: Mapping[str, PodName]
    # holdings: None while the kubelet does not answer (then no idle or unallocated figures)
    holdings: tuple[GpuHolding, ...] | None
    holders: Mapping[str, list[GpuHolding]]  # by GPU UUID
    # usage
    readings: tuple[AnyReading, ...]  # the GPUs that answered, every accelerator collector's
    usage: tuple[PodGpuUsage, ...]
    active: Set[str]  # UIDs of pods with GPU activity now
    # startups
    startups: tuple[PodStartup, ...]
    # signals
    pod_signals: tuple[PodSignals, ...]
    judge: Judge  # the cause of an idle interval, from its holders' signals
    # accounts
    gpus: tuple[GpuStatus, ...]
    migs: tuple[MigStatus, ...]
    idle_seconds_total: Mapping[IdleKey, float]
    low_activity_seconds_total: Mapping[IdleKey, float]
    idle_cause_seconds_total: Mapping[CauseKey, float]
    low_activity_cause_seconds_total: Mapping[CauseKey, float]
    workloads: WorkloadsKept | None  # None: nothing evaluated (the kubelet did not answer)
    # limits
    series_dropped: Mapping[str, int]
    # energy
    energy: tuple[PodEnergy, ...]
    # pods
    pods: tuple[PodRef, ...]
