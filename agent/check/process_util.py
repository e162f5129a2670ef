"""Check `process_util`: nvmlDeviceGetProcessUtilization's cadence under load."""

from __future__ import annotations

import itertools
import os
from collections import Counter
from typing import TYPE_CHECKING, Any

from gpuscope.agent.check.common import Check, not_checked, num, stats, verdict
from gpuscope.agent.gpu.processes import HOLD_SECONDS

if TYPE_CHECKING:
    from gpuscope.agent.check.load import Load
    from gpuscope.agent.check.phases import Phases
    from gpuscope.agent.check.stream import StreamRecorder


def process_cadence(rec: StreamRecorder, pid: int) -> dict[str, Any]:
    """Per-process samples of the loaded window: this process's own if it has any."""
    duty = [s for s in rec.proc_samples if s["phase"] == "duty"]
    mine = [s for s in duty if s["pid"] == pid] or duty
    stamps = sorted({s["ts"] for s in mine})
    spacing = [(b - a) / 1e6 for a, b in itertools.pairwise(stamps)]
    polls = [p for p in rec.proc_polls if p["phase"] == "duty"]
    return {
        "pid": pid,
        "own_samples": sum(1 for s in duty if s["pid"] == pid),
        "samples": len(mine),
        "spacing_s": stats(spacing),
        "sm_util": stats([float(s["sm"]) for s in mine]),
        "over_100": sum(1 for s in mine for k in ("sm", "mem", "enc", "dec") if s[k] > 100),
        "results": dict(Counter(p["result"] for p in polls)),
        "polls": len(polls),
        "raw_samples": rec.proc_samples,
    }


def check_process_util(rec: StreamRecorder, load: Load | None, phases: Phases) -> Check:
    a, b = phases.marks.get("duty_start"), phases.marks.get("duty_end")
    if load is None or a is None or b is None:
        return not_checked("process_util", "no load ran on GPU 0")
    c = process_cadence(rec, os.getpid())
    window = c["window_s"] = b.mono - a.mono
    problems = []
    if not c["own_samples"]:
        problems.append(
            f"no per-process sample for this process (pid {c['pid']}) in "
            f"{c['polls']} polls under load: {c['results']}"
        )
    median = c["spacing_s"]["median"]
    if c["own_samples"] == 1 and window > 2 * HOLD_SECONDS:
        problems.append(
            f"one per-process sample in {window:.1f} s of load, so more than "
            f"{window / 2:.1f} s apart: longer than the agent's {HOLD_SECONDS:g} s "
            "hold (processes.py HOLD_SECONDS)"
        )
    if median is not None and median > HOLD_SECONDS:
        problems.append(
            f"per-process samples {median:.1f} s apart (median, max "
            f"{c['spacing_s']['max']:.1f} s), longer than the agent's "
            f"{HOLD_SECONDS:g} s hold (processes.py HOLD_SECONDS): a scrape "
            "between two samples reads a busy process as idle"
        )
    if c["over_100"]:
        problems.append(
            f"{c['over_100']} per-process utilization values above 100 "
            f"(SM max {c['sm_util']['max']})"
        )
    if c["results"].get("INSUFFICIENT_SIZE"):
        problems.append(
            f"INSUFFICIENT_SIZE on the second call in "
            f"{c['results']['INSUFFICIENT_SIZE']} of {c['polls']} polls "
            "(the agent drops that read and counts an error)"
        )
    ok = (
        f"{c['samples']} samples, median {num(median, ' s')} apart (polled every "
        f"{rec.interval:g} s), SM util {num(c['sm_util']['min'])}-"
        f"{num(c['sm_util']['max'])}"
    )
    return verdict("process_util", problems, ok, c)
