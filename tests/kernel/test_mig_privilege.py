"""In MIG mode the driver answers processes and memory through the parent GPU handle only to
a caller with CAP_SYS_ADMIN, which the DaemonSet does not grant (docs/deploy.md). The fake
NVML models it from the caller's real capabilities, so this runs the agent's GPU source in a
child process without CAP_SYS_ADMIN (capsh), as root, and checks what a user would see:
processes still attributed to their MIG instance, through the MIG device handles."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doubles.fakenvml.control import FakeNvml
from tests.support import REPO

pytestmark = [pytest.mark.kernel, pytest.mark.root("capsh drops a capability of root")]

CHILD = """
import json
from pathlib import Path
from gpuscope.agent.gpu.source import GpuConfig, GpuSource
source = GpuSource(GpuConfig(background=False, sysfs=Path("/nonexistent")))
source.start()
snap = source.read()
gpu = next(r for r in snap.gpus if r.identity.index == 6)
print(json.dumps({
    "processes": [[p.pid, p.used_memory_bytes, p.partition_uuid] for p in gpu.processes],
    "refused": sorted(snap.processes_refused),
    "memory_used": gpu.memory_used_bytes,
    "mig_memory": [m.memory_used_bytes for m in gpu.extension.mig_instances],
}))
source.stop()
"""


def _run(fake: FakeNvml, *, drop_sys_admin: bool) -> dict[str, object]:
    command = [sys.executable, "-c", CHILD]
    if drop_sys_admin:
        command = ["capsh", "--drop=cap_sys_admin", "--", "-c", " ".join(map(_quote, command))]
    env = os.environ | fake.env() | {"PYTHONPATH": str(REPO)}
    out = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(out.stdout.strip().splitlines()[-1]))


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def test_without_cap_sys_admin_mig_processes_come_through_the_mig_handles(
    tmp_path: Path,
) -> None:
    if shutil.which("capsh") is None:
        pytest.fail("capsh missing: `make deps` installs libcap2-bin")
    fake = FakeNvml("hgx-a100-mig", tmp_path / "state")
    mig = fake.mig_devices(6)[0]["uuid"]
    fake.add_process(6, 4242, 3 << 30, mig_uuid=mig)

    privileged = _run(fake, drop_sys_admin=False)
    assert privileged["processes"] == [[4242, 3 << 30, mig]]
    assert privileged["memory_used"] is not None

    unprivileged = _run(fake, drop_sys_admin=True)
    assert unprivileged["processes"] == [[4242, 3 << 30, mig]]  # through the MIG handle
    assert unprivileged["refused"] == []
    assert unprivileged["memory_used"] is None  # the parent's aggregate is refused: absent
    assert any(m for m in unprivileged["mig_memory"])  # per instance still answers


EVENTS_CHILD = """
import json, sys, time
import pynvml as nv
nv.nvmlInit()
h = nv.nvmlDeviceGetHandleByIndex(6)
events = nv.nvmlEventSetCreate()
nv.nvmlDeviceRegisterEvents(h, nv.nvmlEventTypeXidCriticalError, events)
print("ready", flush=True)
got, deadline = [], time.monotonic() + 2.0
while time.monotonic() < deadline:
    try:
        got.append(int(nv.nvmlEventSetWait_v2(events, 100).eventData))
    except nv.NVMLError_Timeout:
        pass
print(json.dumps(sorted(got)))
"""


def _xids_seen(fake: FakeNvml, *, drop_sys_admin: bool) -> list[int]:
    command = [sys.executable, "-c", EVENTS_CHILD]
    if drop_sys_admin:
        command = ["capsh", "--drop=cap_sys_admin", "--", "-c", " ".join(map(_quote, command))]
    env = os.environ | fake.env() | {"PYTHONPATH": str(REPO)}
    with subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "ready"
        fake.inject_xid(6, 31, gpu_instance_id=1, compute_instance_id=0)  # inside a MIG slice
        fake.inject_xid(6, 43)  # the GPU's own
        out = child.stdout.read()
    return list(json.loads(out.strip().splitlines()[-1]))


def test_xids_from_inside_a_mig_slice_need_cap_sys_admin(tmp_path: Path) -> None:
    """The driver delivers events from inside a MIG slice only with CAP_SYS_ADMIN: without
    it the agent cannot count them (gpuscope_gpu_xid_events_watched says only whether the
    registration was accepted; docs/deploy.md states the trade-off)."""
    fake = FakeNvml("hgx-a100-mig", tmp_path / "state")
    assert _xids_seen(fake, drop_sys_admin=False) == [31, 43]
    assert _xids_seen(fake, drop_sys_admin=True) == [43]
