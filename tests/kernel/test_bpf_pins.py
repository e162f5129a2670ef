"""The probes' lifecycle on the real kernel: pinned by `gpuscope bpf-load`, read by agents
that come and go, replaced when the program changes, removed by `--unload`.

Needs root, BPF, bpffs and tracefs (`make kernel` mounts them), like test_net_kernel.py.
The servers' ports (27111-27114) are below the ephemeral range, as there.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuscope.agent.bpf.family import program_hash
from gpuscope.agent.clock import ManualClock
from gpuscope.agent.net.bpf_program import MapLimits
from gpuscope.agent.net.records import NetSnapshot, PodNetwork
from gpuscope.agent.net.source import NetConfig, NetSource
from gpuscope.agent.runtime.sources import SourceUnavailable
from tests.doubles.netlab import Pod, Pods, finish, wait_ready
from tests.support import REPO
from tests.support.bpf import fresh_pin_root
from tests.support.promtext import Exposition

pytestmark = [
    pytest.mark.kernel,
    pytest.mark.root(reason="eBPF probes, bpffs, cgroups"),
]

HEADERS = REPO / "build" / "kernel-headers" / "debian"
GRACE = 30.0


@pytest.fixture
def pins() -> Iterator[Path]:
    with fresh_pin_root("lifecycle") as root:
        yield root


@pytest.fixture
def pods() -> Iterator[Pods]:
    lab = Pods()
    yield lab
    lab.close()


def source(pins: Path, clock: ManualClock, **config: object) -> NetSource:
    net = NetSource(
        NetConfig(fallback_headers=HEADERS, prune_grace=GRACE, pin_root=pins, **config),  # type: ignore[arg-type]
        clock=clock,
    )
    net.start()
    return net


def collect(net: NetSource) -> NetSnapshot:
    assert isinstance(net.clock, ManualClock)
    net.clock.advance(1.1)  # the cgroup walk is rate-limited to 1/s
    return net.read()


def pod_of(snapshot: NetSnapshot, pod: Pod) -> PodNetwork:
    (found,) = [p for p in snapshot.pods if p.pod_uid == pod.uid]
    return found


def send_udp(pods: Pods, pod: Pod, port: int, datagrams: int, size: int) -> None:
    receiver = pods.run(None, ["udp-server", "127.0.0.1", str(port), str(datagrams)])
    wait_ready(receiver)
    finish(pods.run(pod, ["udp-client", "127.0.0.1", str(port), str(datagrams), str(size)]))
    finish(receiver)


def helper(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuscope", "bpf-load", "--kernel-headers", str(HEADERS), *args],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_a_restarted_agent_keeps_counting_from_where_it_was(pins: Path, pods: Pods) -> None:
    clock = ManualClock(1000.0)
    pod = pods.add()
    first = pods.add_container(pod)
    net = source(pins, clock)
    try:
        send_udp(pods, pod, 27111, 5, 1000)
        send_udp(pods, first, 27111, 10, 1000)
        assert pod_of(collect(net), pod).transmit_bytes == {"udp": 15_000}
        # One container exits and its cgroup goes: its bytes move to the pod's retired
        # totals (kept in the kernel too) once the grace period is over.
        pods.procs.clear()
        first.path.rmdir()
        collect(net)
        clock.advance(GRACE + 1)
        snap = collect(net)
        assert pod_of(snap, pod).transmit_bytes == {"udp": 15_000}
        assert snap.map_entries["traffic"] < 32768
        assert not any(p.container_id == first.container_id for p in snap.pods)
    finally:
        net.stop()  # the agent goes; the pins stay

    send_udp(pods, pod, 27111, 3, 1000)  # while no agent runs: the kernel still counts
    again = source(pins, ManualClock(5000.0))
    try:
        assert pod_of(collect(again), pod).transmit_bytes == {"udp": 18_000}
        send_udp(pods, pod, 27111, 2, 1000)
        assert pod_of(collect(again), pod).transmit_bytes == {"udp": 20_000}
    finally:
        again.stop()


def test_an_agent_killed_and_started_again_keeps_its_counters(pins: Path, pods: Pods) -> None:
    from tests.support.agents import AgentProcess, spawn_agent

    pod = pods.add()
    env = {"GPUSCOPE_BPF_PIN_ROOT": str(pins)}
    args = ("--collectors", "net", "--kernel-headers", str(HEADERS), "--labels-mode", "none")

    def sent(agent_scrape: Exposition) -> float:
        return agent_scrape.value(
            "gpuscope_pod_network_transmit_bytes_total", pod_uid=pod.uid, protocol="udp"
        )

    def first_with_pod(agent: AgentProcess) -> Exposition:
        """The first scrape with the pod's series: a collection runs every few seconds, and
        the cgroup walk may not know the new cgroup yet."""
        deadline = time.monotonic() + 20
        while True:
            scrape = agent.scrape()
            found = scrape.series("gpuscope_pod_network_transmit_bytes_total", pod_uid=pod.uid)
            if found or time.monotonic() > deadline:
                return scrape
            time.sleep(0.2)

    logdir = Path(tempfile.mkdtemp())
    agent = spawn_agent(logdir, *args, env=env)
    try:
        send_udp(pods, pod, 27112, 20, 500)
        agent.wait_ready()
        before = sent(first_with_pod(agent))
        assert before == 10_000, agent.logs()
        assert "running the bpf-load helper" in agent.logs()
    finally:
        os.kill(agent.proc.pid, signal.SIGKILL)
        agent.proc.wait()
        agent.stopped = True

    restarted = spawn_agent(logdir, *args, env=env)
    try:
        after = sent(first_with_pod(restarted))
        assert after >= before, restarted.logs()
        assert after == 10_000
        assert "running the bpf-load helper" not in restarted.logs(), "the pins were reloaded"
    finally:
        restarted.stop()


def test_a_changed_program_replaces_the_old_pins(pins: Path) -> None:
    small = helper("--bpf-pin-root", str(pins), "--bpf-max-cgroups", "64")
    assert small.returncode == 0, small.stderr
    (old,) = [p.name for p in pins.iterdir()]
    again = helper("--bpf-pin-root", str(pins), "--bpf-max-cgroups", "64")
    assert "pins already there" in again.stderr and [p.name for p in pins.iterdir()] == [old]

    bigger = helper("--bpf-pin-root", str(pins), "--bpf-max-cgroups", "128")
    assert bigger.returncode == 0, bigger.stderr
    (new,) = [p.name for p in pins.iterdir()]
    assert new != old and f"removed {old} (another program)" in bigger.stderr
    family = NetConfig(limits=MapLimits(cgroups=128)).family(Path("/"))
    assert new.startswith("net-") and len(new) == len("net-") + len(program_hash(family))


def test_unload_removes_every_pin_and_detaches_the_programs(pins: Path) -> None:
    assert helper("--bpf-pin-root", str(pins)).returncode == 0
    links = [p for d in pins.iterdir() for p in d.iterdir() if p.name.startswith("link_")]
    assert links, "no links pinned"
    unload = helper("--unload", "--bpf-pin-root", str(pins))
    assert unload.returncode == 0, unload.stderr
    assert "removed 1 pin directories" in unload.stderr
    assert not pins.exists()


def test_the_helper_refuses_without_bpffs_in_one_line(tmp_path: Path) -> None:
    result = helper("--bpf-pin-root", str(tmp_path / "pins"))
    assert result.returncode == 1
    (line,) = result.stderr.strip().splitlines()
    assert line == (
        f"gpuscope bpf-load: no bpffs at {tmp_path / 'pins'}; mount it: mount -t bpf bpf "
        f"{tmp_path} (in Kubernetes: a hostPath volume of /sys/fs/bpf)"
    )


def test_an_agent_whose_helper_fails_reports_net_absent_in_one_line(tmp_path: Path) -> None:
    net = NetSource(NetConfig(fallback_headers=HEADERS, pin_root=tmp_path / "pins"))
    with pytest.raises(SourceUnavailable, match=r"^bpf-load helper: no bpffs at "):
        net.start()
