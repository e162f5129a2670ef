"""The JSON report and the terminal summary."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from gpuscope.agent.check.common import FAIL, NOT_CHECKED, PASS, Check, say


def report_path(arg: str | None) -> Path:
    if arg:
        return Path(arg)
    return Path(os.environ.get("OUT") or ".") / "gpu-check-report.json"


def write_report(path: Path, checks: Sequence[Check], extra: dict[str, Any]) -> None:
    body = {
        **extra,
        "checks": [asdict(c) for c in checks],
        "summary": dict(Counter(c.status for c in checks)),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(body, indent=1, default=str) + "\n")


def print_summary(checks: Sequence[Check], inv: Mapping[str, Any], path: Path, wall: float) -> None:
    gpus = inv.get("gpus", [])
    names = sorted({g["model"] for g in gpus})
    if inv.get("vendor") == "amd":
        say(
            f"{len(gpus)} GPU(s) {', '.join(names)}; amdgpu {inv.get('driver')}, AMD SMI "
            f"{inv.get('library')}, amdsmi {inv.get('bindings')}, partitions "
            f"{sorted({g['partition'] for g in gpus})}"
        )
    else:
        say(
            f"{len(gpus)} GPU(s) {', '.join(names)}; driver {inv.get('driver')}, NVML "
            f"{inv.get('nvml')}, CUDA {inv.get('cuda_driver')}, nvidia-ml-py "
            f"{inv.get('nvidia_ml_py')}, MIG {[g['mig_mode'] for g in gpus]}"
        )
    for c in checks:
        say(f"  [{c.status.upper().replace('_', ' ')}] {c.name}: {c.message}")
    counts = Counter(c.status for c in checks)
    say(
        f"{counts[PASS]} passed, {counts[FAIL]} failed, {counts[NOT_CHECKED]} not checked "
        f"in {wall:.0f} s; full report: {path}"
    )
