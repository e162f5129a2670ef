"""The agent under test (GPU collector only, in this process) and the check's own NVML session."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from gpuscope.agent.app.agent import Agent
from gpuscope.agent.app.config import parse
from gpuscope.agent.check.common import FAIL, Check, say, scrape, value
from gpuscope.agent.gpu.nvml import Nvml
from gpuscope.agent.gpu.source import GpuSource


def agent_argv(args: Any, detail: str) -> list[str]:
    return [
        "--listen", ":0",
        "--sample-interval", f"{args.sample_interval:g}",
        "--collectors", "gpu",
        "--metrics-detail", detail,
    ]  # fmt: skip


def start_agent(args: Any) -> tuple[Agent, GpuSource] | Check:
    """The agent with the GPU collector only (the others need root, BPF or a cluster), at
    full detail: the checks read every series (check_series_budget renders the default)."""
    agent = Agent(parse(agent_argv(args, "full"), env={}))
    t = time.perf_counter()
    agent.start()
    source = agent.source("gpu")
    first = scrape(agent)
    if (
        not isinstance(source, GpuSource)
        or value(first, "gpuscope_collector_success", collector="gpu") != 1
    ):
        agent.stop()
        return Check("agent_start", FAIL, "the GPU collector did not start (see the log)", {})
    say(f"agent ready in {time.perf_counter() - t:.2f} s: {len(source.devices)} GPU(s)")
    return agent, source


@contextlib.contextmanager
def census_nvml() -> Iterator[Nvml]:
    """An NVML session of the script's own, so its calls never count as the agent's errors."""
    nvml = Nvml()
    nvml.init()
    try:
        yield nvml
    finally:
        nvml.shutdown()
