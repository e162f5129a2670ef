"""Host files are read bounded, decoded without failing, and their failures are absent or
counted and logged once per change, never raised (agent/hostfs.py)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpuscope.agent.hostfs import DEFAULT_CAP, FileRead, HostFs, label_text, read_file

# --- content ------------------------------------------------------------------------------


def test_bytes_that_are_not_utf8_read_escaped_and_stay_distinct(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_bytes(b"0::/pod/x\xff\n")
    b.write_bytes(b"0::/pod/x\xfe\n")
    assert read_file(a).text == "0::/pod/x\\xff\n"
    assert read_file(b).text == "0::/pod/x\\xfe\n"
    assert read_file(a).text.encode("utf-8")  # type: ignore[union-attr]


def test_valid_utf8_is_read_as_it_is(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_text("ünïcødé\n", encoding="utf-8")
    assert read_file(path).text == "ünïcødé\n"
    assert read_file(path).problem is None


def test_a_huge_file_is_cut_at_the_cap_flagged_and_never_read_whole(tmp_path: Path) -> None:
    huge = tmp_path / "rx_bytes"
    with huge.open("wb") as f:
        f.write(b"1" * 10)
    os.truncate(huge, 50 * 2**20)  # 50 MB, sparse: reading it whole would cost 50 MB
    read = read_file(huge)
    assert read.problem == "too_large"
    assert read.text is not None and len(read.text) == DEFAULT_CAP
    assert read.usable is None
    assert "larger than 65536 bytes" in read.error
    small = read_file(huge, cap=4)
    assert (small.problem, small.text) == ("too_large", "1111")


def test_a_file_exactly_at_the_cap_is_whole(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"x" * 100)
    assert read_file(path, cap=100).problem is None
    assert read_file(path, cap=99).problem == "too_large"


def test_an_empty_file_is_empty_text_not_a_problem(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(b"")
    assert (read_file(path).text, read_file(path).problem) == ("", None)


# --- files that are not there, or not files ----------------------------------------------------


def test_a_missing_file_is_absent_and_not_a_problem(tmp_path: Path) -> None:
    read = read_file(tmp_path / "gone")
    assert (read.text, read.problem, read.error) == (None, None, "")
    assert read_file(tmp_path / "gone" / "below").problem is None  # ENOENT on the way
    (tmp_path / "file").write_text("x")
    assert read_file(tmp_path / "file" / "below").problem is None  # ENOTDIR


def test_a_symlink_loop_is_a_loop(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    read = read_file(tmp_path / "a")
    assert (read.text, read.problem) == (None, "loop")
    assert "ELOOP" in read.error and str(tmp_path / "a") in read.error


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "speed"
    os.mkfifo(fifo)
    done: list[object] = []
    reader = threading.Thread(target=lambda: done.append(read_file(fifo)), daemon=True)
    reader.start()
    reader.join(timeout=30)  # generous: a blocking open would never return
    assert done, "reading a FIFO blocked"
    read = done[0]
    assert read.problem == "unreadable" and "not a regular file" in read.error  # type: ignore[attr-defined]


def test_a_directory_is_not_a_file(tmp_path: Path) -> None:
    assert read_file(tmp_path).problem == "unreadable"


def test_a_path_no_file_can_have_is_unreadable_not_an_exception(tmp_path: Path) -> None:
    read = read_file(f"{tmp_path}/a\0b")
    assert read.problem == "unreadable" and "null byte" in read.error


def test_errors_that_mean_a_vanished_process_or_device_are_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ESRCH (a process that exited mid-read), ENODEV (a removed device), EINVAL (a down
    link's speed) are no problems; EIO and EACCES are."""
    path = tmp_path / "f"
    path.write_text("1\n")
    real_read = os.read
    for code, problem in (
        (errno.ESRCH, None),
        (errno.ENODEV, None),
        (errno.EINVAL, None),
        (errno.EIO, "unreadable"),
        (errno.EACCES, "unreadable"),
    ):

        def failing(fd: int, n: int, code: int = code) -> bytes:
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(os, "read", failing)
        assert read_file(path).problem == problem, errno.errorcode[code]
    monkeypatch.setattr(os, "read", real_read)
    assert read_file(path).text == "1\n"


@pytest.fixture
def denied_file() -> Iterator[Path]:
    """A file that nobody (uid 65534) may read, in a directory that anybody may enter."""
    with tempfile.TemporaryDirectory() as directory:
        os.chmod(directory, 0o755)
        path = Path(directory) / "cgroup"
        path.write_text("0::/\n")
        path.chmod(0o000)
        yield path


def test_a_denied_file_is_unreadable(denied_file: Path) -> None:
    """A real EACCES: root reads anything, so the file is read by a forked child that drops
    to nobody first (a child that may not switch users is nobody enough already). The child
    imports nothing and opens nothing of the checkout, which may sit in a directory nobody
    cannot enter (a clone under /root or `mktemp -d`)."""
    out = _as_nobody(lambda: _describe(read_file(denied_file)))
    assert out.startswith("unreadable cannot read"), out
    assert "EACCES" in out


def _describe(read: FileRead) -> str:
    return f"{read.problem} {read.error}"


def _as_nobody(task: Callable[[], str]) -> str:
    """Runs `task` in a forked child as uid and gid 65534 and returns what it returned."""
    reader, writer = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop privileges, report, and leave without pytest's cleanup
        status = 1
        try:
            os.close(reader)
            with contextlib.suppress(PermissionError):  # not root: already unprivileged
                os.setgroups([])
                os.setgid(65534)
                os.setuid(65534)
            os.write(writer, task().encode())
            status = 0
        finally:
            os._exit(status)
    os.close(writer)
    with os.fdopen(reader, "rb") as pipe:
        out = pipe.read().decode()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    return out


# --- names ------------------------------------------------------------------------------------


def test_listed_names_become_the_same_escaped_text_as_content(tmp_path: Path) -> None:
    os.mkdir(os.fsencode(tmp_path) + b"/eth\xff0")
    (name,) = os.listdir(tmp_path)
    assert name == "eth\udcff0"  # what Python gives: not encodable as UTF-8
    assert label_text(name) == "eth\\xff0"
    assert label_text("ünï") == "ünï"
    assert label_text("lone\ud800") == "lone\\ud800"


# --- counting and logging ------------------------------------------------------------------


def test_problems_are_counted_and_logged_once_per_change_of_state(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fs = HostFs("nic")
    loop = tmp_path / "statistics"
    loop.symlink_to("statistics")
    caplog.set_level(logging.INFO, logger="gpuscope.hostfs")
    for _ in range(5):
        assert fs.read_int(loop) is None
    assert fs.counts()["loop"] == 5
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].startswith(f"nic: cannot read {loop}")
    loop.unlink()
    loop.write_text("42\n")
    assert fs.read_int(loop) == 42
    assert fs.read_int(loop) == 42
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert infos == [f"nic: {loop} reads again"]
    loop.unlink()
    loop.symlink_to("statistics")
    fs.read(loop)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_an_absent_file_is_neither_counted_nor_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fs = HostFs("rdma")
    assert fs.read_text(tmp_path / "gone") is None
    assert fs.list_dir(tmp_path / "gone") == []
    assert not fs.exists(tmp_path / "gone")
    assert sum(fs.counts().values()) == 0
    assert caplog.records == []


def test_a_log_line_about_a_name_with_bad_bytes_is_valid_text(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bad = Path(os.fsdecode(os.fsencode(tmp_path) + b"/eth\xff0"))
    bad.symlink_to(bad.name)
    fs = HostFs("nic")
    assert not fs.exists(bad)
    (record,) = caplog.records
    assert "eth\\xff0" in record.getMessage()
    record.getMessage().encode("utf-8")


def test_tracked_paths_are_bounded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    fs = HostFs("attribution", max_tracked=3)
    for i in range(10):
        fs.note(f"pid {i}", "invalid", f"process {i}: bad")
    assert len(fs._failing) <= 3
    assert fs.counts()["invalid"] == 10


def test_text_and_integer_attributes(tmp_path: Path) -> None:
    fs = HostFs("nic")
    (tmp_path / "mtu").write_text("9000\n")
    (tmp_path / "flags").write_text("0x1003\n")
    (tmp_path / "speed").write_text("-1\n")
    (tmp_path / "operstate").write_text("up\n")
    (tmp_path / "junk").write_bytes(b"\xff\xfe\n")
    (tmp_path / "cut").write_text("12")
    assert fs.read_int(tmp_path / "mtu") == 9000
    assert fs.read_int(tmp_path / "flags") == 0x1003
    assert fs.read_int(tmp_path / "speed") == -1
    assert fs.read_text(tmp_path / "operstate") == "up"
    assert fs.read_int(tmp_path / "junk") is None
    assert fs.read_text(tmp_path / "junk") == "\\xff\\xfe"
    assert fs.read_int(tmp_path / "cut") == 12  # a value without its newline is still whole


def test_a_counter_past_u64_or_no_number_is_left_out_counted_and_logged_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A kernel counter is a u64: 2**64-1 reads, anything past it (or negative, or not a
    number) is no value a kernel wrote, so it is dropped as `invalid`, never served as a
    counter of 1.8e26."""
    fs = HostFs("nic")
    path = tmp_path / "tx_bytes"
    caplog.set_level(logging.INFO)
    path.write_text(f"{2**64 - 1}\n")
    assert fs.read_counter(path) == 2**64 - 1
    for bad in ("184467440737095516159999999", str(2**64), "-1", "12abc", "0x10"):
        path.write_text(bad + "\n")
        assert fs.read_counter(path) is None, bad
    path.write_text("184467440737095516159999999\n")
    assert fs.read_counter(path) is None
    assert fs.counts()["invalid"] == 6  # each read counted; one line while the path is bad
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [f"nic: {path}: not a u64 counter (0 to 2**64-1); left out"], warnings
    path.write_text("42\n")
    assert fs.read_counter(path) == 42
    assert caplog.records[-1].getMessage() == f"nic: {path} (content) reads again"
    assert fs.read_counter(tmp_path / "absent") is None and fs.counts()["invalid"] == 6
