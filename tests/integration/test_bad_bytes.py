"""Bad bytes and hostile files under the host roots, end to end: the real agent in this
process on the fake 8-GPU node, a fixture /proc and /sys, served by the real HTTP server.

Found by the issue: one process in a cgroup whose name is not UTF-8 made every /metrics an
HTTP 500, and so did one NIC so named. Now /metrics answers, every process that can be read
is attributed (that one too: the pod's part of its path is intact), a process whose cgroup
file cannot be read is dropped and counted, and the NIC is exported under an escaped name.
"""

from __future__ import annotations

import http.client
import logging
import os
import shutil
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from gpuscope.agent.serve.server import MetricsServer
from tests.doubles.make_sysfs import write_tree
from tests.support import InProcess
from tests.support.promtext import Exposition

GIB = 2**30
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


def cgroup_of(pod_uid: str, container_id: str) -> str:
    return (
        "/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{pod_uid.replace('-', '_')}.slice/"
        f"cri-containerd-{container_id}.scope"
    )


def process(procfs: Path, pid: int, cgroup: bytes) -> Path:
    (procfs / str(pid)).mkdir(parents=True)
    path = procfs / str(pid) / "cgroup"
    path.write_bytes(b"0::" + cgroup + b"\n")
    return path


def bad_nic(sysfs: Path) -> None:
    """A second netdev on eno2's PCI function named b"eth\\xff0"."""
    original = (sysfs / "class/net/eno2").resolve()
    copy = Path(os.fsdecode(os.fsencode(original.parent) + b"/eth\xff0"))
    shutil.copytree(original, copy, symlinks=True)
    link = Path(os.fsdecode(os.fsencode(sysfs / "class/net") + b"/eth\xff0"))
    link.symlink_to(os.path.relpath(copy, link.parent))


def get(port: int, path: str, accept: str = "") -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request("GET", path, headers={"Accept": accept} if accept else {})
        answer = conn.getresponse()
        return answer.status, answer.read().decode("utf-8")
    finally:
        conn.close()


@pytest.fixture
def served() -> Iterator[Callable[[InProcess], MetricsServer]]:
    servers: list[MetricsServer] = []

    def serve(env: InProcess) -> MetricsServer:
        agent = env.agent
        server = MetricsServer(
            ("127.0.0.1", 0), agent.registry, agent.collector.render_text, lambda: agent.ready
        )
        server.start()
        servers.append(server)
        return server

    yield serve
    for server in servers:
        server.stop()


def test_bad_bytes_under_proc_and_sys_cost_no_scrape_and_no_other_name(
    inprocess: Callable[..., InProcess],
    served: Callable[[InProcess], MetricsServer],
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    procfs, sysfs = tmp_path / "proc", write_tree(tmp_path / "sys")
    bad_nic(sysfs)
    normal_uid, odd_uid = str(uuid.uuid4()), str(uuid.uuid4())
    normal_cid, odd_cid = uuid.uuid4().hex * 2, uuid.uuid4().hex * 2
    process(procfs, 4001, cgroup_of(normal_uid, normal_cid).encode())
    # A child cgroup the pod made itself, named with a byte that is not UTF-8.
    process(procfs, 4002, cgroup_of(odd_uid, odd_cid).encode() + b"/worker\xff")
    looping = procfs / "4003" / "cgroup"
    looping.parent.mkdir()
    looping.symlink_to("cgroup")

    def setup(fake: Any) -> None:
        fake.add_process(0, 4001, 10 * GIB, sm_util=50)
        fake.add_process(1, 4002, 5 * GIB, sm_util=20)
        fake.add_process(2, 4003, 3 * GIB, sm_util=10)

    caplog.set_level(logging.WARNING)
    env = inprocess(
        "dgx-h100", "--collectors", "gpu,nic", "--procfs", str(procfs), "--sysfs", str(sysfs),
        "--collection-max-age", "0", setup=setup,
    )  # fmt: skip
    server = served(env)

    drops: list[float] = []
    for _ in range(3):
        env.advance(1)
        status, body = get(server.port, "/metrics")
        assert status == 200, body[:2000]
        m = Exposition(body)
        memory = {
            (k["gpu"], k["pod_uid"], k["container"]): v
            for k, v in m.rows("gpuscope_pod_gpu_memory_bytes")
        }
        # Both readable processes are attributed to their pods (no API here: uids only);
        # the unreadable one is on no series, not guessed onto the host.
        assert set(memory) == {("0", normal_uid, ""), ("1", odd_uid, "")}
        assert memory[("0", normal_uid, "")] == 10 * GIB
        assert m.value("gpuscope_collector_success", collector="nic") == 1
        assert m.get("gpuscope_nic_up", device="eth\\xff0") is not None
        drops.append(m.value("gpuscope_inputs_dropped_total", stage="attribution", reason="loop"))
        assert (
            m.value("gpuscope_inputs_dropped_total", stage="attribution", reason="unreadable") == 0
        )
    # A counter: every collection reads the process's file again, and drops it again.
    assert drops[0] >= 1 and drops == [drops[0], drops[0] + 1, drops[0] + 2]

    status, body = get(server.port, "/metrics", accept=OPENMETRICS)
    assert status == 200
    assert 'gpuscope_nic_up{device="eth\\\\xff0"}' in body
    assert body.endswith("# EOF\n")

    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    about = [w for w in warnings if str(looping) in w]
    assert len(about) == 1, warnings  # one line for the change of state, not one per scrape
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"
