"""MIG devices in attribution: which instance a kubelet id names, what share of its GPU it
is, and when it last did something.

NVML has no utilization samples on a MIG-enabled GPU; the GPU source gives each GPU
instance GPM's graphics-engine activity integrated instead (`MigInstance.integrals`:
busy_seconds, idle_seconds at --idle-threshold, sm_active_seconds), and the MIG devices
(compute instances) of one GPU instance share it. So:

- a MIG device's *share* of its GPU is its GPU instance's compute slices (the `Ng` of its
  profile, `3g.40gb` -> 3) over the GPU's (7 on A100, H100, H200, GH200 and B200; 4 on
  A30), divided between the MIG devices of that GPU instance. Idle GPU-seconds and energy
  are weighted by it, so seven idle `1g` instances add up to one idle GPU, not seven;
- the sampler keeps no "last active" moment per instance, so `LastActive` derives one at
  each evaluation from the idle integral: when the interval since the previous evaluation
  had busy time that was not idle, the instance was last active at most `idle` seconds ago
  (now minus that interval's idle seconds); right to within one evaluation interval, where
  a GPU's own gauge is right to one sampler tick. A device first seen with graphics
  activity in its last GPM window counts as active then.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gpuscope.agent.gpu.records import GpuReading, MigInstance

_SLICES = re.compile(r"(?:^|\.)(\d+)g\.")
GPU_SLICES = 7  # compute slices of a MIG-capable GPU, but for the A30's 4
A30_SLICES = 4


def slices(profile: str) -> int | None:
    """Compute slices of a MIG profile's GPU instance (`1c.3g.40gb` and `3g.40gb`: 3)."""
    found = _SLICES.search(profile)
    return int(found.group(1)) if found else None


def gpu_slices(reading: GpuReading) -> int:
    return A30_SLICES if "A30" in reading.identity.model else GPU_SLICES


def shares(reading: GpuReading) -> dict[str, float]:
    """Each MIG device's share of its GPU, by MIG UUID; a profile without a slice count
    gets an equal share of what the named ones leave (never more than the GPU)."""
    per_gi: dict[int, list[MigInstance]] = {}
    for mig in reading.mig_instances:
        per_gi.setdefault(mig.gpu_instance, []).append(mig)
    total = gpu_slices(reading)
    named = {gi: slices(ms[0].profile) for gi, ms in per_gi.items()}
    known = sum(s for s in named.values() if s is not None)
    total = max(total, known)
    unknown = [gi for gi, s in named.items() if s is None]
    left = (total - known) / len(unknown) if unknown else 0.0
    out: dict[str, float] = {}
    for gi, ms in per_gi.items():
        gi_slices = named[gi]
        gi_share = (gi_slices if gi_slices is not None else left) / total
        for mig in ms:
            out[mig.mig_uuid] = gi_share / len(ms)
    return out


def mig_ids(readings: Iterable[GpuReading]) -> dict[str, str]:
    """Every id a kubelet may give a MIG device -> its MIG UUID: the UUID itself and the
    pre-R470 form `MIG-<parent uuid>/<gi>/<ci>`."""
    out: dict[str, str] = {}
    for r in readings:
        for m in r.mig_instances:
            out[m.mig_uuid] = m.mig_uuid
            out[f"MIG-{r.identity.uuid}/{m.gpu_instance}/{m.compute_instance}"] = m.mig_uuid
    return out


@dataclass(slots=True)
class _Seen:
    at: float
    busy: float
    idle: float
    last_active: float | None


class LastActive:
    """The moment each MIG device was last active, derived from its idle integral."""

    def __init__(self) -> None:
        self._seen: dict[str, _Seen] = {}

    def update(self, migs: Mapping[str, MigInstance], now: float) -> dict[str, float | None]:
        """Last-active wall time by MIG UUID (None: not active since first seen)."""
        out: dict[str, float | None] = {}
        for uuid, mig in migs.items():
            got = mig.integrals
            if got is None or got.busy_seconds is None or got.idle_seconds is None:
                self._seen.pop(uuid, None)
                continue
            seen = self._seen.get(uuid)
            if seen is None:  # first seen: active now if its last GPM window was
                gpm = mig.gpm
                active = gpm is not None and (gpm.graphics_engine_active or 0.0) > 0.0
                last = now if active else None
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
