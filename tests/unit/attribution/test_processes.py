"""GPU processes map to pods through /proc/<pid>/cgroup whatever that file holds: bytes that
are not UTF-8, a cut last line, an empty file, a process gone mid-read; a file that cannot be
read drops that process alone, counted by reason, and the others are attributed."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest

from gpuscope.agent import hostfs
from gpuscope.agent.attribution.processes import HOST_PROCESS, Dropped, process_pod
from gpuscope.agent.attribution.stage import Attributor
from gpuscope.agent.clock import ManualClock
from gpuscope.agent.gpu.records import GpuProcess, GpuReading
from gpuscope.agent.hostfs import HostFs
from gpuscope.agent.k8s.cgroups import PodCgroup
from gpuscope.agent.runtime.sources import Collection, SourceResult
from tests.support import gpu_records

UID = "eadf4777-07b8-449a-873e-2a219705c38d"
CID = "a" * 64
POD_SLICE = (
    "/kubepods.slice/kubepods-burstable.slice/"
    f"kubepods-burstable-pod{UID.replace('-', '_')}.slice/cri-containerd-{CID}.scope"
)
IN_POD = PodCgroup(pod_uid=UID, container_id=CID, qos="burstable", runtime="containerd")
GIB = 2**30


def proc(procfs: Path, pid: int, content: bytes) -> Path:
    (procfs / str(pid)).mkdir(parents=True, exist_ok=True)
    path = procfs / str(pid) / "cgroup"
    path.write_bytes(content)
    return path


@pytest.fixture
def fs() -> HostFs:
    return HostFs("attribution")


# --- one process --------------------------------------------------------------------------


def test_a_child_cgroup_named_with_bytes_that_are_not_utf8_still_names_its_pod(
    tmp_path: Path, fs: HostFs
) -> None:
    """Any pod can create `<its container>/\\xff`: the pod and container parts still parse."""
    proc(tmp_path, 10, f"0::{POD_SLICE}/worker\xff".encode("latin-1") + b"\n")
    assert process_pod(tmp_path, 10, fs) == IN_POD
    assert sum(fs.counts().values()) == 0


def test_bytes_that_are_not_utf8_in_the_pod_slice_make_no_pod_up(
    tmp_path: Path, fs: HostFs
) -> None:
    """A slice the kubelet did not write (a bad byte inside its name) is no pod: a host
    process, never a crash."""
    bad = POD_SLICE.replace("burstable-pod", "burstable-pod\xff").encode("latin-1")
    proc(tmp_path, 11, b"0::" + bad + b"\n")
    assert process_pod(tmp_path, 11, fs) == HOST_PROCESS


def test_a_cut_last_line_is_left_out_and_the_lines_before_it_count(
    tmp_path: Path, fs: HostFs
) -> None:
    """A hybrid host's v1 lines come first; a copy cut inside the v2 line still has them."""
    full = f"12:memory:{POD_SLICE}\n0::{POD_SLICE}\n".encode()
    proc(tmp_path, 12, full[:-20])
    assert process_pod(tmp_path, 12, fs) == IN_POD
    # Cut inside the only line: that line could name a different (shorter) cgroup: absent.
    proc(tmp_path, 13, f"0::{POD_SLICE}\n".encode()[:-30])
    assert process_pod(tmp_path, 13, fs) is None


def test_an_empty_file_is_a_process_that_exited(tmp_path: Path, fs: HostFs) -> None:
    proc(tmp_path, 14, b"")
    assert process_pod(tmp_path, 14, fs) is None
    assert sum(fs.counts().values()) == 0


def test_a_process_that_exits_between_listing_and_reading_is_skipped_uncounted(
    tmp_path: Path, fs: HostFs, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = proc(tmp_path, 15, f"0::{POD_SLICE}\n".encode())
    real_open = os.open

    def exits_first(file: str | Path, flags: int, *args: int) -> int:
        if os.fspath(file) == os.fspath(path):
            path.unlink()  # NVML listed it, then it exited: /proc/<pid> is gone
            path.parent.rmdir()
        return real_open(file, flags, *args)

    monkeypatch.setattr(hostfs.os, "open", exits_first)
    assert process_pod(tmp_path, 15, fs) is None
    assert sum(fs.counts().values()) == 0


def test_a_read_refused_with_esrch_mid_read_is_a_process_that_exited(
    tmp_path: Path, fs: HostFs, monkeypatch: pytest.MonkeyPatch
) -> None:
    proc(tmp_path, 16, f"0::{POD_SLICE}\n".encode())

    def gone(fd: int, n: int) -> bytes:
        raise ProcessLookupError(3, "No such process")

    monkeypatch.setattr(hostfs.os, "read", gone)
    assert process_pod(tmp_path, 16, fs) is None
    assert sum(fs.counts().values()) == 0


def test_a_symlink_loop_drops_the_process_as_loop(tmp_path: Path, fs: HostFs) -> None:
    (tmp_path / "17").mkdir()
    (tmp_path / "17" / "cgroup").symlink_to("cgroup")
    assert process_pod(tmp_path, 17, fs) == Dropped("loop")
    assert fs.counts()["loop"] == 1


def test_a_huge_file_drops_the_process_as_too_large_without_reading_it(
    tmp_path: Path, fs: HostFs
) -> None:
    path = proc(tmp_path, 18, f"0::{POD_SLICE}\n".encode())
    os.truncate(path, 50 * 2**20)
    assert process_pod(tmp_path, 18, fs) == Dropped("too_large")
    assert fs.counts()["too_large"] == 1


def test_a_denied_file_drops_the_process_as_unreadable_not_as_a_host_process(
    tmp_path: Path, fs: HostFs, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Calling it a host process would add its memory to the unallocated figure: a guess."""
    path = proc(tmp_path, 19, f"0::{POD_SLICE}\n".encode())
    real_open = os.open

    def denied(file: str | Path, flags: int, *args: int) -> int:
        if os.fspath(file) == os.fspath(path):
            raise PermissionError(13, "Permission denied")
        return real_open(file, flags, *args)

    monkeypatch.setattr(hostfs.os, "open", denied)
    assert process_pod(tmp_path, 19, fs) == Dropped("unreadable")
    assert fs.counts()["unreadable"] == 1


# --- the stage: one bad process costs only itself ---------------------------------------------


def gpu_collection(pids: list[int]) -> Collection:
    identity = gpu_records.identity(0, "GPU-0", "H100")
    reading = GpuReading(
        identity=identity,
        up=True,
        processes=tuple(GpuProcess(pid, GIB, 0.5) for pid in pids),
    )
    snapshot = gpu_records.snapshot((reading,))
    return Collection(
        results={"gpu": SourceResult("gpu", snapshot, True, 0.01)}, collected_at=1000.0
    )


def test_one_unreadable_process_is_dropped_and_counted_and_the_others_are_attributed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    proc(tmp_path, 20, f"0::{POD_SLICE}\n".encode())
    (tmp_path / "21").mkdir()
    (tmp_path / "21" / "cgroup").symlink_to("cgroup")  # a loop
    proc(tmp_path, 22, b"0::/system.slice/sshd\xff.service\n")  # a host process, bad byte
    attributor = Attributor(tmp_path, clock=ManualClock(1000.0))
    caplog.set_level(logging.WARNING)
    for scrape in range(1, 4):
        att = attributor.attribute(gpu_collection([20, 21, 22]))
        by_pod = {u.pod.uid: u.memory_bytes for u in att.usage}
        assert by_pod == {UID: GIB, "": GIB}  # pid 21 is on no series, not on the host's
        assert att.dropped == {"unreadable": 0, "loop": scrape, "too_large": 0, "invalid": 0}
    warnings = [r.getMessage() for r in caplog.records if r.name == "gpuscope.attribution"]
    assert len(warnings) == 1, warnings  # once per change of state, not per scrape
    assert warnings[0].startswith(f"attribution: cannot read {tmp_path / '21' / 'cgroup'}")


def test_a_parser_failure_on_one_process_costs_that_process_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from gpuscope.agent.attribution import processes

    proc(tmp_path, 30, f"0::{POD_SLICE}\n".encode())
    proc(tmp_path, 31, b"0::/hostile\n")
    real = processes.parse_proc_cgroup

    def fragile(text: str) -> PodCgroup | None:
        if "hostile" in text:
            raise IndexError("a parser bug")
        return real(text)

    monkeypatch.setattr(processes, "parse_proc_cgroup", fragile)
    attributor = Attributor(tmp_path, clock=ManualClock(1000.0))
    att = attributor.attribute(gpu_collection([30, 31]))
    assert [u.pod.uid for u in att.usage] == [UID]
    assert att.dropped["invalid"] == 1
    assert "process 31: IndexError: a parser bug" in caplog.text
