"""How an attribution stage declares itself: one `StageSpec` value beside its code, listed
once, in order, in `agent/attribution/stages.py`, as collectors declare themselves
(agent/runtime/spec.py).

The attribution of one collection is a chain of small joins. Each declares the collectors
whose records it takes and the fields of `Joined` it reads and adds, so that the order is
checked (tests/unit/attribution/test_stages.py) instead of remembered, and the table in
docs/architecture.md ("Attribution") is read off the declarations.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import AnyAccelerators
    from gpuscope.agent.attribution.idle import IdleAccountant
    from gpuscope.agent.attribution.options import AttributionOptions
    from gpuscope.agent.attribution.state import Joined
    from gpuscope.agent.clock import Clock
    from gpuscope.agent.hostfs import HostFs
    from gpuscope.agent.k8s.pod_cgroup_usage import PodCgroupReader
    from gpuscope.agent.runtime.sources import Collection, Keyed


@dataclass(frozen=True, slots=True)
class StageContext:
    """What `StageSpec.build` gets: the attribution options and what the stages share."""

    procfs: Path  # where GPU processes' /proc/<pid>/cgroup are read (host PIDs)
    gpu_resource_names: tuple[str, ...]
    options: AttributionOptions
    clock: Clock
    pod_signals: PodCgroupReader | None  # None: no per-pod cgroup signals
    # One for every stage, so that `Attribution.dropped` counts every input they left out and
    # a failing file is logged once per change of state, whichever stage met it.
    fs: HostFs
    idle: IdleAccountant | None = None  # a prepared idle accountant; None: from `options`
    # The accelerator collectors whose devices are attributed (agent/attribution/devices.py);
    # None: every result whose records are an AcceleratorSnapshot.
    accelerators: Sequence[Keyed[AnyAccelerators]] | None = None


class Stage(Protocol):
    """One built stage: it reads `collection` and the fields of `state` its declaration
    names, and sets the fields it adds. It may keep state between collections (the
    accountants do); the runner calls it with the stage's lock held."""

    def __call__(self, collection: Collection, state: Joined) -> None: ...


@dataclass(frozen=True, slots=True)
class StageSpec:
    """One stage of the attribution: a name, what it reads and adds, how it is built."""

    name: str
    summary: str  # one line for the docs: what it joins
    sources: tuple[Keyed[Any], ...]  # the collectors whose records it takes
    reads: tuple[str, ...]  # fields of `Joined` that earlier stages added
    adds: tuple[str, ...]  # fields of `Joined` it sets; `Attribution` takes those it has
    build: Callable[[StageContext], Stage]
