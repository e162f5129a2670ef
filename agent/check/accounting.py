"""Checks `idle_accounting` and `busy_accounting`: the agent's idle and busy seconds held
against the wall clock."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from gpuscope.agent.check.common import EDGE_SECONDS, TOLERANCE, Check, not_checked, value, verdict

if TYPE_CHECKING:
    from gpuscope.agent.check.load import Load
    from gpuscope.agent.check.phases import Mark, Phases
    from gpuscope.agent.gpu.source import GpuSource


def deltas(a: Mark, b: Mark, uuid: str) -> dict[str, Any]:
    """What the agent accrued for one GPU between two marks, and the windows to judge it by:
    the monotonic wall time and the span of sample time the integral covered."""
    ua, ub = a.util.get(uuid, {}), b.util.get(uuid, {})
    d: dict[str, Any] = {
        k: ub.get(k, 0.0) - ua.get(k, 0.0) for k in ("busy", "idle", "covered", "unsampled")
    }
    d["wall"] = b.mono - a.mono
    last_a, last_b = ua.get("last_sample_us", 0.0), ub.get("last_sample_us", 0.0)
    d["sample_span"] = (last_b - last_a) / 1e6 if last_a > 0 and last_b > last_a else 0.0
    d["period"] = ub.get("period_us", 1e6) / 1e6
    return d


def metric_delta(a: Mark, b: Mark, name: str, gpu: str) -> float | None:
    va, vb = value(a.metrics, name, gpu=gpu), value(b.metrics, name, gpu=gpu)
    return vb - va if va is not None and vb is not None else None


def near(x: float, want: float, *refs: float) -> bool:
    """Within TOLERANCE (at least EDGE_SECONDS) of `want` or of any other reference window."""
    return any(abs(x - r) <= max(TOLERANCE * r, EDGE_SECONDS) for r in (want, *refs) if r > 0)


def check_idle(phases: Phases, source: GpuSource) -> Check:
    a, b = phases.marks.get("idle_start"), phases.marks.get("idle_end")
    if a is None or b is None:
        return not_checked("idle_accounting", "the idle window did not run")
    problems, per_gpu = [], {}
    for device in source.devices:
        i, uuid = str(device.identity.index), device.identity.uuid
        d = deltas(a, b, uuid)
        d["busy_metric"] = metric_delta(a, b, "gpuscope_gpu_busy_seconds_total", i)
        d["unsampled_metric"] = metric_delta(a, b, "gpuscope_gpu_unsampled_seconds_total", i)
        per_gpu[i] = d
        wall, span = d["wall"], d["sample_span"]
        if not near(d["idle"], wall, span):
            problems.append(
                f"GPU {i}: idle seconds {d['idle']:.2f} over a {wall:.1f} s idle "
                f"window (samples span {span:.1f} s), more than 5% off; "
                f"unsampled {d['unsampled']:.2f} s"
            )
        if (d["busy_metric"] or 0) > TOLERANCE * wall:
            problems.append(f"GPU {i}: {d['busy_metric']:.2f} busy seconds while idle")
        total = d["covered"] + d["unsampled"]
        if not near(total, wall):
            problems.append(
                f"GPU {i}: busy + not busy + unsampled = {total:.2f} s over a {wall:.1f} s window"
            )
    d0 = per_gpu.get("0", {})
    ok = (
        f"GPU 0 idle {d0.get('idle', 0):.1f} s of {d0.get('wall', 0):.1f} s, unsampled "
        f"{d0.get('unsampled', 0):.2f} s ({len(per_gpu)} GPUs)"
    )
    return verdict("idle_accounting", problems, ok, {"per_gpu": per_gpu})


def expected_duty(load: Load, a: Mark, b: Mark, assume: float | None) -> float:
    """--assume-duty, else what the CUDA load measured, else what it was asked."""
    if assume is not None:
        return assume
    return load.measured_duty(a.mono, b.mono) or load.duty


def check_busy(phases: Phases, source: GpuSource, load: Load | None, args: Any) -> Check:
    a, b = phases.marks.get("duty_start"), phases.marks.get("duty_end")
    if load is None or a is None or b is None:
        return not_checked("busy_accounting", "no load ran on GPU 0")
    uuid = source.devices[0].identity.uuid
    d = deltas(a, b, uuid)
    busy = metric_delta(a, b, "gpuscope_gpu_busy_seconds_total", "0")
    d["busy_metric"] = busy if busy is not None else float("nan")
    d["unsampled_metric"] = metric_delta(a, b, "gpuscope_gpu_unsampled_seconds_total", "0")
    duty = expected_duty(load, a, b, args.assume_duty)
    window = d["sample_span"] or d["wall"]
    want = duty * window
    d.update(duty=duty, expected_busy=want, window=window)
    problems = []
    if busy is None:
        problems.append('gpuscope_gpu_busy_seconds_total{gpu="0"} not exported')
    else:
        off = abs(busy - want) / want if want else float("inf")
        if abs(busy - want) > max(TOLERANCE * want, EDGE_SECONDS):
            problems.append(
                f"busy seconds {busy:.2f} over a {window:.1f} s window at "
                f"{duty:.0%} duty: {off:.0%} off, more than 5%"
            )
        if busy > d["wall"] + d["period"]:
            problems.append(f"busy seconds {busy:.2f} above the {d['wall']:.1f} s wall")
    total = d["covered"] + d["unsampled"]
    if not near(total, d["wall"]):
        problems.append(
            f"busy + not busy + unsampled = {total:.2f} s over a {d['wall']:.1f} s window"
        )
    ok = (
        f"busy {d['busy_metric']:.2f} s over {window:.1f} s at {duty:.1%} duty "
        f"(expected {want:.2f} s), unsampled {d['unsampled']:.2f} s"
    )
    return verdict("busy_accounting", problems, ok, d)
