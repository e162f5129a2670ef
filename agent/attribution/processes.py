"""GPU process -> pod: the process's cgroup, read from /proc/<pid>/cgroup (host PIDs).

A process that exits between NVML's list and this read is a normal event: it is gone, so it
holds nothing and is skipped (`None`). A process in no pod cgroup is a host process (pod uid
""). A process whose file cannot be read (a permission, a loop, a file over the cap) is
`Dropped`: naming it a host process would be a guess that inflates the host's and the
unallocated figures, so the stage leaves it out and counts why.

The file is read through `HostFs` (bounded, never raises). A cgroup name holding bytes that
are not UTF-8 (any pod can create a child cgroup so named) reads with those bytes escaped
(`\\xff`): the pod and container parts of the path are ASCII written by the kubelet and the
runtime, so such a process is still attributed to its pod.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gpuscope.agent.k8s.cgroups import PodCgroup, parse_proc_cgroup

if TYPE_CHECKING:
    from gpuscope.agent.hostfs import HostFs, Reason

HOST_PROCESS = PodCgroup(pod_uid="", container_id=None, qos="burstable", runtime=None)
# Far above what the kernel writes (a line per v1 hierarchy, each path under PATH_MAX).
CGROUP_FILE_CAP = 64 * 1024


@dataclass(frozen=True, slots=True)
class Dropped:
    """A process left out of attribution, and why (already counted and logged)."""

    reason: Reason


def process_pod(procfs: Path, pid: int, fs: HostFs) -> PodCgroup | Dropped | None:
    """The pod and container of a host PID; `HOST_PROCESS` outside pods; None if gone."""
    read = fs.read(procfs / str(pid) / "cgroup", CGROUP_FILE_CAP)
    if read.problem is not None:
        return Dropped(read.problem)
    text = read.text or ""
    # The kernel ends every line with a newline: a line without one was cut short (a read
    # racing the process's exit, a truncated copy), and a cut path may name the wrong cgroup.
    text = text[: text.rfind("\n") + 1]
    if not text:
        return None  # absent, empty, or one cut line: a process exiting
    return parse_proc_cgroup(text) or HOST_PROCESS
