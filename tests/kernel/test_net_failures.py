"""When the eBPF probes cannot load, the network collector says why in one line and every
other collector keeps working; a GPU-only agent never loads bcc."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.doubles.fakenvml.control import FakeNvml
from tests.support import GPUSCOPE, HEADERS, REPO, AgentProcess, free_port
from tests.support.bpf import pin_root, remove_pins

pytestmark = [pytest.mark.kernel, pytest.mark.e2e]
ROOT = pytest.mark.root(reason="the agent loads eBPF probes; capsh drops capabilities")


def start_agent(
    tmp_path: Path, args: list[str], env: dict[str, str], *, drop_caps: str = ""
) -> AgentProcess:
    port = free_port()
    log_path = tmp_path / "agent.log"
    # Pins of its own (no other test's to find and read), removed when it stops.
    pins = pin_root(f"failures-{port}")
    full = [*GPUSCOPE, *args, "--listen", f"127.0.0.1:{port}", "--bpf-pin-root", str(pins)]
    if drop_caps:
        full = ["capsh", f"--drop={drop_caps}", "--", "-c", f"exec {shlex.join(full)}"]
    with log_path.open("w") as log_file:
        proc = subprocess.Popen(
            full, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT, text=True
        )
    agent = AgentProcess(proc=proc, port=port, log_path=log_path, pin_root=pins)
    agent.wait_ready(timeout=60)
    return agent


def fake_env(tmp_path: Path) -> dict[str, str]:
    fake = FakeNvml("pcie-l40s", tmp_path / "state")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUSCOPE_", "BCC_"))}
    return env | fake.env() | {"PYTHONUNBUFFERED": "1"}


def failing_line(agent: AgentProcess) -> str:
    lines = [line for line in agent.logs().splitlines() if "collector net failed" in line]
    assert len(lines) == 1, agent.logs()
    return lines[0]


@ROOT
def test_without_cap_bpf_the_net_collector_fails_and_the_gpu_collector_works(
    fake_lib, tmp_path: Path
) -> None:
    args = ["--collectors", "gpu,net", "--kernel-headers", str(HEADERS)]
    agent = start_agent(
        tmp_path, args, fake_env(tmp_path), drop_caps="cap_bpf,cap_perfmon,cap_sys_admin"
    )
    try:
        m = agent.scrape()
        assert m.value("gpuscope_collector_success", collector="net") == 0
        assert m.value("gpuscope_collector_success", collector="gpu") == 1
        assert len(m.series("gpuscope_gpu_up")) == 4
        line = failing_line(agent)
        # The agent found no pins and ran the helper, with its own (missing) capabilities.
        assert (
            "bpf-load helper: missing capabilities CAP_BPF, CAP_PERFMON (or CAP_SYS_ADMIN)" in line
        )
    finally:
        assert agent.stop() == 0


@ROOT
def test_without_a_kernel_header_tree_the_net_collector_says_where_it_looked(
    fake_lib, tmp_path: Path
) -> None:
    args = ["--collectors", "gpu,net", "--kernel-modules", str(tmp_path / "modules"),
            "--kernel-headers", str(tmp_path / "headers")]  # fmt: skip
    agent = start_agent(tmp_path, args, fake_env(tmp_path))
    try:
        m = agent.scrape()
        assert m.value("gpuscope_collector_success", collector="net") == 0
        assert m.value("gpuscope_collector_success", collector="gpu") == 1
        line = failing_line(agent)
        assert "no kernel header tree: looked at $BCC_KERNEL_SOURCE" in line
        assert str(tmp_path / "headers") in line
    finally:
        assert agent.stop() == 0


@ROOT
def test_net_collector_loads_and_serves_pod_series_in_the_real_binary(
    fake_lib, tmp_path: Path
) -> None:
    args = ["--collectors", "gpu,net", "--kernel-headers", str(HEADERS)]
    agent = start_agent(tmp_path, args, fake_env(tmp_path))
    try:
        agent.get("/metrics")  # some host traffic of our own
        time.sleep(1.2)  # past --collection-max-age: the next scrape collects anew
        m = agent.scrape()
        assert m.value("gpuscope_collector_success", collector="net") == 1
        modes = m.by_label("gpuscope_bpf_probe_info", "mode")
        assert set(modes) == {"tracepoint"}
        assert m.value("gpuscope_pod_network_receive_bytes_total", pod_uid="", protocol="tcp") > 0
    finally:
        assert agent.stop() == 0


@ROOT
def test_an_agent_with_the_net_collector_up_never_imports_bcc(fake_lib: Path) -> None:
    pins = pin_root("no-bcc")
    code = (
        "import sys, pathlib; from gpuscope.agent.app.agent import Agent;"
        "from gpuscope.agent.app.config import parse;"
        "a = Agent(parse(['--listen', ':0', '--collectors', 'gpu,net,nic,rdma', '--kernel-headers',"
        f" {str(HEADERS)!r}, '--bpf-pin-root', {str(pins)!r}], env={{}}));"
        "a.start(); text = a.collector.render_text(); a.stop();"
        "maps = pathlib.Path('/proc/self/maps').read_text();"
        "print(b'collector=\"net\"} 1' in text, 'bcc' in sys.modules,"
        " any(lib in maps for lib in ('libLLVM', 'libclang', 'libbcc')))"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
            check=False, timeout=120,
        )  # fmt: skip
    finally:
        remove_pins(pins)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == "True False False", done.stderr[-3000:]
