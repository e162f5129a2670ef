"""The idle and duty windows, with the agent's integrals and nvidia-smi read at each edge."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from gpuscope.agent.check.common import Metrics, say, scrape

if TYPE_CHECKING:
    from gpuscope.agent.app.agent import Agent
    from gpuscope.agent.check.load import Load
    from gpuscope.agent.check.stream import StreamRecorder
    from gpuscope.agent.gpu.source import GpuSource


@dataclass
class Mark:
    """The agent's integrals at one moment, right after a tick of its own sampler (so the
    numbers are as fresh as NVML's newest sample, not up to one interval old)."""

    label: str
    mono: float
    metrics: Metrics
    util: dict[str, dict[str, float]]


def mark(agent: Agent, source: GpuSource, name: str) -> Mark:
    """The sampler ticks first, then its accounting is read (Sampler.accounting)."""
    assert source.sampler is not None
    source.sampler.tick()
    mono = time.monotonic()
    util: dict[str, dict[str, float]] = {}
    for uuid, u in source.sampler.accounting().items():
        util[uuid] = {
            "busy": u.busy_seconds,
            "idle": u.idle_seconds,
            "covered": u.covered_seconds,
            "unsampled": u.unsampled_seconds,
            "last_sample_us": float(u.last_sample_us),
            "period_us": u.period_us,
            "dropped": float(u.dropped_samples),
        }
    return Mark(name, mono, scrape(agent), util)


@dataclass
class Phases:
    """What `run_phases` leaves for the checks: the agent's marks at each window's edges, and
    nvidia-smi's GPU rows at the end of each window (`smi_error` where it could not be asked)."""

    marks: dict[str, Mark] = field(default_factory=dict)
    smi_idle: list[dict[str, str]] = field(default_factory=list)
    smi_load: list[dict[str, str]] = field(default_factory=list)
    smi_error: str = ""


def smi_rows(query: str, keys: Sequence[str]) -> list[dict[str, str]]:
    out = subprocess.run(
        ["nvidia-smi", f"{query}={','.join(keys)}", "--format=csv,noheader,nounits"],
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return [
        dict(zip(keys, (v.strip() for v in line.split(",")), strict=True))
        for line in out.strip().splitlines()
        if line.strip()
    ]


SMI_GPU_KEYS = (
    "index",
    "uuid",
    "name",
    "memory.total",
    "driver_version",
    "power.draw",
    "utilization.gpu",
)


def smi_gpus(phases: Phases) -> list[dict[str, str]]:
    if not shutil.which("nvidia-smi"):
        phases.smi_error = "nvidia-smi not on PATH"
        return []
    try:
        return smi_rows("--query-gpu", SMI_GPU_KEYS)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        phases.smi_error = f"nvidia-smi --query-gpu failed: {exc}"
        return []


def run_phases(
    agent: Agent, source: GpuSource, load: Load | None, rec: StreamRecorder, args: Any
) -> Phases:
    """Settle, idle window, then (with a load) settle and the duty window; nvidia-smi is asked
    at the end of each window, while the GPU is in that state."""
    phases = Phases()
    say(f"idle window: {args.idle_seconds:g} s")
    time.sleep(args.settle_seconds)
    phases.marks["idle_start"] = mark(agent, source, "idle_start")
    rec.phase = "idle"
    time.sleep(args.idle_seconds)
    phases.marks["idle_end"] = mark(agent, source, "idle_end")
    phases.smi_idle = smi_gpus(phases)
    if load is None:
        return phases
    rec.phase = "load_settle"
    say(f"duty window: {args.duty_seconds:g} s at {args.duty:.0%} duty ({load.kind} load)")
    load.start()
    if load.error:
        rec.phase = "after"
        return phases
    time.sleep(args.settle_seconds)
    phases.marks["duty_start"] = mark(agent, source, "duty_start")
    rec.phase = "duty"
    time.sleep(args.duty_seconds)
    phases.marks["duty_end"] = mark(agent, source, "duty_end")
    phases.smi_load = smi_gpus(phases)
    load.stop()
    rec.phase = "after"
    return phases
