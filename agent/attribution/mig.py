"""Partitions (NVIDIA's MIG devices) in attribution: when each was last active.

A partition is accounted as a device of its own (agent/accelerators/records.py,
`Partition`): its share of its GPU weighs its idle GPU-seconds and energy, so seven idle
`1g` instances add up to one idle GPU, not seven; the vendor's source computes the share
(NVIDIA's: agent/gpu/partitions.py).

No sampler keeps a "last active" moment per partition, so `LastActive` derives one at each
evaluation from the idle integral: when the interval since the previous evaluation had busy
time that was not idle, the partition was last active at most `idle` seconds ago (now minus
that interval's idle seconds); right to within one evaluation interval, where a GPU's own
gauge is right to one sampler tick. A partition first seen with activity in its last window
counts as active then.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gpuscope.agent.accelerators.records import Partition


@dataclass(slots=True)
class _Seen:
    """A MIG device's integrals at the previous evaluation, and the last-active moment derived
    from them so far (wall time; None: not active since first seen)."""

    at: float
    busy: float
    idle: float
    last_active: float | None


class LastActive:
    """The moment each MIG device was last active, derived from its idle integral."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}

    def update(self, migs: Mapping[str, Partition], now: float) -> dict[str, float | None]:
        """Last-active wall time by partition UUID (None: not active since first seen)."""
        out: dict[str, float | None] = {}
        for uuid, got in migs.items():
            if got.busy_seconds is None or got.idle_seconds is None:
                self._seen.pop(uuid, None)
                continue
            seen = self._seen.get(uuid)
            if seen is None:  # first seen: active now if its last window was
                last = now if (got.active_ratio or 0.0) > 0.0 else None
                seen = self._seen[uuid] = _Seen(now, got.busy_seconds, got.idle_seconds, last)
            elif now > seen.at:
                elapsed = now - seen.at
                idle = max(0.0, got.idle_seconds - seen.idle)
                # Busy time that was not all below the threshold: some window was active.
                # The integrals end at the last GPM window, up to a tick before now, hence
                # the tolerance on "the whole interval was idle".
                tolerance = min(2.0, elapsed / 2)
                if got.busy_seconds > seen.busy and idle < elapsed - tolerance:
                    seen.last_active = now - min(idle, elapsed)
                seen.at, seen.busy, seen.idle = now, got.busy_seconds, got.idle_seconds
            out[uuid] = seen.last_active
        for uuid in [u for u in self._seen if u not in migs]:
            del self._seen[uuid]
        return out
