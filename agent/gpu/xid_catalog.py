"""The XIDs gpuscope acts on: one list, read by the agent, the node labels, and (through
scripts/gen-deploy-assets.py) the alert rules and the dashboards.

Before this module the critical list was written out three times (exporters/labels/gpu.py,
the GPUXidCritical rule, two dashboard panels) and the copies had drifted apart: the labels
called 92 and 140 critical, the alert did not. Now the rules and dashboards hold a generated
copy, and tests/deploy/test_deploy_assets.py fails when a copy differs from this file.

Severities (NVIDIA's XID catalog, docs.nvidia.com/deploy/xid-errors, "resolution bucket"):
- `fatal`: the driver's link to the GPU is gone; the agent stops calling it
  (agent/accelerators/gate.py fences it, as DCGM stops calling the driver after XID 119).
  Fatal XIDs are critical too.
- `critical`: the GPU needs attention (a reset, a drain, a replacement) before it runs more
  work: GPUXidCritical fires, `gpuscope.io/gpu.healthy` counts the GPU out.
- `recovery`: XID 154, the driver states the recovery action it requires (GPU reset, node
  reboot, drain); GPURecoveryActionRequired fires on it.
- `application`: raised by a faulty program (a bad address, an illegal instruction), not by
  the GPU; counted, no alert.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["fatal", "critical", "recovery", "application"]


@dataclass(frozen=True)
class Xid:
    """One XID: its number, NVIDIA's short name, and what it means for the GPU."""

    code: int
    name: str
    meaning: str
    severity: Severity


XIDS: tuple[Xid, ...] = (
    Xid(13, "GR_EXCEPTION", "graphics engine exception: usually a program fault", "application"),
    Xid(31, "MMU_FAULT", "GPU memory page fault: usually a program's bad address", "application"),
    Xid(
        43,
        "RESET_CHANNEL",
        "GPU stopped processing the channel of a faulting program",
        "application",
    ),
    Xid(45, "PREEMPTIVE_REMOVAL", "channel cleaned up after an earlier error", "application"),
    Xid(48, "DBE", "double-bit ECC error: uncorrectable memory error", "critical"),
    Xid(62, "INTERNAL_MICRO_CONTROLLER_HALT", "an internal micro-controller halted", "critical"),
    Xid(
        63,
        "ROW_REMAP_EVENT",
        "memory row remapping (page retirement) recorded: a reset applies it",
        "critical",
    ),
    Xid(64, "ROW_REMAP_FAILURE", "memory row remapping (page retirement) failed", "critical"),
    Xid(74, "NVLINK_ERROR", "NVLink error: a link failed or is unreliable", "critical"),
    Xid(79, "GPU_FALLEN_OFF_THE_BUS", "the GPU is not reachable over PCIe", "fatal"),
    Xid(92, "HIGH_SBE_RATE", "high single-bit ECC error rate: memory degrading", "critical"),
    Xid(94, "CONTAINED_ECC", "contained ECC error: the affected program was stopped", "critical"),
    Xid(
        95,
        "UNCONTAINED_ECC",
        "uncontained ECC error: every program on the GPU is affected",
        "critical",
    ),
    Xid(119, "GSP_RPC_TIMEOUT", "the GPU System Processor stopped answering the driver", "fatal"),
    Xid(120, "GSP_ERROR", "the GPU System Processor firmware faulted", "fatal"),
    Xid(140, "UNRECOVERED_ECC", "unrecovered ECC error in GPU memory", "critical"),
    Xid(
        154,
        "GPU_RECOVERY_ACTION_CHANGED",
        "the driver requires a recovery action (GPU reset, node reboot, drain)",
        "recovery",
    ),
)

BY_CODE: dict[int, Xid] = {x.code: x for x in XIDS}

# After these the GPU is fenced: no NVML call but a cheap probe with backoff (agent/gpu/xid.py).
FATAL_XIDS: frozenset[int] = frozenset(x.code for x in XIDS if x.severity == "fatal")
# These fire GPUXidCritical and make a GPU unhealthy in the node labels.
CRITICAL_XIDS: frozenset[int] = frozenset(
    x.code for x in XIDS if x.severity in ("fatal", "critical")
)
RECOVERY_ACTION_XID = 154


def critical_regex() -> str:
    """The critical XIDs as a PromQL regex, in ascending order: `48|62|...`."""
    return "|".join(str(code) for code in sorted(CRITICAL_XIDS))


def critical_list() -> str:
    """The critical XIDs as prose, in ascending order: `48, 62, ...`."""
    return ", ".join(str(code) for code in sorted(CRITICAL_XIDS))
