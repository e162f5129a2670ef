"""Check `nvml_errors`: NVML calls the agent saw fail with anything but NOT_SUPPORTED."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gpuscope.agent.check.common import Check, verdict

if TYPE_CHECKING:
    from gpuscope.agent.gpu.source import GpuSource


def check_nvml_errors(source: GpuSource) -> Check:
    errors = {f"{f}: {m}": n for (f, m), n in sorted(source.nvml.errors.items())}
    problems = (
        [
            f"{len(errors)} NVML calls failed in the agent: "
            + "; ".join(f"{k} (x{n})" for k, n in errors.items())
        ]
        if errors
        else []
    )
    return verdict("nvml_errors", problems, "none", {"errors": errors})
