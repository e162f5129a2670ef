"""Pods' cgroups on the real kernel, made where a kubelet makes them, with the limits and
the loads that give the agent's pod signals something to measure.

A kubelet's cgroup driver puts a pod, and each of its containers, at the same path in every
cgroup hierarchy it manages: the v2 one and, on a hybrid host (v2 at
`/sys/fs/cgroup/unified`, the controllers in v1 mounts beside it), the v1 hierarchies, of
which the agent reads `cpu` (throttling) and `blkio` (block I/O). A double that made only the
v2 directory would leave those signals absent on such a host, and the agent's reading of
them untested. The simulated node (simnode.py), the kernel tests' scripted pods
(tests/kernel/scripted_pods.py) and `make demo` make their pods through this module.

The v1 hierarchies are found in `/proc/self/mountinfo`, as the kubelet (runc's
libcontainer) finds them, and not through the agent's `CgroupRoots.detect`: a double that
borrowed the agent's notion of where the hierarchies are would agree with it even where it
is wrong. The v2 hierarchy is the one `netlab.cgroup_v2_root` names, as before.

Also here: the CPU quota of a pod limit and a read bandwidth limit on a disk (v1 files where
the controller is in v1, else v2 ones), the disk a file is on, and the Python source of the
processes that load a pod: an O_DIRECT reader (page cache bypassed, so every read is block
I/O, which a cgroup counts and PSI sees as an I/O stall) and a CPU burner.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.doubles.netlab import _rmtree_cgroup

# The v1 controllers whose hierarchies a pod joins here: those the agent reads pod signals
# from (agent/k8s/pod_cgroup_usage.py). `memory` is left out: the agent reads only OOM kills
# there, and a process moved to the v1 memory root would leave the memory cgroup (and limit)
# of whoever started it.
V1_CONTROLLERS = ("cpu", "blkio")
V2_CONTROLLERS = ("cpu", "io", "memory")  # enabled down to each pod, as the kubelet does
CFS_PERIOD_US = 100_000  # the kernel's default period, where the cgroup does not say
CPU_BURNER = "while True:\n    pass\n"


def parse_v1_mounts(mountinfo: str, controllers: Sequence[str] = V1_CONTROLLERS) -> dict[str, Path]:
    """Controller -> mount point of its cgroup v1 hierarchy, from the text of
    `/proc/<pid>/mountinfo` (`ID PARENT MAJ:MIN ROOT POINT OPTS [TAGS...] - cgroup SOURCE
    SUPER_OPTS`, the controllers among the super options; co-mounted ones such as
    `cpu,cpuacct` share a mount point). The first mount of a controller wins; mount points
    are unescaped (`\\040` is a space)."""
    found: dict[str, Path] = {}
    for line in mountinfo.splitlines():
        fields = line.split()
        if "-" not in fields:
            continue
        sep = fields.index("-")
        if len(fields) < sep + 4 or sep < 5 or fields[sep + 1] != "cgroup":
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[4])
        for option in fields[sep + 3].split(","):
            if option in controllers:
                found.setdefault(option, Path(point))
    return found


def v1_mounts(controllers: Sequence[str] = V1_CONTROLLERS) -> dict[str, Path]:
    """This host's v1 hierarchies of `controllers` (none on a pure cgroup v2 node)."""
    try:
        text = Path("/proc/self/mountinfo").read_text()
    except OSError:
        return {}
    return parse_v1_mounts(text, controllers)


@dataclass(frozen=True)
class Cgroup:
    """One cgroup (a pod's or a container's) at the same path in every hierarchy: `v2`, and
    in the v1 hierarchy of each controller in `v1` (empty on a pure v2 node)."""

    v2: Path
    v1: Mapping[str, Path]

    @property
    def dirs(self) -> list[Path]:
        """Its directories, v2 first, one per hierarchy (co-mounted controllers share one)."""
        return list(dict.fromkeys([self.v2, *self.v1.values()]))

    def child(self, name: str) -> Cgroup:
        return Cgroup(self.v2 / name, {c: d / name for c, d in self.v1.items()})


@dataclass(frozen=True)
class Hierarchies:
    """Where pods' cgroups go: the v2 root and the v1 hierarchies mounted beside it."""

    v2: Path
    v1: Mapping[str, Path]

    @classmethod
    def of_host(cls, v2: Path) -> Hierarchies:
        return cls(v2, v1_mounts())

    def at(self, relative: Path | str) -> Cgroup:
        """The cgroup at `relative` (a path below the roots) in every hierarchy."""
        return Cgroup(self.v2 / relative, {c: root / relative for c, root in self.v1.items()})

    def make(self, relative: Sequence[str]) -> tuple[Cgroup, list[Path]]:
        """Make the cgroup `relative` (its levels from the roots down) in every hierarchy,
        enabling the v2 controllers at each level above the last, as the kubelet does (so a
        pure v2 node gives its pods cpu.max, cpu.stat throttling, io.max and io.stat; a
        write the kernel refuses, such as a controller held by a v1 hierarchy, is skipped).
        Returns the cgroup and the directories this call created, parents first."""
        made: list[Path] = []
        roots = [self.v2, *dict.fromkeys(self.v1.values())]
        for root in roots:
            level = root
            for part in relative:
                if root == self.v2:
                    enable_v2_controllers(level)
                level = level / part
                if not level.exists():
                    level.mkdir()
                    made.append(level)
        return self.at(Path(*relative)), made

    def remove(self, relative: Path | str) -> None:
        """Remove the cgroup at `relative`, and everything below it, from every hierarchy
        (its processes must be gone; one still leaving is waited for a moment)."""
        for directory in self.at(relative).dirs:
            _rmtree_cgroup(directory)


def enable_v2_controllers(level: Path, wanted: Sequence[str] = V2_CONTROLLERS) -> None:
    """Enable `wanted` for the children of the v2 cgroup `level`, those it offers."""
    try:
        offered = set((level / "cgroup.controllers").read_text().split())
        enabled = set((level / "cgroup.subtree_control").read_text().split())
    except OSError:
        return
    for controller in wanted:
        if controller in offered and controller not in enabled:
            with contextlib.suppress(OSError):  # held by a v1 mount, or processes in `level`
                (level / "cgroup.subtree_control").write_text(f"+{controller}")


def set_cpu_limit(pod: Cgroup, cpus: float) -> bool:
    """A CPU limit of `cpus` for the pod, as the kubelet writes a pod's limit: the CFS quota
    per period in the v1 cpu hierarchy where there is one, else the v2 `cpu.max`. False
    where the pod's cgroup has neither (no cpu controller for it)."""
    v1 = pod.v1.get("cpu")
    if v1 is not None and (v1 / "cpu.cfs_quota_us").exists():
        period = int((v1 / "cpu.cfs_period_us").read_text().strip() or CFS_PERIOD_US)
        (v1 / "cpu.cfs_quota_us").write_text(str(max(1000, round(cpus * period))))
        return True
    if (pod.v2 / "cpu.max").exists():
        quota = max(1000, round(cpus * CFS_PERIOD_US))
        (pod.v2 / "cpu.max").write_text(f"{quota} {CFS_PERIOD_US}")
        return True
    return False


def set_read_limit(cgroup: Cgroup, disk: str, bps: int) -> bool:
    """Reads of the cgroup from `disk` (`MAJ:MIN` of a whole disk) limited to `bps` bytes a
    second: v1 `blkio.throttle.read_bps_device` where there is a blkio hierarchy (recent
    kernels count v1 blkio bytes only for bios that pass such a rule), else the v2 `io.max`.
    False where the cgroup has neither."""
    v1 = cgroup.v1.get("blkio")
    if v1 is not None and (v1 / "blkio.throttle.read_bps_device").exists():
        (v1 / "blkio.throttle.read_bps_device").write_text(f"{disk} {bps}")
        return True
    if (cgroup.v2 / "io.max").exists():
        (cgroup.v2 / "io.max").write_text(f"{disk} rbps={bps}")
        return True
    return False


def whole_disk(dev: int) -> str | None:
    """`MAJ:MIN` of the disk holding a file (the partition's parent), None off a disk."""
    block = Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}")
    if not block.exists():
        return None
    if (block / "partition").exists():
        block = block.resolve().parent
    return (block / "dev").read_text().strip()


def block_device_file(path: Path, size: int) -> str | None:
    """Write `size` random bytes to `path` (to the disk: fsync'ed) and return the whole
    disk it is on, or None (and no file) where reads of it cannot be block I/O: a file
    system on no block device (tmpfs, overlay) or one refusing O_DIRECT."""
    with path.open("wb") as f:
        f.write(os.urandom(size))
        f.flush()
        os.fsync(f.fileno())
    disk = whole_disk(path.stat().st_dev)
    try:
        os.close(os.open(path, os.O_RDONLY | os.O_DIRECT))
    except OSError:
        disk = None
    if disk is None:
        path.unlink()
    return disk


def direct_reader(path: Path, *, loop: bool, chunk: int = 1 << 16) -> str:
    """Python source of a process reading `path` with O_DIRECT in `chunk`-byte reads: to the
    end and exit, or (`loop`) over and over until killed, as a data loader does."""
    again = "os.lseek(fd, 0, os.SEEK_SET)" if loop else "break"
    return (
        "import mmap, os\n"
        f"fd = os.open({str(path)!r}, os.O_RDONLY | os.O_DIRECT)\n"
        f"buf = mmap.mmap(-1, {chunk})  # O_DIRECT needs a page-aligned buffer\n"
        "while True:\n"
        "    if os.readv(fd, [buf]) <= 0:\n"
        f"        {again}\n"
    )


def spawn_in(cgroup: Cgroup, argv: Sequence[str], **popen: Any) -> subprocess.Popen[Any]:
    """Start `argv` inside `cgroup` in every hierarchy, before it runs any code of its own: a
    shell writes its pid into each `cgroup.procs`, then becomes `argv` (same pid). No
    preexec_fn, which is unsafe in a process with threads."""
    shell = 'while [ "$1" != -- ]; do echo $$ > "$1" || exit 97; shift; done; shift; exec "$@"'
    procs = [d / "cgroup.procs" for d in cgroup.dirs]
    proc = subprocess.Popen(["/bin/sh", "-c", shell, "sh", *map(str, procs), "--", *argv], **popen)
    # Return once it is in every one (or has ended), so that a caller checking at once
    # finds it there: the shell's writes take a few milliseconds.
    deadline = time.monotonic() + 10
    while proc.poll() is None and time.monotonic() < deadline:
        if all(str(proc.pid) in _read_or_empty(path).split() for path in procs):
            break
        time.sleep(0.002)
    return proc


def _read_or_empty(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
