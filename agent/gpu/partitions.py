"""NVIDIA's MIG devices as the contract's partitions (agent/accelerators/records.py), so
attribution accounts them without knowing MIG.

NVML has no utilization samples on a MIG-enabled GPU; the GPU source gives each GPU instance
GPM's graphics-engine activity integrated instead (`MigInstance.integrals`), and the MIG
devices (compute instances) of one GPU instance share it. A MIG device's *share* of its GPU
is its GPU instance's compute slices (the `Ng` of its profile, `3g.40gb` -> 3) over the
GPU's (7 on A100, H100, H200, GH200 and B200; 4 on A30), divided between the MIG devices of
that GPU instance, so seven idle `1g` instances add up to one idle GPU, not seven.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING

from gpuscope.agent.accelerators.records import Partition

if TYPE_CHECKING:
    from gpuscope.agent.gpu.records import MigInstance

_SLICES = re.compile(r"(?:^|\.)(\d+)g\.")
GPU_SLICES = 7  # compute slices of a MIG-capable GPU, but for the A30's 4
A30_SLICES = 4


def slices(profile: str) -> int | None:
    """Compute slices of a MIG profile's GPU instance (`1c.3g.40gb` and `3g.40gb`: 3)."""
    found = _SLICES.search(profile)
    return int(found.group(1)) if found else None


def gpu_slices(model: str) -> int:
    return A30_SLICES if "A30" in model else GPU_SLICES


def shares(model: str, instances: Sequence[MigInstance]) -> dict[str, float]:
    """Each MIG device's share of its GPU, by MIG UUID; a profile without a slice count
    gets an equal share of what the named ones leave (never more than the GPU)."""
    per_gi: dict[int, list[MigInstance]] = {}
    for mig in instances:
        per_gi.setdefault(mig.gpu_instance, []).append(mig)
    total = gpu_slices(model)
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


def partitions(uuid: str, model: str, instances: Sequence[MigInstance]) -> tuple[Partition, ...]:
    """The MIG devices of GPU `uuid` as partitions. Their ids are every name a kubelet may
    give a MIG device: the MIG UUID and the pre-R470 form `MIG-<GPU uuid>/<gi>/<ci>`."""
    weight = shares(model, instances)
    out = []
    for m in instances:
        got = m.integrals
        out.append(
            Partition(
                uuid=m.mig_uuid,
                profile=m.profile,
                share=weight[m.mig_uuid],
                ids=(m.mig_uuid, f"MIG-{uuid}/{m.gpu_instance}/{m.compute_instance}"),
                activity_group=f"{uuid}/{m.gpu_instance}",
                memory_used_bytes=m.memory_used_bytes,
                memory_total_bytes=m.memory_total_bytes,
                busy_seconds=got.busy_seconds if got is not None else None,
                idle_seconds=got.idle_seconds if got is not None else None,
                sm_active_seconds=got.sm_active_seconds if got is not None else None,
                active_ratio=m.gpm.graphics_engine_active if m.gpm is not None else None,
            )
        )
    return tuple(out)
