"""Check `load_generator`: the CUDA load ran at the duty asked."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuscope.agent.check.common import FAIL, PASS, Check, not_checked, verdict

if TYPE_CHECKING:
    from gpuscope.agent.check.load import Load
    from gpuscope.agent.check.phases import Phases


def check_load(load: Load | None, why: str, phases: Phases) -> Check:
    if load is None:
        return not_checked("load_generator", why)
    details = load.describe()
    if load.error:
        return Check("load_generator", FAIL, f"{load.kind} load failed: {load.error}", details)
    a, b = phases.marks.get("duty_start"), phases.marks.get("duty_end")
    measured = load.measured_duty(a.mono, b.mono) if a and b else None
    details["measured_duty"] = measured
    if measured is None:
        return Check("load_generator", PASS, f"{load.kind} load at {load.duty:.0%}", details)
    problems = []
    if abs(measured - load.duty) > 0.02:
        problems.append(f"measured duty {measured:.1%}, asked {load.duty:.0%}")
    return verdict("load_generator", problems, f"CUDA load: {measured:.1%} duty measured", details)
