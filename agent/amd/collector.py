"""The `amd` collector's declaration: AMD Instinct GPUs through AMD SMI (`amdsmi`).

On by default: on a host without ROCm's libamd_smi.so (or without the `amdsmi` package)
the source reports itself absent in one line, as the `gpu` collector does without NVML.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscope.agent.runtime.accelerators import ACCELERATOR
from gpuscope.agent.runtime.options import flag, number
from gpuscope.agent.runtime.spec import BuildContext, CollectorSpec

if TYPE_CHECKING:
    from gpuscope.agent.amd.records import AmdGpus
    from gpuscope.agent.runtime.sources import Source


@dataclass(frozen=True, slots=True)
class AmdOptions:
    """The `amd` collector's flags: the sampler's interval and activity threshold, and how long
    one GPU's reads may take (`_build` hands them to `AmdConfig`)."""

    amd_sample_interval: float = flag(
        1.0,
        "seconds between AMD GPU sampler ticks (busy and throttle integrals, events)",
        check=lambda v: None if 0.05 <= v <= 60 else f"expected 0.05 to 60 seconds, got {v:g}",
    )
    amd_idle_threshold: float = flag(
        0.0,
        "activity ratio (0-1) above which an AMD GPU counts as active",
        check=lambda v: None if 0 <= v < 1 else f"expected a ratio from 0 to below 1, got {v:g}",
    )
    amd_read_deadline: float = flag(
        2.0,
        "seconds one AMD GPU's reads may take before that GPU is reported stuck (gpu_up 0) "
        "and not called again until the blocked call returns",
        parse=number,
        check=lambda v: None if 0.05 <= v <= 60 else f"expected 0.05 to 60 seconds, got {v:g}",
    )


def _build(ctx: BuildContext[AmdOptions]) -> Source[AmdGpus]:
    from gpuscope.agent.amd.source import AmdConfig, AmdSource

    config = AmdConfig(
        sample_interval=ctx.options.amd_sample_interval,
        idle_threshold=ctx.options.amd_idle_threshold,
        sysfs=ctx.agent.sysfs,
        background=ctx.background,
        read_deadline=ctx.options.amd_read_deadline,
    )
    return AmdSource(config, clock=ctx.clock)


AMD: CollectorSpec[AmdGpus, AmdOptions] = CollectorSpec(
    name="amd",
    summary="AMD Instinct GPUs through AMD SMI (amdsmi): utilization, memory, power, energy, "
    "clocks, PCIe, XGMI, ECC, retired pages, events, compute partitions, GPU processes.",
    options=AmdOptions,
    build=_build,
    renderer="gpuscope.exporters.prometheus.amd:RENDERER",
    metrics="gpuscope.exporters.prometheus.catalog_amd:AMD_METRICS",
    role=ACCELERATOR,
)
