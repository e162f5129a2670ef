"""Shared fixtures: the fake NVML library, an in-process GPU agent on a manual clock, and
the real `gpuscope` binary as a subprocess."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from prometheus_client import generate_latest

from gpuscope.agent.app import Agent
from gpuscope.agent.clock import ManualClock
from gpuscope.agent.config import parse
from gpuscope.agent.gpu.source import GpuSource
from tests.fakenvml.control import FakeNvml, ensure_built
from tests.promtext import Exposition

REPO = Path(__file__).resolve().parents[1]
GPUSCOPE = [sys.executable, "-m", "gpuscope"]
T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z: frozen fake time for deterministic tests


@pytest.fixture(scope="session")
def fake_lib() -> Path:
    return ensure_built()


@dataclass
class InProcess:
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

    def scrape(self) -> Exposition:
        return Exposition(generate_latest(self.agent.registry).decode())

    def scrape_text(self) -> str:
        return generate_latest(self.agent.registry).decode()


@pytest.fixture
def inprocess(fake_lib: Path, tmp_path: Path) -> Iterator[Callable[..., InProcess]]:
    started: list[InProcess] = []

    def start(
        profile: str, *args: str, setup: Callable[[FakeNvml], None] | None = None
    ) -> InProcess:
        fake = FakeNvml(profile, tmp_path / f"{profile}.state", now=T0)
        if setup is not None:
            setup(fake)
        fake.activate()
        clock = ManualClock(T0)
        config = parse(["--listen", "127.0.0.1:0", "--collectors", "gpu", *args], env={})
        agent = Agent(config, clock=clock, background=False)
        handle = InProcess(fake=fake, clock=clock, agent=agent)
        agent.start()
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.agent.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class AgentProcess:
    proc: subprocess.Popen[str]
    port: int
    log_path: Path
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
        return int(self.proc.returncode)


@pytest.fixture
def agent_process(tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    running: list[AgentProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> AgentProcess:
        port = free_port()
        log_path = tmp_path / f"gpuscope-{port}.log"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")}
        full_env.pop("FAKENVML_STATE", None)
        full_env.update(env or {})
        full_env["PYTHONUNBUFFERED"] = "1"
        with log_path.open("w") as log_file:
            proc = subprocess.Popen(
                [*GPUSCOPE, "--listen", f"127.0.0.1:{port}", *args],
                cwd=REPO,
                env=full_env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                text=True,
            )
        handle = AgentProcess(proc=proc, port=port, log_path=log_path)
        running.append(handle)
        handle.wait_ready()
        return handle

    yield start
    for handle in running:
        handle.stop()


@pytest.fixture(autouse=True)
def _fast_xid_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopping the XID thread waits out one nvmlEventSetWait; keep that short in tests."""
    import gpuscope.agent.gpu.xid

    monkeypatch.setattr(gpuscope.agent.gpu.xid, "WAIT_MS", 50)


def wait_for(predicate: Callable[[], bool], timeout: float = 5.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")
