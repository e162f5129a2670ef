"""Per-pod cgroup signals on the real kernel: scripted pods in real cgroups (the kubelet's
systemd layout, in the v2 hierarchy and, on hybrid hosts, the v1 cpu and blkio mounts
beside it). A process that exceeds its pod's CPU quota shows throttling and CPU pressure; a
process reading a file with O_DIRECT shows block I/O bytes and operations."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doubles.podcgroups import (
    CPU_BURNER,
    block_device_file,
    direct_reader,
    set_read_limit,
)
from tests.kernel.scripted_pods import WAIT, ScriptedPod, cpu_quota, scripted_pod

pytestmark = [pytest.mark.kernel, pytest.mark.root(reason="creates cgroups and moves into them")]


@pytest.fixture
def pod() -> Iterator[ScriptedPod]:
    with scripted_pod() as p:
        yield p


def test_a_pod_over_its_cpu_quota_shows_throttling_and_cpu_pressure(pod: ScriptedPod) -> None:
    cpu_quota(pod)
    before = pod.read()
    assert before is not None
    assert before.cpu_throttled_periods == 0 and before.cpu_throttled_seconds == 0
    busy = pod.spawn(CPU_BURNER)
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


def test_a_pod_reading_with_o_direct_shows_io_bytes_and_operations(
    pod: ScriptedPod, tmp_path: Path
) -> None:
    data = tmp_path / "shard.bin"
    size = 8 << 20
    disk = block_device_file(data, size)
    if disk is None:
        pytest.skip(f"{tmp_path} is on no block device, or does not take O_DIRECT")
    if "blkio" in pod.container.v1:
        # Recent kernels count v1 blkio only for bios that pass a throttle rule: set one far
        # above any real rate (a pod with no rule reads 0 there, a documented limitation).
        assert set_read_limit(pod.container, disk, 1 << 40)
    before = pod.read()
    assert before is not None and before.io_read_bytes is not None, before
    reader = pod.spawn(direct_reader(data, loop=False, chunk=1 << 20))
    assert reader.wait(timeout=WAIT) == 0
    usage = pod.wait_for(lambda u: (u.io_read_bytes or 0) - (before.io_read_bytes or 0) >= size)
    assert usage is not None and usage.io_read_bytes is not None
    assert usage.io_read_bytes - (before.io_read_bytes or 0) >= size, usage
    assert (usage.io_read_operations or 0) - (before.io_read_operations or 0) >= size >> 20
    assert usage.io_pressure is not None, usage  # PSI tracks the pod's I/O waits too
