"""The agent under test: in this process on the fake NVML library with time moved by hand
(`InProcess`), or the real `gpuscope` binary as a subprocess (`AgentProcess`)."""

from __future__ import annotations

import os
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from prometheus_client import generate_latest

from gpuscope.agent.amd.source import AmdSource
from gpuscope.agent.app.agent import Agent
from gpuscope.agent.app.config import parse
from gpuscope.agent.clock import ManualClock
from gpuscope.agent.gpu.source import GpuSource
from tests.doubles.fakeamdsmi.control import FakeAmdSmi
from tests.doubles.fakenvml.control import FakeNvml
from tests.support.bpf import pin_root, remove_pins
from tests.support.common import GPUSCOPE, HEADERS, REPO, T0, free_port
from tests.support.promtext import Exposition

if TYPE_CHECKING:
    from tests.doubles.simnode import SimNode


class _Scrapes:
    """/metrics of an in-process agent, as a scrape would have it."""

    agent: Agent

    def scrape(self) -> Exposition:
        return Exposition(self.scrape_text())

    def scrape_text(self) -> str:
        return generate_latest(self.agent.registry).decode()


@dataclass
class InProcess(_Scrapes):
    """An agent in this process: real pynvml over the fake library, time moved by hand."""

    fake: FakeNvml
    clock: ManualClock
    agent: Agent

    @property
    def gpu(self) -> GpuSource:
        source = self.agent.source("gpu")
        assert isinstance(source, GpuSource)
        return source

    def advance(self, seconds: float, *, step: float = 1.0) -> None:
        """Move fake NVML time and the agent's clock together, ticking the sampler per step."""
        assert self.gpu.sampler is not None
        remaining = seconds
        while remaining > 1e-9:
            dt = min(step, remaining)
            self.fake.advance(dt)
            self.clock.advance(dt)
            self.gpu.sampler.tick()
            remaining -= dt


def start_inprocess(
    workdir: Path, profile: str, *args: str, setup: Callable[[FakeNvml], None] | None = None
) -> InProcess:
    """A started GPU agent on fake NVML `profile` (state under `workdir`), clocks at T0;
    `setup` edits the fake before the agent first sees it. The caller stops `agent`."""
    fake = FakeNvml(profile, workdir / f"{profile}.state", now=T0)
    if setup is not None:
        setup(fake)
    fake.activate()
    clock = ManualClock(T0)
    # The test drives the clock by hand: every scrape collects anew (no shared collection).
    base = ["--listen", "127.0.0.1:0", "--collectors", "gpu", "--collection-max-age", "0"]
    config = parse([*base, *args], env={})
    agent = Agent(config, clock=clock, background=False)
    handle = InProcess(fake=fake, clock=clock, agent=agent)
    agent.start()
    return handle


@dataclass
class AmdInProcess(_Scrapes):
    """An agent in this process reading AMD GPUs: the real `amdsmi` bindings over the fake
    libamd_smi.so, time moved by hand. The bindings load the library once per process, at
    import, from $ROCM_PATH; every in-process AMD agent points it at the same fake library,
    and the fake reads the state file $FAKEAMDSMI_STATE names at each amdsmi_init, so each
    test has its own node."""

    fake: FakeAmdSmi
    clock: ManualClock
    agent: Agent

    @property
    def amd(self) -> AmdSource:
        source = self.agent.source("amd")
        assert isinstance(source, AmdSource)
        return source

    def advance(self, seconds: float, *, step: float = 1.0) -> None:
        """Move the fake's time and the agent's clock together, ticking the sampler and
        draining the events per step."""
        assert self.amd.sampler is not None
        remaining = seconds
        while remaining > 1e-9:
            dt = min(step, remaining)
            self.fake.advance(dt)
            self.clock.advance(dt)
            self.amd.sampler.tick()
            if self.amd.events is not None:
                self.amd.events.poll()
            remaining -= dt


def start_amd_inprocess(
    workdir: Path, profile: str, *args: str, setup: Callable[[FakeAmdSmi], None] | None = None
) -> AmdInProcess:
    """A started agent with the `amd` collector on fake AMD SMI `profile`; the caller sets
    the environment from `fake.env()` first (`amd_inprocess` fixture) and stops `agent`."""
    fake = FakeAmdSmi(profile, workdir / f"{profile}.amd-state", now=T0)
    if setup is not None:
        setup(fake)
    os.environ.update(fake.env())
    clock = ManualClock(T0)
    base = ["--listen", "127.0.0.1:0", "--collectors", "amd", "--collection-max-age", "0"]
    agent = Agent(parse([*base, *args], env={}), clock=clock, background=False)
    handle = AmdInProcess(fake=fake, clock=clock, agent=agent)
    agent.start()
    return handle


@dataclass
class AgentProcess:
    proc: subprocess.Popen[str]
    port: int
    log_path: Path
    pin_root: Path | None = None  # its own pinned probes: removed when it stops
    stopped: bool = field(default=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, str]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=10) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as err:
            return err.code, err.read().decode()

    def scrape(self) -> Exposition:
        status, body = self.get("/metrics")
        assert status == 200, body
        return Exposition(body)

    def wait_ready(self, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"gpuscope exited {self.proc.returncode}:\n{self.logs()}")
            try:
                if self.get("/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError(f"gpuscope not ready after {timeout}s:\n{self.logs()}")

    def logs(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self) -> int:
        if not self.stopped:
            self.stopped = True
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
            if self.pin_root is not None:
                remove_pins(self.pin_root)
        return int(self.proc.returncode)


def spawn_agent(logdir: Path, *args: str, env: dict[str, str] | None = None) -> AgentProcess:
    """Start `gpuscope --listen 127.0.0.1:<free port> *args` with this environment minus any
    GPUSCOPE_* and fake NVML settings, plus `env`; return it once /readyz answers. The caller
    stops it."""
    port = free_port()
    log_path = logdir / f"gpuscope-{port}.log"
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")}
    full_env.pop("FAKENVML_STATE", None)
    full_env.update(env or {})
    full_env["PYTHONUNBUFFERED"] = "1"
    # Probes pinned for this agent alone, unpinned when it stops (tests/support/bpf.py).
    own_pins = "GPUSCOPE_BPF_PIN_ROOT" not in full_env
    if own_pins:
        full_env["GPUSCOPE_BPF_PIN_ROOT"] = str(pin_root(f"agent-{port}"))
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            [*GPUSCOPE, "--listen", f"127.0.0.1:{port}", *args],
            cwd=REPO,
            env=full_env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            text=True,
        )
    handle = AgentProcess(
        proc=proc,
        port=port,
        log_path=log_path,
        pin_root=Path(full_env["GPUSCOPE_BPF_PIN_ROOT"]) if own_pins else None,
    )
    try:
        handle.wait_ready()
    except BaseException:
        handle.stop()
        raise
    return handle


def sim_node_args(node: SimNode) -> list[str]:
    """The agent flags that put it on a simulated node: its kubelet socket, kubeconfig and
    node name, the kubelet polled every second, no node labels, the build's kernel headers;
    on an AMD node also its sysfs (the host's, with the partitions' devices added)."""
    args = [
        "--kubelet-socket", str(node.kubelet_socket),
        "--kubeconfig", str(node.kubeconfig),
        "--node-name", node.node_name,
        "--kubelet-interval", "1",
        "--labels-mode", "none",
        "--kernel-headers", str(HEADERS),
    ]  # fmt: skip
    if node.sysfs is not None:
        args += ["--sysfs", str(node.sysfs)]
    return args
