"""Immutable records of the `pods` collector: this node's pods as the Kubernetes API names
them. Kept apart from the watcher (I/O) so that attribution and exporters import only data."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuscope.agent.k8s.workloads import Workload


@dataclass(frozen=True, slots=True)
class PodMeta:
    """One pod as the Kubernetes API names it: its workload, its containers by runtime id, and
    when it was scheduled."""

    uid: str
    namespace: str
    name: str
    workload: Workload
    # Container runtime id (the hex id in the container's cgroup name) -> container name:
    # what turns a GPU process's cgroup into the container a user named.
    containers: Mapping[str, str] = field(default_factory=dict)
    # When the scheduler bound the pod (its PodScheduled condition's lastTransitionTime, Unix
    # time); None while unscheduled or where the API gave no such condition.
    scheduled_at: float | None = None


@dataclass(frozen=True, slots=True)
class PodsSnapshot:
    """This node's pods as the `pods` collector's watch knows them at one collection."""

    pods: Mapping[str, PodMeta]  # by pod UID
