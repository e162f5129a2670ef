"""What the kernel already measures of a pod: pressure stalls, CPU throttling, block I/O and
OOM kills, read from the pod's cgroup.

A GPU sits idle for reasons the GPU cannot see: the input pipeline waits on storage, a CPU
limit starves the data loader, the pod is being OOM-killed. The kernel accounts all of it
per cgroup, and a pod's cgroup directory aggregates its containers', so one directory per pod
answers. Files read, relative to the pod's cgroup directory:

- cgroup v2 (the hierarchy at the configured cgroup root): `cpu.pressure`,
  `memory.pressure`, `io.pressure` (PSI; `total=` in microseconds, for `some` and, where the
  kernel has it, `full`), `cpu.stat` (`nr_throttled`, `throttled_usec`: present only while
  the cpu controller is enabled for the cgroup), `io.stat` (`rbytes wbytes rios wios` per
  device, summed), `memory.events` (`oom_kill`);
- cgroup v1 on hybrid hosts, where v2 holds no controller and v1 mounts sit beside
  `unified/`: `cpu/.../cpu.stat` (`nr_throttled`, `throttled_time` in nanoseconds),
  `blkio/.../blkio.throttle.io_service_bytes_recursive` and `..._io_serviced_recursive`
  (the pod directory has no processes of its own: the non-recursive files would read 0; the
  plain names are the fallback on kernels without the recursive ones),
  `memory/.../memory.oom_control` (`oom_kill`). A v2 file wins where both exist.

A file that is absent (controller not enabled, a kernel without PSI) gives nothing for its
signals: None, never 0, and no log line. Every read goes through `HostFs` (bounded, never
raising); content that does not parse is dropped and counted as `invalid`, logged once per
change. `PodCgroupReader` reads each pod at most once per interval, whatever the scrape rate.
"""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from gpuscope.agent.clock import Clock, SystemClock
from gpuscope.agent.hostfs import U64_MAX, HostFs, label_text, problem_of, show
from gpuscope.agent.k8s.cgroups import detect_cgroup_v2_root, parse_cgroup_path

USEC = 1_000_000  # per second: divided by, so 30 us reads 3e-05 exactly
NSEC = 1_000_000_000
_MAX_ABSENT = 65_536  # absent files remembered at most (then forgotten, and opened again)
MAX_DEPTH = 8  # levels searched for pod directories (kind and docker-in-docker nest a few)


@dataclass(frozen=True, slots=True)
class Pressure:
    """PSI stall time since the cgroup was created: `some` (at least one task stalled) and
    `full` (all non-idle tasks stalled at once; None where the kernel has no such line)."""

    some_seconds: float
    full_seconds: float | None


@dataclass(frozen=True, slots=True)
class PodCgroupUsage:
    """One pod's cgroup counters; None for each file its cgroup lacks."""

    pod_uid: str
    cpu_pressure: Pressure | None = None
    memory_pressure: Pressure | None = None
    io_pressure: Pressure | None = None
    cpu_throttled_periods: int | None = None
    cpu_throttled_seconds: float | None = None
    io_read_bytes: int | None = None
    io_write_bytes: int | None = None
    io_read_operations: int | None = None
    io_write_operations: int | None = None
    oom_kills: int | None = None


# --- parsers: pure, None for content that is not what the kernel writes --------------------


def parse_pressure(text: str) -> Pressure | None:
    """`cpu.pressure` and friends: `some avg10=.. avg60=.. avg300=.. total=<usec>` and an
    optional `full` line."""
    totals: dict[str, int] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        for field in rest.split():
            key, eq, value = field.partition("=")
            if key == "total" and eq and value.isdigit():
                if int(value) > U64_MAX:
                    return None
                totals[kind] = int(value)
    if "some" not in totals:
        return None
    full = totals.get("full")
    return Pressure(totals["some"] / USEC, full / USEC if full is not None else None)


def parse_flat_keyed(text: str) -> dict[str, int] | None:
    """`key value` lines (`cpu.stat`, `memory.events`, `memory.oom_control`); lines that
    are not a name and an integer are skipped. None when a value is past u64: the kernel
    keeps these counts in u64, so the file is not one it wrote (and `oom_kill 1.8e26`
    must not become a served counter)."""
    out: dict[str, int] = {}
    for line in text.splitlines():
        fields = line.split()
        if len(fields) == 2 and fields[1].isdigit():
            value = int(fields[1])
            if value > U64_MAX:
                return None
            out[fields[0]] = value
    return out


def parse_io_stat(text: str) -> tuple[int, int, int, int] | None:
    """cgroup v2 `io.stat`, summed over devices: (read bytes, written bytes, read ops, write
    ops). An empty file (no I/O yet) is all zeros; a line that is not `MAJ:MIN key=value...`
    makes the whole file None."""
    sums = dict.fromkeys(("rbytes", "wbytes", "rios", "wios"), 0)
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if ":" not in fields[0]:
            return None
        for field in fields[1:]:
            key, eq, value = field.partition("=")
            if not eq or not value.isdigit() or int(value) > U64_MAX:
                return None
            if key in sums:
                sums[key] += int(value)
    return sums["rbytes"], sums["wbytes"], sums["rios"], sums["wios"]


def parse_blkio(text: str) -> tuple[int, int] | None:
    """cgroup v1 `blkio.throttle.io_service_bytes` or `..._io_serviced`: (read, write) summed
    over devices (`MAJ:MIN Read N` lines; the closing `Total N` line is skipped)."""
    read = write = 0
    for line in text.splitlines():
        fields = line.split()
        if not fields or (len(fields) == 2 and fields[0] == "Total"):
            continue
        if len(fields) != 3 or ":" not in fields[0] or not fields[2].isdigit():
            return None
        if int(fields[2]) > U64_MAX:
            return None
        if fields[1] == "Read":
            read += int(fields[2])
        elif fields[1] == "Write":
            write += int(fields[2])
    return read, write


# --- where the pods' cgroups are --------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class CgroupRoots:
    """The hierarchies read: the v2 root and, on hybrid hosts, the v1 cpu, blkio and memory
    mounts (None where absent)."""

    v2: Path | None
    cpu_v1: Path | None = None
    blkio_v1: Path | None = None
    memory_v1: Path | None = None

    @classmethod
    def detect(cls, sysfs: Path, cgroup_root: Path | None = None) -> CgroupRoots:
        """`cgroup_root` (the --cgroup-root flag) or the v2 mount under `<sysfs>/fs/cgroup`;
        v1 controllers beside it when v2 is at `unified/` (hybrid) or absent (v1 only)."""
        base = sysfs / "fs" / "cgroup"
        v2 = cgroup_root or detect_cgroup_v2_root(base)
        if v2 is not None and v2.name != "unified":
            return cls(v2)
        v1_base = v2.parent if v2 is not None else base
        return cls(
            v2,
            _v1_mount(v1_base, "cpu", "cpu.stat"),
            _v1_mount(v1_base, "blkio", "blkio.throttle.io_service_bytes"),
            _v1_mount(v1_base, "memory", "memory.oom_control"),
        )


def _v1_mount(base: Path, controller: str, marker: str) -> Path | None:
    try:
        return base / controller if (base / controller / marker).is_file() else None
    except OSError:
        return None


def find_pod_dirs(
    root: Path, fs: HostFs | None = None, max_depth: int = MAX_DEPTH
) -> dict[str, Path]:
    """Pod UID -> the pod's cgroup directory under `root`, for every layout `parse_cgroup_path`
    knows. The search never enters a pod (its children are containers), nor symlinks or other
    filesystems, so it lists the few directories above the pods rather than the whole tree.
    The outermost pod wins, as in `parse_cgroup_path`."""
    try:
        top = os.stat(root)
    except OSError:
        return {}
    if not stat.S_ISDIR(top.st_mode):
        return {}
    found: dict[str, Path] = {}
    pending: list[tuple[str, str, int]] = [(os.fspath(root), "", 0)]
    while pending:
        directory, relative, depth = pending.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    try:
                        if not entry.is_dir(follow_symlinks=False):
                            continue
                        if entry.stat(follow_symlinks=False).st_dev != top.st_dev:
                            continue
                    except OSError:
                        continue
                    child = f"{relative}/{label_text(entry.name)}"
                    pod = parse_cgroup_path(child)
                    if pod is None:
                        if depth + 1 < max_depth:
                            pending.append((entry.path, child, depth + 1))
                    elif pod.container_id is None and pod.runtime is None:
                        found.setdefault(pod.pod_uid, Path(entry.path))
        except OSError as exc:
            problem = problem_of(exc)
            if problem is not None and fs is not None:
                fs.note(directory, problem, f"cannot list {show(directory)}: {exc.strerror}")
    return found


class PodCgroupReader:
    """Reads pods' cgroup counters, each pod at most once per `interval` seconds (by the
    agent's clock): a scrape in between gets the last reading. Pod directories are found by a
    search of each hierarchy, repeated only when a wanted pod is missing from it, and then at
    most once per `search_interval` (a pod without a cgroup on this node must not make every
    scrape list the tree). Thread-safe."""

    def __init__(
        self,
        roots: CgroupRoots,
        *,
        clock: Clock | None = None,
        interval: float = 1.0,
        search_interval: float = 10.0,
        fs: HostFs | None = None,
        find: Callable[[Path, HostFs], dict[str, Path]] = find_pod_dirs,
    ) -> None:
        self.roots = roots
        self.fs = fs or HostFs("pod cgroups")
        self._clock = clock or SystemClock()
        self._interval = interval
        self._search_interval = search_interval
        self._find = find
        self._lock = threading.Lock()
        self._dirs: dict[Path, dict[str, Path]] = {}  # hierarchy root -> uid -> directory
        self._searched_at: dict[Path, float] = {}
        self._cache: dict[str, tuple[float, PodCgroupUsage]] = {}
        # Files found absent (controller not enabled) -> when: not opened again before the
        # next search interval, so a pod costs the opens of the files it has (about 4).
        self._absent: dict[str, float] = {}
        self._now = 0.0

    def read(self, pod_uids: Collection[str]) -> Mapping[str, PodCgroupUsage]:
        """The counters of each pod in `pod_uids` that has a cgroup here; pods not asked for
        are forgotten."""
        with self._lock:
            now = self._now = self._clock.monotonic()
            self._cache = {u: c for u, c in self._cache.items() if u in pod_uids}
            stale = [
                u
                for u in pod_uids
                if u not in self._cache or now - self._cache[u][0] >= self._interval
            ]
            if stale:
                dirs = {root: self._located(root, stale, now) for root in self._hierarchies()}
                for uid in stale:
                    usage = self._read_pod(uid, dirs)
                    if usage is None:
                        self._cache.pop(uid, None)
                    else:
                        self._cache[uid] = (now, usage)
            return {u: c[1] for u, c in self._cache.items()}

    def _hierarchies(self) -> list[Path]:
        r = self.roots
        return [p for p in (r.v2, r.cpu_v1, r.blkio_v1, r.memory_v1) if p is not None]

    def _located(self, root: Path, wanted: list[str], now: float) -> dict[str, Path]:
        known = self._dirs.get(root, {})
        missing = any(u not in known for u in wanted)
        last = self._searched_at.get(root)
        if missing and (last is None or now - last >= self._search_interval):
            # Every pod found is kept (a pod asked for later needs no search of its own);
            # pods gone since the last search go with it.
            known = self._find(root, self.fs)
            self._dirs[root] = known
            self._searched_at[root] = now
            if len(self._absent) > _MAX_ABSENT:
                self._absent.clear()
        return known

    def _read_pod(self, uid: str, dirs: Mapping[Path, Mapping[str, Path]]) -> PodCgroupUsage | None:
        r = self.roots
        # Paths as text from here: pathlib's joins cost as much as the reads.
        v2, cpu1, blk1, mem1 = (
            _text_path(dirs[root].get(uid)) if root is not None and root in dirs else None
            for root in (r.v2, r.cpu_v1, r.blkio_v1, r.memory_v1)
        )
        if v2 is None and cpu1 is None and blk1 is None and mem1 is None:
            return None
        periods, throttled = self._throttling(v2, cpu1)
        io = self._io(v2, blk1)
        return PodCgroupUsage(
            pod_uid=uid,
            cpu_pressure=self._pressure(v2, "cpu.pressure"),
            memory_pressure=self._pressure(v2, "memory.pressure"),
            io_pressure=self._pressure(v2, "io.pressure"),
            cpu_throttled_periods=periods,
            cpu_throttled_seconds=throttled,
            io_read_bytes=io[0],
            io_write_bytes=io[1],
            io_read_operations=io[2],
            io_write_operations=io[3],
            oom_kills=self._oom_kills(v2, mem1),
        )

    def _text(self, path: str) -> str | None:
        key = path
        absent_at = self._absent.get(key)
        if absent_at is not None and self._now - absent_at < self._search_interval:
            return None
        read = self.fs.read(key)
        if read.text is None and read.problem is None:
            self._absent[key] = self._now
        elif absent_at is not None:
            del self._absent[key]
        return read.usable

    def _judge(self, path: str, valid: bool) -> None:
        """Count and log (once per change) content that is not the kernel's; say when it
        parses again. Keyed apart from the path: the read itself succeeded."""
        key = f"{path} (content)"
        if valid:
            self.fs.recovered(key)
        else:
            self.fs.note(key, "invalid", f"{show(path)}: not in the kernel's format; left out")

    def _pressure(self, directory: str | None, name: str) -> Pressure | None:
        if directory is None:
            return None
        text = self._text(f"{directory}/{name}")
        if text is None:
            return None
        found = parse_pressure(text)
        self._judge(f"{directory}/{name}", found is not None)
        return found

    def _throttling(self, v2: str | None, cpu1: str | None) -> tuple[int | None, float | None]:
        if v2 is not None:
            text = self._text(f"{v2}/cpu.stat")
            keys = parse_flat_keyed(text) if text is not None else {}
            if text is not None:
                # Without the cpu controller v2 cpu.stat has no throttling keys: not invalid.
                self._judge(f"{v2}/cpu.stat", keys is not None)
            keys = keys or {}
            if "nr_throttled" in keys and "throttled_usec" in keys:
                return keys["nr_throttled"], keys["throttled_usec"] / USEC
        if cpu1 is not None:
            text = self._text(f"{cpu1}/cpu.stat")
            keys = parse_flat_keyed(text) if text is not None else {}
            valid = keys is not None and "nr_throttled" in keys and "throttled_time" in keys
            if text is not None:
                self._judge(f"{cpu1}/cpu.stat", valid)
            if valid and keys is not None:
                return keys["nr_throttled"], keys["throttled_time"] / NSEC
        return None, None

    def _io(
        self, v2: str | None, blk1: str | None
    ) -> tuple[int | None, int | None, int | None, int | None]:
        if v2 is not None:
            text = self._text(f"{v2}/io.stat")
            if text is not None:
                stat_ = parse_io_stat(text)
                self._judge(f"{v2}/io.stat", stat_ is not None)
                return stat_ or (None, None, None, None)
        if blk1 is not None:
            nbytes = self._blkio(blk1, "blkio.throttle.io_service_bytes")
            ops = self._blkio(blk1, "blkio.throttle.io_serviced")
            return (
                nbytes[0] if nbytes else None,
                nbytes[1] if nbytes else None,
                ops[0] if ops else None,
                ops[1] if ops else None,
            )
        return None, None, None, None

    def _blkio(self, directory: str, name: str) -> tuple[int, int] | None:
        for path in (f"{directory}/{name}_recursive", f"{directory}/{name}"):
            text = self._text(path)
            if text is None:
                continue
            found = parse_blkio(text)
            self._judge(path, found is not None)
            return found
        return None

    def _oom_kills(self, v2: str | None, mem1: str | None) -> int | None:
        for directory, name in ((v2, "memory.events"), (mem1, "memory.oom_control")):
            if directory is None:
                continue
            text = self._text(f"{directory}/{name}")
            if text is None:
                continue
            keys = parse_flat_keyed(text)
            self._judge(f"{directory}/{name}", keys is not None)
            if keys is None:
                return None
            if "oom_kill" in keys:  # kernels before 4.13 do not count them: nothing to say
                return keys["oom_kill"]
        return None


def _text_path(path: Path | None) -> str | None:
    return os.fspath(path) if path is not None else None
