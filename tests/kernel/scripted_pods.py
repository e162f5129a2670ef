"""Scripted pods on the real kernel, shared by the kernel tests of pod cgroup signals and of
idle causes: a pod's cgroups in the kubelet's systemd layout, made where a kubelet makes them
(tests/doubles/podcgroups.py: the v2 hierarchy and, on hybrid hosts, the v1 cpu and blkio
mounts beside it), Python processes started inside its container, and the agent's reader
over them."""

from __future__ import annotations

import contextlib
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
from tests.doubles.podcgroups import Cgroup, Hierarchies, set_cpu_limit, spawn_in

WAIT = 30.0  # seconds a signal may take to show (bounded; a loaded machine is slow)


@dataclass
class ScriptedPod:
    uid: str
    roots: CgroupRoots  # where the agent's reader looks
    pod: Cgroup
    container: Cgroup  # its one container's

    def spawn(self, code: str) -> subprocess.Popen[bytes]:
        """A Python process started inside the container's cgroup in every hierarchy."""
        return spawn_in(self.container, [sys.executable, "-c", code])

    def read(self) -> PodCgroupUsage | None:
        return PodCgroupReader(self.roots, interval=0.0).read({self.uid}).get(self.uid)

    def wait_for(self, ok: Callable[[PodCgroupUsage], bool]) -> PodCgroupUsage | None:
        deadline = time.monotonic() + WAIT
        usage = self.read()
        while not (usage is not None and ok(usage)) and time.monotonic() < deadline:
            time.sleep(0.2)
            usage = self.read()
        return usage


@contextlib.contextmanager
def scripted_pod() -> Iterator[ScriptedPod]:
    """A pod with one container, its cgroups removed after (skips without cgroup v2)."""
    roots = CgroupRoots.detect(Path("/sys"))
    if roots.v2 is None:
        pytest.skip("no cgroup v2 hierarchy on this machine")
    hierarchies = Hierarchies.of_host(roots.v2)
    uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex + uuid.uuid4().hex
    top = f"{PREFIX}-signals-{uid[:8]}"
    pod_levels = [
        top,
        "kubepods.slice",
        "kubepods-burstable.slice",
        f"kubepods-burstable-pod{uid.replace('-', '_')}.slice",
    ]
    pod, _ = hierarchies.make(pod_levels)
    try:
        container, _ = hierarchies.make([*pod_levels, f"cri-containerd-{cid}.scope"])
        yield ScriptedPod(uid, roots, pod, container)
    finally:
        hierarchies.remove(top)


def cpu_quota(pod: ScriptedPod) -> None:
    """10 ms of CPU per 100 ms period for the whole pod, as the kubelet sets a pod limit."""
    if not set_cpu_limit(pod.pod, 0.1):
        pytest.skip("no cpu controller for the test cgroup")
