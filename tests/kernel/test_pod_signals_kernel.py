"""Per-pod cgroup signals on the real kernel: scripted pods in real cgroups (the kubelet's
systemd layout, in the v2 hierarchy and, on hybrid hosts, the v1 cpu and blkio mounts
beside it). A process that exceeds its pod's CPU quota shows throttling and CPU pressure; a
process reading a file with O_DIRECT shows block I/O bytes and operations."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuscope.agent.k8s.pod_cgroup_usage import CgroupRoots, PodCgroupReader, PodCgroupUsage
from tests.doubles.netlab import PREFIX

pytestmark = [pytest.mark.kernel, pytest.mark.root(reason="creates cgroups and moves into them")]

WAIT = 30.0  # seconds a signal may take to show (bounded; a loaded machine is slow)


@dataclass
class ScriptedPod:
    uid: str
    roots: CgroupRoots
    pods: dict[Path, Path]  # hierarchy root -> the pod's cgroup
    containers: dict[Path, Path]  # hierarchy root -> its container's cgroup

    def spawn(self, code: str) -> subprocess.Popen[bytes]:
        """A Python process started inside the container's cgroup in every hierarchy."""
        targets = [
            c / ("cgroup.procs" if root == self.roots.v2 else "tasks")
            for root, c in self.containers.items()
        ]

        def enter() -> None:
            for target in targets:
                target.write_text(str(os.getpid()))

        return subprocess.Popen([sys.executable, "-c", code], preexec_fn=enter)

    def read(self) -> PodCgroupUsage | None:
        return PodCgroupReader(self.roots, interval=0.0).read({self.uid}).get(self.uid)

    def wait_for(self, ok: Callable[[PodCgroupUsage], bool]) -> PodCgroupUsage | None:
        deadline = time.monotonic() + WAIT
        usage = self.read()
        while not (usage is not None and ok(usage)) and time.monotonic() < deadline:
            time.sleep(0.2)
            usage = self.read()
        return usage


def _enable_v2_controllers(root: Path, levels: list[Path]) -> None:
    """On a unified host, enable cpu and io down to the pod (the kubelet does the same)."""
    wanted = set((root / "cgroup.controllers").read_text().split()) & {"cpu", "io", "memory"}
    for level in [root, *levels[:-1]]:
        for controller in sorted(wanted):
            with contextlib.suppress(OSError):  # already on, or held by a v1 mount
                (level / "cgroup.subtree_control").write_text(f"+{controller}")


@pytest.fixture
def pod() -> Iterator[ScriptedPod]:
    roots = CgroupRoots.detect(Path("/sys"))
    if roots.v2 is None:
        pytest.skip("no cgroup v2 hierarchy on this machine")
    uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    relative = [
        f"{PREFIX}-signals-{uid[:8]}",
        "kubepods.slice",
        "kubepods-burstable.slice",
        f"kubepods-burstable-pod{uid.replace('-', '_')}.slice",
        f"cri-containerd-{cid}.scope",
    ]
    hierarchies = [r for r in (roots.v2, roots.cpu_v1, roots.blkio_v1) if r is not None]
    made: list[Path] = []
    pods, containers = {}, {}
    for root in hierarchies:
        levels = [root.joinpath(*relative[: i + 1]) for i in range(len(relative))]
        for level in levels:
            level.mkdir(exist_ok=True)
            made.append(level)
        if root == roots.v2:
            _enable_v2_controllers(root, levels)
        pods[root], containers[root] = levels[-2], levels[-1]
    scripted = ScriptedPod(uid, roots, pods, containers)
    yield scripted
    for level in reversed(made):
        for _ in range(50):  # a killed process leaves its cgroup a moment later
            try:
                level.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


def _cpu_quota(pod: ScriptedPod) -> None:
    """10 ms of CPU per 100 ms period for the whole pod, as the kubelet sets a pod limit."""
    roots = pod.roots
    if roots.cpu_v1 is not None:
        (pod.pods[roots.cpu_v1] / "cpu.cfs_quota_us").write_text("10000")
    elif roots.v2 is not None and (pod.pods[roots.v2] / "cpu.max").exists():
        (pod.pods[roots.v2] / "cpu.max").write_text("10000 100000")
    else:
        pytest.skip("no cpu controller for the test cgroup")


def test_a_pod_over_its_cpu_quota_shows_throttling_and_cpu_pressure(pod: ScriptedPod) -> None:
    _cpu_quota(pod)
    before = pod.read()
    assert before is not None
    assert before.cpu_throttled_periods == 0 and before.cpu_throttled_seconds == 0
    busy = pod.spawn("while True: pass")
    try:
        usage = pod.wait_for(
            lambda u: (
                bool(u.cpu_throttled_periods)
                and (u.cpu_throttled_seconds or 0) > 0.05
                and u.cpu_pressure is not None
                and u.cpu_pressure.some_seconds > 0.05
            )
        )
    finally:
        busy.kill()
        busy.wait()
    assert usage is not None, "the pod's cgroup was not found"
    assert usage.cpu_throttled_periods, usage
    assert (usage.cpu_throttled_seconds or 0) > 0.05, usage
    assert usage.cpu_pressure is not None and usage.cpu_pressure.some_seconds > 0.05, usage


def _whole_disk(dev: int) -> str | None:
    """`MAJ:MIN` of the disk holding a file (the partition's parent), None off a disk."""
    block = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not block.exists():
        return None
    if (block / "partition").exists():
        block = block.resolve().parent
    return (block / "dev").read_text().strip()


READ_DIRECT = """
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY | os.O_DIRECT)
buf = mmap.mmap(-1, 1 << 20)  # O_DIRECT needs a page-aligned buffer
while os.readv(fd, [buf]) > 0:
    pass
"""


def test_a_pod_reading_with_o_direct_shows_io_bytes_and_operations(
    pod: ScriptedPod, tmp_path: Path
) -> None:
    data = tmp_path / "shard.bin"
    size = 8 << 20
    with data.open("wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    disk = _whole_disk(data.stat().st_dev)
    if disk is None:
        pytest.skip(f"{tmp_path} is not on a block device")
    roots = pod.roots
    if roots.blkio_v1 is not None:
        # Recent kernels count v1 blkio only for bios that pass a throttle rule: set one far
        # above any real rate (a pod with no rule reads 0 there, a documented limitation).
        rule = pod.containers[roots.blkio_v1] / "blkio.throttle.read_bps_device"
        rule.write_text(f"{disk} {1 << 40}")
    before = pod.read()
    assert before is not None and before.io_read_bytes is not None, before
    reader = pod.spawn(READ_DIRECT.replace("sys.argv[1]", repr(str(data))))
    assert reader.wait(timeout=WAIT) == 0
    usage = pod.wait_for(lambda u: (u.io_read_bytes or 0) - (before.io_read_bytes or 0) >= size)
    assert usage is not None and usage.io_read_bytes is not None
    assert usage.io_read_bytes - (before.io_read_bytes or 0) >= size, usage
    assert (usage.io_read_operations or 0) - (before.io_read_operations or 0) >= size >> 20
    assert usage.io_pressure is not None, usage  # PSI tracks the pod's I/O waits too
