"""The devices attribution reads: every accelerator collector's, whichever vendor's.

Stages never name a vendor's collector. They declare `ACCELERATORS` among their sources and
read `devices(collection, keys)`, where `keys` are the accelerator collectors the app
enabled (role ACCELERATOR, agent/app/registry.py) or, where none were given (a stage driven
by hand), every result whose records are an `AcceleratorSnapshot`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuscope.agent.accelerators.records import AcceleratorSnapshot, AnyAccelerators, AnyReading

if TYPE_CHECKING:
    from gpuscope.agent.runtime.sources import Collection, Keyed


@dataclass(frozen=True, slots=True)
class Role:
    """A key by name alone: in a stage's declared sources, one that stands for every
    collector of a role; in `devices`, a collector found by the type of its records."""

    name: str

    def typed(self, records: Any) -> Any:
        return records


ACCELERATORS = Role("accelerators")


@dataclass(frozen=True, slots=True)
class Devices:
    """Every device the accelerator collectors read in one collection, in registry order."""

    readings: tuple[AnyReading, ...]
    processes_refused: frozenset[str]  # devices whose process list the library refused


def devices(
    collection: Collection, keys: Sequence[Keyed[AnyAccelerators]] | None
) -> Devices | None:
    """The devices of the accelerator collectors that answered; None where none did (no
    device records at all, which is not the same as a node without devices)."""
    if keys is None:
        keys = [
            Role(name)
            for name, result in collection.results.items()
            if isinstance(result.records, AcceleratorSnapshot)
        ]
    snapshots = [s for key in keys if (s := collection.records(key)) is not None]
    if not snapshots:
        return None
    return Devices(
        readings=tuple(r for s in snapshots for r in s.gpus),
        processes_refused=frozenset().union(*(s.processes_refused for s in snapshots)),
    )
