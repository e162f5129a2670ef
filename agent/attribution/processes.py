"""GPU process -> pod: the process's cgroup, read from /proc/<pid>/cgroup (host PIDs).

A process that exits between NVML's list and this read is a normal event: it is gone, so it
holds nothing and is skipped. A process in no pod cgroup is a host process (pod uid "").
"""

from __future__ import annotations

from pathlib import Path

from gpuscope.agent.k8s.cgroups import PodCgroup, parse_proc_cgroup

HOST_PROCESS = PodCgroup(pod_uid="", container_id=None, qos="burstable", runtime=None)


def process_pod(procfs: Path, pid: int) -> PodCgroup | None:
    """The pod and container of a host PID; `HOST_PROCESS` outside pods; None if gone."""
    try:
        text = (procfs / str(pid) / "cgroup").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    except OSError:
        return HOST_PROCESS  # unreadable (no permission): attributable to no pod we can name
    return parse_proc_cgroup(text) or HOST_PROCESS
