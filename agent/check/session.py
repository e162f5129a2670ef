"""The agent under test (one accelerator collector only, in this process) and the check's
own NVML session."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any, TypeVar

from gpuscope.agent.amd.source import AmdSource
from gpuscope.agent.app.agent import Agent
from gpuscope.agent.app.config import parse
from gpuscope.agent.check.common import FAIL, Check, say, scrape, value
from gpuscope.agent.gpu.nvml import Nvml
from gpuscope.agent.gpu.source import GpuSource

# Each accelerator collector's sampler-interval flag.
SAMPLE_INTERVAL_FLAG = {"gpu": "--sample-interval", "amd": "--amd-sample-interval"}

S = TypeVar("S", GpuSource, AmdSource)


def agent_argv(args: Any, detail: str, collector: str = "gpu") -> list[str]:
    return [
        "--listen", ":0",
        SAMPLE_INTERVAL_FLAG[collector], f"{args.sample_interval:g}",
        "--collectors", collector,
        "--metrics-detail", detail,
    ]  # fmt: skip


def start_agent(
    args: Any,
    collector: str = "gpu",
    kind: type[S] = GpuSource,  # type: ignore[assignment]
) -> tuple[Agent, S] | Check:
    """The agent with one accelerator collector only (the others need root, BPF or a
    cluster), at full detail: the checks read every series (check_series_budget renders
    the default)."""
    agent = Agent(parse(agent_argv(args, "full", collector), env={}))
    t = time.perf_counter()
    agent.start()
    source = agent.source(collector)
    first = scrape(agent)
    if (
        not isinstance(source, kind)
        or value(first, "gpuscope_collector_success", collector=collector) != 1
    ):
        agent.stop()
        message = f"the {collector} collector did not start (see the log)"
        return Check("agent_start", FAIL, message, {})
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
