"""What every fake vendor library (fakenvml, fakeamdsmi) needs from its control module:
built once by make, however many test processes ask, and a state file it notices changing.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
import tempfile
import threading
import time
from pathlib import Path

REPO_ROOT: Path = Path(__file__).resolve().parents[2]

_build_lock = threading.Lock()


def _is_built(lib: Path, source: Path) -> bool:
    return lib.exists() and lib.stat().st_mtime_ns >= source.stat().st_mtime_ns


def ensure_built(target: str, lib: Path, source: Path) -> Path:
    """Build `lib` with `make -s <target>` if it is missing or older than `source`; its path.
    A file lock beside it makes concurrent pytest workers build it once."""
    with _build_lock:
        if _is_built(lib, source):
            return lib
        lib.parent.mkdir(parents=True, exist_ok=True)
        with open(lib.parent / ".build.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if not _is_built(lib, source):
                proc = subprocess.run(
                    ["make", "-s", target], cwd=REPO_ROOT, capture_output=True, text=True
                )
                if proc.returncode != 0:
                    raise RuntimeError(f"make {target} failed:\n{proc.stdout}{proc.stderr}")
        return lib


class StateFile:
    """A fake's state file, replaced atomically with a strictly increasing mtime.

    The libraries notice changes by (device, inode, size, mtime); file systems reuse inodes
    and may have coarse timestamps, so the mtime is set explicitly. Callers serialize writes.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._last_mtime_ns = 0

    def write(self, text: str) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(
            dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp"
        )
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
            mtime = max(time.time_ns(), self._last_mtime_ns + 1000)
            os.utime(tmp, ns=(mtime, mtime))
            self._last_mtime_ns = mtime
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
