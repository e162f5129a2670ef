"""Check `util_samples`: the raw nvmlDeviceGetSamples stream while idle and loaded."""

from __future__ import annotations

import itertools
import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from gpuscope.agent.check.common import Check, num, stats, verdict

if TYPE_CHECKING:
    from gpuscope.agent.check.stream import StreamRecorder


def clock_match(polls: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, float]]:
    """Which clock the newest sample's timestamp follows: the one on which it is youngest
    (the median age over all polls), if that is under 5 s; CLOCK_MONOTONIC and
    CLOCK_BOOTTIME differ only by time spent suspended, so both are named when close."""
    ages: dict[str, list[float]] = {}
    for poll in polls:
        for clock, age in poll.get("age_us", {}).items():
            ages.setdefault(clock, []).append(age)
    median = {clock: statistics.median(v) / 1e6 for clock, v in ages.items()}
    if not median:
        return "none", median
    best = min(median, key=lambda c: abs(median[c]))
    if abs(median[best]) > 5.0:
        return "none", median
    if best != "realtime" and abs(median["monotonic"] - median["boottime"]) < 1.0:
        return "monotonic/boottime", median
    return best, median


def spacing_ms(samples: Sequence[Mapping[str, Any]], phase: str) -> list[float]:
    stamps = sorted({s["ts"] for s in samples if s["phase"] == phase and s["ts"] > 0})
    return [(b - a) / 1e3 for a, b in itertools.pairwise(stamps)]


def stream_summary(rec: StreamRecorder, phase: str) -> dict[str, Any]:
    polls = [p for p in rec.polls if p["phase"] == phase]
    samples = [s for s in rec.samples if s["phase"] == phase]
    return {
        "polls": len(polls),
        "results": dict(Counter(p["result"] for p in polls)),
        "samples": len(samples),
        "spacing_ms": stats(spacing_ms(rec.samples, phase)),
        "values": stats([float(s["value"]) for s in samples]),
    }


def check_util_samples(rec: StreamRecorder, loaded: bool) -> Check:
    idle, duty = stream_summary(rec, "idle"), stream_summary(rec, "duty")
    clock, ages = clock_match(rec.polls)
    over = [s for s in rec.samples if s["value"] > 100]
    zero = [s for s in rec.samples if s["ts"] == 0]
    details = {
        "idle": idle,
        "duty": duty if loaded else None,
        "clock": clock,
        "median_age_s": ages,
        "values_over_100": len(over),
        "timestamp_zero": len(zero),
        "value_types": sorted({p["value_type"] for p in rec.polls if "value_type" in p}),
        "raw_samples": rec.samples,
        "polls": rec.polls,
    }
    problems = []
    if over:
        problems.append(
            f"{len(over)} of {len(rec.samples)} utilization samples above 100% "
            f"(max {max(s['value'] for s in over)})"
        )
    if zero:
        problems.append(f"{len(zero)} of {len(rec.samples)} samples with timestamp 0")
    if clock != "realtime" and rec.samples and len(zero) < len(rec.samples):
        age = ", ".join(f"{c} {a:+.2f} s" for c, a in ages.items())
        problems.append(
            f"sample timestamps follow {clock}, not the epoch clock the agent "
            f"assumes (newest sample's age on each clock: {age})"
        )
    if loaded and not duty["samples"]:
        problems.append(f"no utilization sample in {duty['polls']} polls under load")
    median = duty["spacing_ms"]["median"] if loaded else idle["spacing_ms"]["median"]
    if median is not None and not 100 <= median <= 1000:
        problems.append(
            f"median sample spacing {median:.0f} ms, outside the 100-1000 ms "
            "the agent's integrator assumes"
        )
    not_found = idle["results"].get("NOT_FOUND", 0)
    ok = (
        f"spacing median {num(median, ' ms')}, clock {clock}, NOT_FOUND in {not_found} of "
        f"{idle['polls']} idle polls, values {num(idle['values']['min'])}-"
        f"{num((duty if loaded else idle)['values']['max'])}"
    )
    return verdict("util_samples", problems, ok, details)
