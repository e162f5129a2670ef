"""The agent's own process: memory, CPU, threads and file descriptors, from /proc/self.

Every Prometheus exporter exports these (`process_*`, as the client libraries name them), and
an agent on every GPU node is exactly the process whose growth an operator must see before the
kernel's OOM killer does. Read from the real /proc/self, never the configured host root: the
agent's own process is the one that matters, whatever pid namespace it sees the host through.
"""

from __future__ import annotations

import os
import resource
import threading
from dataclasses import dataclass
from pathlib import Path

PROC_SELF = Path("/proc/self")
_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = resource.getpagesize()


@dataclass(frozen=True, slots=True)
class ProcessStats:
    """The agent's own process at one read of /proc/self, as the `process_*` series export it."""

    cpu_seconds: float
    resident_memory_bytes: int
    virtual_memory_bytes: int
    start_time_seconds: float  # since the epoch
    open_fds: int
    max_fds: int
    threads: int  # the kernel's count: native threads of NVML, bcc and gRPC included
    python_threads: int


def read_process_stats(proc_self: Path = PROC_SELF) -> ProcessStats | None:
    """The agent's process figures, or None where /proc/self is not readable."""
    try:
        stat = (proc_self / "stat").read_text()
        boot = _boot_time(proc_self.parent / "stat")
        fds = len(os.listdir(proc_self / "fd"))
    except OSError:
        return None
    # Fields after the command name, which is in parentheses and may hold spaces.
    fields = stat[stat.rindex(")") + 2 :].split()
    utime, stime = int(fields[11]), int(fields[12])
    threads = int(fields[17])
    start_ticks = int(fields[19])
    vsize, rss_pages = int(fields[20]), int(fields[21])
    soft, _hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return ProcessStats(
        cpu_seconds=(utime + stime) / _TICKS,
        resident_memory_bytes=rss_pages * _PAGE,
        virtual_memory_bytes=vsize,
        start_time_seconds=boot + start_ticks / _TICKS,
        open_fds=fds,
        max_fds=soft,
        threads=threads,
        python_threads=threading.active_count(),
    )


def _boot_time(proc_stat: Path) -> float:
    for line in proc_stat.read_text().splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    return 0.0
