"""The agent exports its own process figures, as every Prometheus exporter does."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from gpuscope.agent.runtime.self_stats import read_process_stats


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(field)


def test_figures_match_what_the_kernel_says_of_this_process() -> None:
    # A thread that Python has joined can still be leaving the kernel (join returns when its
    # Python state is done): the count is checked between a reading before and one after.
    threads_before = _status_kib("Threads")
    stats = read_process_stats()
    threads_after = _status_kib("Threads")
    assert stats is not None
    rss = _status_kib("VmRSS") * 1024
    assert 0.5 * rss <= stats.resident_memory_bytes <= 2 * rss
    assert stats.virtual_memory_bytes >= stats.resident_memory_bytes
    assert min(threads_before, threads_after) <= stats.threads <= max(threads_before, threads_after)
    assert stats.max_fds == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    assert abs(stats.open_fds - len(os.listdir("/proc/self/fd"))) <= 1
    assert time.time() - 7 * 86400 < stats.start_time_seconds <= time.time()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    assert abs(stats.cpu_seconds - (usage.ru_utime + usage.ru_stime)) < 0.5


def test_threads_and_files_are_counted_as_they_come_and_go() -> None:
    # In a process of its own: the test runner's threads (other tests' servers and workers
    # winding down) would move the count under us.
    code = """
import contextlib, json, threading
from pathlib import Path
from gpuscope.agent.runtime.self_stats import read_process_stats
before = read_process_stats()
stop = threading.Event()
threads = [threading.Thread(target=stop.wait) for _ in range(5)]
for t in threads:
    t.start()
with contextlib.ExitStack() as files:
    for _ in range(7):
        files.enter_context(Path("/dev/null").open())
    during = read_process_stats()
stop.set()
for t in threads:
    t.join()
print(json.dumps([before.threads, during.threads, before.python_threads,
                  during.python_threads, before.open_fds, during.open_fds]))
"""
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    threads, threads_during, py, py_during, fds, fds_during = json.loads(out)
    assert threads_during == threads + 5
    assert py_during == py + 5
    assert fds_during == fds + 7


def test_no_proc_means_no_figures_not_an_error(tmp_path) -> None:
    assert read_process_stats(tmp_path / "self") is None
