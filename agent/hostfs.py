"""Reading the host's files (under --procfs, --sysfs and the cgroup mount) without trusting them.

Everything under those roots is written by the kernel on behalf of someone else, and some of
it by anyone: any pod can create a cgroup whose name holds bytes that are not UTF-8, a
container runtime can leave a symlink loop, a fixture or a broken driver can present a huge
file or a FIFO where an attribute should be. A source or stage reading one such file must
lose that value, never its whole collection or the scrape. So every read here:

- never raises: the result says what was there (`FileRead`);
- is bounded: at most `cap` bytes (64 KiB by default, far above any sysfs attribute, which
  the kernel limits to a page, and any `/proc/<pid>/cgroup`); a longer file is cut there,
  flagged `too_large` and never read whole. Only regular files are read, and opened
  non-blocking, so a FIFO or device node under a root cannot hang a scrape;
- decodes with `errors="backslashreplace"`: a byte that is not UTF-8 becomes the four
  characters `\\xff`, so the text is valid UTF-8 (a label value, a log line) and two
  different bad bytes stay two different names (`errors="replace"` would merge them). A
  name that really contains a backslash followed by `xff` reads the same: that collision
  needs a name built to cause it, and costs only that name's identity;
- treats a file that vanished (ENOENT, ESRCH for a process that exited, ENODEV for a device
  that was removed, ENOTDIR) or a value the driver does not have (EINVAL, EOPNOTSUPP,
  ENODATA: `speed` on a down link) as *absent*: normal on a busy node, not counted, not
  logged;
- treats a symlink loop (ELOOP, `loop`), a permission or I/O error (`unreadable`) and an
  oversized file (`too_large`) as a *problem*: counted by reason and logged once when a
  path starts failing or fails differently (and once when it reads again), never once per
  scrape.

Directory listings give names with surrogate escapes for bytes that are not UTF-8 (Python's
file system encoding); `label_text` turns such a name into the same escaped text as the file
reads give, while the `Path` keeps the real bytes for reading.
"""

from __future__ import annotations

import errno
import logging
import os
import stat
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

log = logging.getLogger("gpuscope.hostfs")

Reason = Literal["unreadable", "loop", "too_large", "invalid"]
# Every reason a read (or the parse after it, "invalid") can drop an input for, in the order
# they are exported. "invalid" is the caller's: content that was read but could not be used.
REASONS: tuple[Reason, ...] = ("unreadable", "loop", "too_large", "invalid")

DEFAULT_CAP = 64 * 1024  # bytes read from one file at most
# The kernel's counters are u64 (netdev statistics, RDMA counters, cgroup event and stat
# counts): a value past it, or negative, is no counter a kernel wrote.
U64_MAX = 2**64 - 1
MAX_TRACKED = 4096  # paths whose failing state is remembered (beyond: forgotten, re-logged)

# A file or device that is gone, or a value the kernel or driver does not have right now.
_ABSENT = frozenset(
    {
        errno.ENOENT,
        errno.ESRCH,
        errno.ENOTDIR,
        errno.ENODEV,
        errno.ENXIO,
        errno.EINVAL,
        errno.EOPNOTSUPP,
        errno.ENODATA,
        errno.EAGAIN,
    }
)
_CHUNK = 16 * 1024


@dataclass(frozen=True, slots=True)
class FileRead:
    """What one bounded read found.

    `text` is the content (bad bytes escaped), None when the file is absent or could not be
    read; for `too_large` it is the first `cap` bytes, which callers should not trust as a
    value. `error` is one line for the log, "" unless there is a problem.
    """

    text: str | None
    problem: Reason | None = None
    error: str = ""

    @property
    def usable(self) -> str | None:
        """The text when it is whole: None when absent, failed or cut at the cap."""
        return self.text if self.problem is None else None


ABSENT = FileRead(None)


def label_text(name: str) -> str:
    """A file name from a listing (surrogate-escaped bytes) as valid UTF-8 text, each byte
    that is not UTF-8 written `\\xNN`, exactly as `read_file` writes them in content."""
    try:
        return os.fsencode(name).decode("utf-8", "backslashreplace")
    except UnicodeError:  # a lone surrogate not made by the file system decoder
        return name.encode("utf-8", "backslashreplace").decode("utf-8")


def show(path: Path | str) -> str:
    """A path for a log line: valid text whatever bytes it holds (logging a surrogate fails
    in the handler, not here, and loses the line)."""
    return label_text(os.fspath(path))


def problem_of(exc: OSError) -> Reason | None:
    """None for "absent" errors, else the reason it is counted under."""
    if exc.errno in _ABSENT:
        return None
    if exc.errno == errno.ELOOP:
        return "loop"
    return "unreadable"


def _describe(path: Path | str, exc: OSError) -> str:
    name = errno.errorcode.get(exc.errno or 0, "error")
    return f"cannot read {show(path)}: {exc.strerror or exc} ({name})"


def read_file(path: Path | str, cap: int = DEFAULT_CAP) -> FileRead:
    """At most `cap` bytes of a regular file, decoded; never raises (see the module doc)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        return _failed(path, exc)
    except ValueError as exc:  # a NUL in the path: no file can have that name
        return FileRead(None, "unreadable", f"cannot read {show(path)}: {exc}")
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            return FileRead(None, "unreadable", f"cannot read {show(path)}: not a regular file")
        chunks: list[bytes] = []
        size = 0
        while size <= cap:
            chunk = os.read(fd, min(_CHUNK, cap + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as exc:
        return _failed(path, exc)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    text = data[:cap].decode("utf-8", "backslashreplace")
    if size > cap:
        return FileRead(text, "too_large", f"{show(path)} is larger than {cap} bytes: ignored")
    return FileRead(text)


def _failed(path: Path | str, exc: OSError) -> FileRead:
    problem = problem_of(exc)
    if problem is None:
        return ABSENT
    return FileRead(None, problem, _describe(path, exc))


class HostFs:
    """Bounded, never-raising reads for one stage or source, with its problems counted by
    reason and logged once per change of state per path. Thread-safe.

    `stage` starts every log line ("nic: cannot read ..."), so an operator knows what lost
    the value.
    """

    def __init__(
        self,
        stage: str,
        *,
        cap: int = DEFAULT_CAP,
        logger: logging.Logger | None = None,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self.stage = stage
        self.cap = cap
        self._log = logger or log
        self._max_tracked = max_tracked
        self._lock = threading.Lock()
        self._failing: dict[str, str] = {}  # key -> the error it last logged
        self._counts: dict[Reason, int] = dict.fromkeys(REASONS, 0)

    # --- files ------------------------------------------------------------------------------

    def read(self, path: Path | str, cap: int | None = None) -> FileRead:
        """`read_file`, with a problem noted and a recovery logged."""
        result = read_file(path, self.cap if cap is None else cap)
        key = os.fspath(path)
        if result.problem is not None:
            self.note(key, result.problem, result.error)
        else:
            self.recovered(key)
        return result

    def read_text(self, path: Path | str) -> str | None:
        """A small attribute, stripped; None when absent, failed or too large."""
        text = self.read(path).usable
        return text.strip() if text is not None else None

    def read_int(self, path: Path | str) -> int | None:
        """A decimal (or 0x hex) integer attribute; None when absent, failed or no number."""
        text = self.read_text(path)
        if not text:
            return None
        try:
            return int(text, 0) if text.startswith(("0x", "-0x")) else int(text)
        except ValueError:
            return None

    def read_counter(self, path: Path | str) -> int | None:
        """A kernel counter attribute (a u64 in decimal): None when absent or failed; also
        None, counted and logged as `invalid`, when the text is no number or the number is
        outside 0..2**64-1, which no kernel writes (a counter of 1.8e26 would otherwise be
        served and ruin every rate() over it)."""
        text = self.read_text(path)
        if text is None:
            return None
        key = f"{os.fspath(path)} (content)"
        value = int(text) if text.isascii() and text.isdigit() else None
        if value is None or value > U64_MAX:
            # The text stays out of the line: a bogus value that changes must not log anew.
            self.note(key, "invalid", f"{show(path)}: not a u64 counter (0 to 2**64-1); left out")
            return None
        self.recovered(key)
        return value

    # --- directories and links -----------------------------------------------------------------

    def list_dir(self, directory: Path) -> list[Path]:
        """Entries sorted by name (the real bytes: `label_text(p.name)` for a label); [] when
        the directory is absent or cannot be listed (the latter noted)."""
        try:
            names = os.listdir(directory)
        except OSError as exc:
            self._os_error(directory, exc)
            return []
        return [directory / name for name in sorted(names)]

    def exists(self, path: Path) -> bool:
        """Whether `path` resolves to something; a loop or a denied lookup is noted."""
        try:
            os.stat(path)
        except OSError as exc:
            self._os_error(path, exc)
            return False
        return True

    def readlink(self, link: Path) -> str | None:
        """A symlink's target; None when it is no link or is gone."""
        try:
            return os.readlink(link)
        except OSError as exc:
            self._os_error(link, exc)
            return None

    def realpath(self, path: Path) -> Path | None:
        """Where `path` resolves, every link followed; None when it does not (a loop noted)."""
        try:
            return Path(os.path.realpath(path, strict=True))
        except OSError as exc:
            self._os_error(path, exc)
            return None

    def _os_error(self, path: Path, exc: OSError) -> None:
        problem = problem_of(exc)
        if problem is not None:
            self.note(os.fspath(path), problem, _describe(path, exc))

    # --- problems ------------------------------------------------------------------------------

    def note(self, key: str, reason: Reason, error: str) -> None:
        """Count one dropped input; log `error` unless `key` already failed this way."""
        with self._lock:
            self._counts[reason] += 1
            if self._failing.get(key) == error:
                return
            if len(self._failing) >= self._max_tracked:
                self._failing.clear()  # bounded memory; at worst a failing path logs again
            self._failing[key] = error
        self._log.warning("%s: %s", self.stage, label_text(error))

    def recovered(self, key: str) -> None:
        """`key` reads again: say so once. Cheap when `key` never failed."""
        if key not in self._failing:
            return
        with self._lock:
            if self._failing.pop(key, None) is None:
                return
        self._log.info("%s: %s reads again", self.stage, show(key))

    def counts(self) -> Mapping[Reason, int]:
        """Inputs dropped so far, by reason (every reason present, zeros included)."""
        with self._lock:
            return dict(self._counts)
