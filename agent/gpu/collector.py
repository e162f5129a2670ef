"""The `gpu` collector's declaration: NVML devices, sampled and read at scrape time."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from gpuscope.agent.runtime.accelerators import ACCELERATOR
from gpuscope.agent.runtime.options import flag, number
from gpuscope.agent.runtime.spec import BuildContext, CollectorSpec

if TYPE_CHECKING:
    from gpuscope.agent.gpu.records import GpuSnapshot
    from gpuscope.agent.runtime.sources import Source


@dataclass(frozen=True, slots=True)
class GpuOptions:
    """The `gpu` collector's flags: the sampler's interval and activity threshold, NVLink series
    per link, and how long one GPU's reads may take (`GpuConfig` gets all but the renderer's)."""

    sample_interval: float = flag(
        1.0,
        "seconds between GPU sampler ticks",
        check=lambda v: None if 0.05 <= v <= 60 else f"expected 0.05 to 60 seconds, got {v:g}",
    )
    idle_threshold: float = flag(
        0.0,
        "utilization ratio (0-1) above which a GPU counts as active",
        check=lambda v: None if 0 <= v < 1 else f"expected a ratio from 0 to below 1, got {v:g}",
    )
    # Read by the renderer only: the source reads every link whatever this says.
    nvlink_per_link: bool = flag(False, "also export NVLink throughput per link (true/false)")
    # All GPUs are read in parallel, so a collection takes at most about this long whatever
    # one GPU does; keep it well below the agent's --collect-deadline.
    gpu_read_deadline: float = flag(
        2.0,
        "seconds one GPU's NVML reads may take before that GPU is reported stuck (gpu_up 0) "
        "and not called again until the blocked call returns",
        parse=number,
        check=lambda v: None if 0.05 <= v <= 60 else f"expected 0.05 to 60 seconds, got {v:g}",
    )


def _build(ctx: BuildContext[GpuOptions]) -> Source[GpuSnapshot]:
    from gpuscope.agent.gpu.source import GpuConfig, GpuSource

    config = GpuConfig(
        sample_interval=ctx.options.sample_interval,
        idle_threshold=ctx.options.idle_threshold,
        sysfs=ctx.agent.sysfs,
        background=ctx.background,
        read_deadline=ctx.options.gpu_read_deadline,
        per_second_figures=ctx.agent.dcgm_compat != "off",
    )
    return GpuSource(config, clock=ctx.clock)


GPU: CollectorSpec[GpuSnapshot, GpuOptions] = CollectorSpec(
    name="gpu",
    summary="NVIDIA GPUs through NVML: utilization, memory, power, clocks, errors, PCIe, "
    "NVLink, MIG, GPU processes.",
    options=GpuOptions,
    build=_build,
    renderer="gpuscope.exporters.prometheus.gpu:RENDERER",
    metrics="gpuscope.exporters.prometheus.catalog_gpu:GPU_METRICS",
    role=ACCELERATOR,
)
