"""Fixtures for every tier: the fake NVML library, an in-process GPU agent on a manual clock,
and the real `gpuscope` binary as a subprocess (thin wrappers over tests/support), plus the
`root` marker: a test marked `root` skips when not run as uid 0, or fails when
GPUSCOPE_REQUIRE_ROOT=1 (tests/README.md)."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuscope.agent.bpf.pins import DEFAULT_PIN_ROOT
from tests.doubles.fakeamdsmi.control import FakeAmdSmi
from tests.doubles.fakenvml.control import FakeNvml, ensure_built
from tests.support import (
    AgentProcess,
    AmdInProcess,
    InProcess,
    require_root,
    spawn_agent,
    start_amd_inprocess,
    start_inprocess,
)
from tests.support.bpf import remove_pins, remove_session_pins

_DEFAULT_PINS_BEFORE = DEFAULT_PIN_ROOT.exists()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Pinned probes outlive the agents that used them: the session's go with it. A test
    that pinned under the default root instead (where a real agent's pins would be, and
    where the next test run would find and read them) fails the session."""
    remove_session_pins()
    if not _DEFAULT_PINS_BEFORE and DEFAULT_PIN_ROOT.exists():
        remove_pins(DEFAULT_PIN_ROOT)
        print(
            f"\nERROR: a test pinned eBPF probes under {DEFAULT_PIN_ROOT}, the default root: "
            "give its agent tests/support/bpf.py's pin_root()",
            file=sys.stderr,
        )
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_runtest_setup(item: pytest.Item) -> None:
    """`@pytest.mark.root(reason)`: checked before any fixture of the test is set up."""
    marker = item.get_closest_marker("root")
    if marker is not None:
        require_root(str(marker.kwargs.get("reason") or (marker.args or ["root"])[0]))


@pytest.fixture(scope="session")
def fake_lib() -> Path:
    return ensure_built()


@pytest.fixture
def inprocess(fake_lib: Path, tmp_path: Path) -> Iterator[Callable[..., InProcess]]:
    """`inprocess(profile, *agent_args, setup=None)`: see support.start_inprocess."""
    started: list[InProcess] = []

    def start(
        profile: str, *args: str, setup: Callable[[FakeNvml], None] | None = None
    ) -> InProcess:
        handle = start_inprocess(tmp_path, profile, *args, setup=setup)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.agent.stop()


@pytest.fixture
def amd_inprocess(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Callable[..., AmdInProcess]]:
    """`amd_inprocess(profile, *agent_args, setup=None)`: see support.start_amd_inprocess.
    The fake's variables are set for the test only. "mi300x" is $GPUSCOPE_TEST_AMD_PROFILE
    where set (control.run_profile); a profile the installed bindings cannot read (another
    release's ABI) skips the test."""
    from tests.doubles.fakeamdsmi import control

    control.ensure_built()
    for name in ("ROCM_PATH", "ROCM_HOME", control.STATE_ENV):
        # Recorded, so teardown restores what was there (or nothing) whatever a start sets.
        monkeypatch.setenv(name, "")
    started: list[AmdInProcess] = []

    def start(
        profile: str, *args: str, setup: Callable[[FakeAmdSmi], None] | None = None
    ) -> AmdInProcess:
        profile = control.run_profile(profile)
        reason = control.unreadable_reason(profile)
        if reason:
            pytest.skip(reason)
        handle = start_amd_inprocess(tmp_path, profile, *args, setup=setup)
        started.append(handle)
        return handle

    yield start
    for handle in started:
        handle.agent.stop()


@pytest.fixture
def agent_process(tmp_path: Path) -> Iterator[Callable[..., AgentProcess]]:
    """`agent_process(*agent_args, env=None)`: see support.spawn_agent; stopped at teardown."""
    running: list[AgentProcess] = []

    def start(*args: str, env: dict[str, str] | None = None) -> AgentProcess:
        handle = spawn_agent(tmp_path, *args, env=env)
        running.append(handle)
        return handle

    yield start
    for handle in running:
        handle.stop()


@pytest.fixture(autouse=True)
def _fast_xid_wait(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stopping the XID thread waits out one nvmlEventSetWait; keep that short in tests."""
    import gpuscope.agent.gpu.xid

    monkeypatch.setattr(gpuscope.agent.gpu.xid, "WAIT_MS", 50)
