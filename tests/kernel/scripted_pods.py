"""Scripted pods on the real kernel, shared by the kernel tests of pod cgroup signals and of
idle causes: a pod's cgroups in the kubelet's systemd layout (the v2 hierarchy and, on hybrid
hosts, the v1 cpu and blkio mounts beside it), Python processes started inside its container,
a CPU quota, and a reader that loops over a file with O_DIRECT."""

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


def enable_v2_controllers(root: Path, levels: list[Path]) -> None:
    """On a unified host, enable cpu and io down to the pod (the kubelet does the same)."""
    wanted = set((root / "cgroup.controllers").read_text().split()) & {"cpu", "io", "memory"}
    for level in [root, *levels[:-1]]:
        for controller in sorted(wanted):
            with contextlib.suppress(OSError):  # already on, or held by a v1 mount
                (level / "cgroup.subtree_control").write_text(f"+{controller}")


@contextlib.contextmanager
def scripted_pod() -> Iterator[ScriptedPod]:
    """A pod with one container, its cgroups removed after (skips without cgroup v2)."""
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
            enable_v2_controllers(root, levels)
        pods[root], containers[root] = levels[-2], levels[-1]
    try:
        yield ScriptedPod(uid, roots, pods, containers)
    finally:
        _remove(made)


def _remove(made: list[Path]) -> None:
    for level in reversed(made):
        for _ in range(50):  # a killed process leaves its cgroup a moment later
            try:
                level.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.1)


def cpu_quota(pod: ScriptedPod) -> None:
    """10 ms of CPU per 100 ms period for the whole pod, as the kubelet sets a pod limit."""
    roots = pod.roots
    if roots.cpu_v1 is not None:
        (pod.pods[roots.cpu_v1] / "cpu.cfs_quota_us").write_text("10000")
    elif roots.v2 is not None and (pod.pods[roots.v2] / "cpu.max").exists():
        (pod.pods[roots.v2] / "cpu.max").write_text("10000 100000")
    else:
        pytest.skip("no cpu controller for the test cgroup")


def whole_disk(dev: int) -> str | None:
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
