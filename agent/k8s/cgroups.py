"""Which pod and container a cgroup belongs to.

Attribution needs this twice: the GPU source knows PIDs (their `/proc/<pid>/cgroup` names a
cgroup path) and BPF programs know cgroup v2 ids (`bpf_get_current_cgroup_id()`, the inode
of the cgroup directory). Both end in a path, and the kubelet encodes the pod UID and QoS
class in it while the container runtime encodes the container ID. Nothing else is needed,
so attribution works without asking the kubelet or the runtime about every process.

The parser is pure so that every layout kubelets produce can be tested as a literal string;
only `CgroupResolver` and `detect_cgroup_v2_root` touch the filesystem. docs/cgroups.md
lists the layouts and the decisions taken on the ambiguous ones.

Any pod can create cgroups below its own, named with any bytes. Paths are text in which a
byte that is not UTF-8 is written `\\xNN`, both as `/proc/<pid>/cgroup` reads through
`hostfs.read_file` and as the tree walk names directories (`hostfs.label_text`), so the two
agree; the pod and container parts the kubelet and runtime write are ASCII and still parse.
"""

from __future__ import annotations

import os
import re
import stat
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from gpuscope.agent.hostfs import HostFs, label_text, problem_of, show

QosClass = Literal["guaranteed", "burstable", "besteffort"]
Runtime = Literal["containerd", "cri-o", "docker"]


@dataclass(frozen=True, slots=True)
class PodCgroup:
    """The pod (and, when the path says so, the container) that owns a cgroup.

    `pod_uid` is the canonical UID (`8-4-4-4-12` with dashes; static pods have the 32-hex
    hash the kubelet gave them, which is the mirror pod's `kubernetes.io/config.mirror`).
    `container_id` is None for the pod-level cgroup and for pod members that are no
    container (CRI-O's conmon, unknown children). `runtime` is None when the path does not
    name one: the pod-level cgroup, and the bare container IDs of the cgroupfs driver.
    """

    pod_uid: str
    container_id: str | None
    qos: QosClass
    runtime: Runtime | None


_RUNTIMES: dict[str, Runtime] = {
    "cri-containerd": "containerd",
    "crio": "cri-o",
    "crio-conmon": "cri-o",
    "docker": "docker",
}
_NOT_A_CONTAINER = frozenset({"crio-conmon"})

# The systemd driver names the pod slice after its whole ancestry: [<root>-]kubepods[-<qos>]-pod
# <uid>.slice, with `-` in the UID written as `_` (a `-` would mean one more slice level).
_SYSTEMD_POD = re.compile(
    r"(?:[^:/]*-)?kubepods(?:-(?P<qos>burstable|besteffort))?-pod(?P<uid>[0-9a-f_]+)\.slice"
)
_CGROUPFS_POD = re.compile(r"pod(?P<uid>[0-9a-f-]+)")
_UID_SYSTEMD = re.compile(r"[0-9a-f]{8}(?:_[0-9a-f]{4}){3}_[0-9a-f]{12}|[0-9a-f]{32}")
_UID_CANONICAL = re.compile(r"[0-9a-f]{8}(?:-[0-9a-f]{4}){3}-[0-9a-f]{12}|[0-9a-f]{32}")
_CONTAINER = re.compile(
    r"(?:(?P<prefix>cri-containerd|crio-conmon|crio|docker)-)?(?P<id>[0-9a-f]{64})(?:\.scope)?"
)
_QOS_DIRS: dict[str, QosClass] = {"burstable": "burstable", "besteffort": "besteffort"}
_DELETED = " (deleted)"


def parse_cgroup_path(path: str) -> PodCgroup | None:
    """The pod a cgroup path belongs to, or None for cgroups outside every pod.

    The pod cgroup is searched anywhere in the path, so prefixes (kind's `/kubelet.slice`,
    `/docker/<id>`, a namespace-relative `/../..`, a mount point) do not matter, and the
    outermost pod wins: a kubelet running inside a pod sees its pods under the host's pod.
    Anything below the pod's direct child (a cgroup nested inside a container) maps to that
    child.
    """
    path = path.strip()
    if path.endswith(_DELETED):  # v2 marks a dead cgroup this way in /proc/<pid>/cgroup
        path = path[: -len(_DELETED)]
    parts = [part for part in path.split("/") if part]
    for index, part in enumerate(parts):
        found = _systemd_pod(part) or _cgroupfs_pod(parts, index)
        if found is None:
            continue
        uid, qos, inline_child = found
        child = inline_child
        if child is None and index + 1 < len(parts):
            child = parts[index + 1]
        return _member(uid, qos, child)
    return None


def parse_proc_cgroup(text: str) -> PodCgroup | None:
    """The pod of a process, from the content of its `/proc/<pid>/cgroup`.

    The v2 line (`0::<path>`) wins when it names a pod, because it is the hierarchy BPF ids
    refer to; otherwise the first v1 line that names one, since on v1 every controller
    places a container's processes in the same pod.
    """
    first_v1: PodCgroup | None = None
    for line in text.splitlines():
        fields = line.split(":", 2)  # the path itself may contain ':'
        if len(fields) != 3:
            continue
        hierarchy, controllers, path = fields
        pod = parse_cgroup_path(path)
        if pod is None:
            continue
        if hierarchy == "0" and not controllers:
            return pod
        if first_v1 is None:
            first_v1 = pod
    return first_v1


def _systemd_pod(part: str) -> tuple[str, QosClass, str | None] | None:
    """A systemd pod slice, or the `<slice>:<runtime>:<id>` cgroup runc creates when it
    is handed a systemd cgroupsPath but manages cgroups itself (e.g. under containerd.service).
    """
    slice_name, colon, rest = part.partition(":")
    match = _SYSTEMD_POD.fullmatch(slice_name)
    if match is None or _UID_SYSTEMD.fullmatch(match["uid"]) is None:
        return None
    qos: QosClass = _QOS_DIRS.get(match["qos"] or "", "guaranteed")
    inline_child = rest.replace(":", "-", 1) if colon else None
    return match["uid"].replace("_", "-"), qos, inline_child


def _cgroupfs_pod(parts: list[str], index: int) -> tuple[str, QosClass, str | None] | None:
    """A cgroupfs pod directory: `kubepods/pod<uid>` or `kubepods/<qos>/pod<uid>`.

    The `kubepods` ancestor is required: `pod<uid>` alone is too generic a name to trust.
    """
    match = _CGROUPFS_POD.fullmatch(parts[index])
    if match is None or _UID_CANONICAL.fullmatch(match["uid"]) is None or index == 0:
        return None
    parent = parts[index - 1]
    if parent == "kubepods":
        return match["uid"], "guaranteed", None
    if parent in _QOS_DIRS and index >= 2 and parts[index - 2] == "kubepods":
        return match["uid"], _QOS_DIRS[parent], None
    return None


def _member(uid: str, qos: QosClass, child: str | None) -> PodCgroup:
    """Everything under a pod belongs to it; only a recognised name makes it a container."""
    match = _CONTAINER.fullmatch(child) if child is not None else None
    if match is None:
        return PodCgroup(pod_uid=uid, container_id=None, qos=qos, runtime=None)
    prefix = match["prefix"]
    runtime = _RUNTIMES[prefix] if prefix is not None else None
    container_id = None if prefix in _NOT_A_CONTAINER else match["id"]
    return PodCgroup(pod_uid=uid, container_id=container_id, qos=qos, runtime=runtime)


def detect_cgroup_v2_root(sysfs_fs_cgroup: Path) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted under a `/sys/fs/cgroup` (host's or ours).

    Unified hosts mount it at the base itself, hybrid hosts at `unified/`; a v1-only host
    has none, and then there are no cgroup v2 ids to resolve. A v2 root always has
    `cgroup.controllers` (empty on hybrid hosts, where v1 holds every controller).
    """
    for candidate in (sysfs_fs_cgroup, sysfs_fs_cgroup / "unified"):
        try:
            if (candidate / "cgroup.controllers").is_file():
                return candidate
        except OSError:
            continue
    return None


_MAX_HELD = 65_536


class CgroupResolver:
    """Resolves cgroup v2 ids to paths (relative to `root`, `/`-prefixed like
    `/proc/<pid>/cgroup`) and to pods.

    The kernel offers no id-to-path lookup, so the tree under `root` is walked and the map
    cached. New cgroups appear all the time (every container start), so a miss re-walks, at
    most once per `min_rewalk_interval`: BPF can report thousands of unknown ids a second
    and a walk reads every cgroup directory. Hits never walk; a cached path may outlive its
    cgroup until the next walk, which is harmless because cgroup v2 ids are never reused.
    Thread-safe.
    """

    def __init__(
        self,
        root: Path,
        *,
        min_rewalk_interval: float = 1.0,
        monotonic: Callable[[], float] = time.monotonic,
        fs: HostFs | None = None,
    ) -> None:
        self._root = root
        self.fs = fs or HostFs("cgroups")  # directories the walk could not list
        self._min_rewalk_interval = min_rewalk_interval
        self._monotonic = monotonic
        self._lock = threading.Lock()
        self._paths: dict[int, str] = {}
        self._pods: dict[int, PodCgroup | None] = {}
        self._walked_at: float | None = None
        self._generation = 0  # walks so far
        # Ids someone held while they were missing from the map: id -> the generation current
        # then. Any later walk that still lacks such an id proves it gone.
        self._held: dict[int, int] = {}

    @property
    def root(self) -> Path:
        return self._root

    def resolve(self, cgroup_id: int) -> str | None:
        """The cgroup's path, `/` for the root itself; None if no walk has seen it."""
        with self._lock:
            return self._lookup(cgroup_id)

    def resolve_pod(self, cgroup_id: int) -> PodCgroup | None:
        """The pod owning the cgroup; the answer is cached for as long as the path is."""
        with self._lock:
            if cgroup_id in self._pods:
                return self._pods[cgroup_id]
            path = self._lookup(cgroup_id)
            if path is None:
                return None  # not cached: the cgroup may appear on the next walk
            pod = parse_cgroup_path(path)
            self._pods[cgroup_id] = pod
            return pod

    def exists(self, cgroup_id: int) -> bool:
        """False only when the cgroup is provably gone, so pruning never drops a live one.

        Unlike lookups, this re-walks even on a hit once the last walk is older than the
        interval, so a pruning pass sees removals: its first call walks, the rest use that
        walk. An id is gone when a walk made after someone held it lacks it: it was in an
        earlier walk, or was asked about before this walk. An id that is newer than the last
        walk and was never asked about before counts as existing until the next walk.
        """
        with self._lock:
            if cgroup_id not in self._paths:
                self._hold(cgroup_id)
            if self._may_walk():
                self._walk()
            if cgroup_id in self._paths:
                return True
            return self._held.get(cgroup_id, self._generation) >= self._generation

    def pod_uids(self) -> set[str]:
        """Uids of the pods that have a cgroup now (walks the tree at once)."""
        with self._lock:
            self._walk()
            paths = list(self._paths.values())
        return {pod.pod_uid for path in paths if (pod := parse_cgroup_path(path)) is not None}

    def forget(self) -> None:
        """Drop everything cached; the next lookup walks at once, whatever the rate limit."""
        with self._lock:
            self._paths = {}
            self._pods = {}
            self._held = {}
            self._walked_at = None

    def _lookup(self, cgroup_id: int) -> str | None:
        path = self._paths.get(cgroup_id)
        if path is None:
            self._hold(cgroup_id)
            if self._may_walk():
                self._walk()
                path = self._paths.get(cgroup_id)
        return path

    def _hold(self, cgroup_id: int) -> None:
        self._hold_at(cgroup_id, self._generation)

    def _may_walk(self) -> bool:
        if self._walked_at is None:
            return True
        return self._monotonic() - self._walked_at >= self._min_rewalk_interval

    def _walk(self) -> None:
        self._walked_at = self._monotonic()
        previous = self._generation
        self._generation += 1
        paths = walk_cgroup_tree(self._root, self.fs)
        old = self._paths
        self._pods = {i: pod for i, pod in self._pods.items() if paths.get(i) == old.get(i)}
        self._held = {i: gen for i, gen in self._held.items() if i not in paths}
        for vanished in old.keys() - paths.keys():
            self._hold_at(vanished, previous)
        self._paths = paths

    def _hold_at(self, cgroup_id: int, generation: int) -> None:
        if len(self._held) >= _MAX_HELD:
            self._held.clear()  # only makes `exists` more cautious for a while
        self._held.setdefault(cgroup_id, generation)


def walk_cgroup_tree(root: Path, fs: HostFs | None = None) -> dict[int, str]:
    """Every directory under `root` by inode, as a `/`-prefixed path relative to it (names
    as label text: bytes that are not UTF-8 written `\\xNN`).

    Symlinks are not followed and other filesystems are not entered (inode numbers are only
    unique within one, and `/sys/fs/cgroup` on v1 holds a mount per controller). Cgroups
    removed mid-walk are skipped silently: on a busy node that is the normal case. A
    directory that cannot be listed for another reason (permission, I/O) is skipped with
    its subtree and noted in `fs` (counted, logged once per change).
    """
    try:
        top = os.stat(root)
    except OSError:
        return {}
    if not stat.S_ISDIR(top.st_mode):
        return {}
    found = {top.st_ino: "/"}
    pending: list[tuple[str, str]] = [(os.fspath(root), "")]
    while pending:
        directory, relative = pending.pop()
        try:
            with os.scandir(directory) as entries:
                for entry in entries:
                    try:
                        if not entry.is_dir(follow_symlinks=False):
                            continue
                        info = entry.stat(follow_symlinks=False)
                    except OSError:
                        continue
                    if info.st_dev != top.st_dev:
                        continue
                    name = entry.name if entry.name.isascii() else label_text(entry.name)
                    child = f"{relative}/{name}"
                    found[info.st_ino] = child
                    pending.append((entry.path, child))
            if fs is not None:
                fs.recovered(directory)
        except OSError as exc:
            problem = problem_of(exc)  # None: removed between being listed and being opened
            if problem is not None and fs is not None:
                fs.note(directory, problem, f"cannot list {show(directory)}: {exc.strerror}")
            continue
    return found
