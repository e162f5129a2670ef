"""`make demo` shows every headline signal (issue #20): scripts/demo.py run as `make demo` runs
it, scraped over HTTP 20 s after its agent is ready, then stopped with Ctrl-C.

Its late training rank has a start-up time (and the rank scheduled before the agent has
none: never a guess), its data loader's block reads and its notebook's CPU throttling are
series of named pods, and the idle-cause counter charges the loader's workload `input_io`
and the notebook's `cpu`. After Ctrl-C nothing of the pods is left: no cgroup in any
hierarchy, no process in one, no loader file. On a hybrid host (v1 cpu and blkio beside
v2) this needs the node to make the pods' v1 directories; without them the I/O bytes and
throttling series are absent.

The same on a simulated AMD MI300X node (`make demo DEMO_ARGS="--profile mi300x"`): the
agent's `amd` collector on the fake AMD SMI library, the pods holding `amd.com/gpu`."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from types import ModuleType

import pytest

from gpuscope.agent.k8s.pod_cgroup_usage import CgroupRoots, find_pod_dirs
from tests.support import REPO, free_port
from tests.support.promtext import Exposition

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.kernel,
    pytest.mark.root(reason="the demo's pods make cgroups, its agent loads BPF"),
]

SCRAPE_AFTER = 20.0  # seconds after the agent is ready, as the acceptance says


def load_demo() -> ModuleType:
    """scripts/demo.py as a module, for the names of its pods (scripts/ is no package)."""
    name = "gpuscope_demo_script"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / "demo.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


class Output:
    """The demo's stdout and stderr, read as it runs (a full pipe would stall it)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._proc = proc
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            with self._cond:
                self.lines.append(line.rstrip("\n"))
                self._cond.notify_all()

    def wait_line(self, start: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                found = [line for line in self.lines if line.startswith(start)]
                if found:
                    return found[0]
                left = deadline - time.monotonic()
                if left <= 0 or self._proc.poll() is not None:
                    raise AssertionError(f"no line {start!r} from the demo:\n{self.text()}")
                self._cond.wait(left)

    def finish(self) -> None:
        """After the process exited: every line it wrote has been read."""
        self._reader.join(timeout=10)

    def text(self) -> str:
        with self._cond:
            return "\n".join(self.lines[-80:])


def cgroups_of(uids: set[str]) -> list[Path]:
    """Directories of these pods in any hierarchy the agent reads (v2, v1 cpu and blkio)."""
    roots = CgroupRoots.detect(Path("/sys"))
    found = []
    for root in (roots.v2, roots.cpu_v1, roots.blkio_v1):
        if root is not None:
            found += [d for uid, d in find_pod_dirs(root).items() if uid in uids]
    return found


def processes_in(uids: set[str]) -> list[int]:
    """Processes whose cgroup names one of these pods (systemd writes `-` as `_`)."""
    marks = {u.replace("-", "_") for u in uids}
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "cgroup").read_text()
            except OSError:
                continue
            if any(m in text for m in marks):
                pids.append(int(entry.name))
    return pids


def last_signals_table(lines: list[str]) -> dict[str, str]:
    """The rows, by pod, of the last "why idle" table the demo printed (its heading names
    the idle causes)."""
    headings = [i for i, line in enumerate(lines) if line.startswith("pod ") and "cause" in line]
    assert headings, "no table of pod signals"
    rows: dict[str, str] = {}
    for line in lines[headings[-1] + 1 :]:
        if not line.strip() or " " not in line:
            break
        rows[line.split()[0]] = line
    return rows


def top_cause(row: str) -> str:
    """The first (largest) cause in a row's last column, `cause Ns, cause Ns`."""
    return row.rsplit("  ", 1)[-1].split()[0]


@pytest.mark.parametrize("profile", ["dgx-h100", "mi300x"])
def test_the_demo_shows_start_up_io_throttling_and_idle_causes(
    tmp_path: Path, profile: str
) -> None:
    demo = load_demo()
    (tmp_path / "probe").mkdir()
    probe = demo.shard_file(tmp_path / "probe")  # where the demo will put the loader's file
    if probe is None:
        pytest.skip("no file system on a disk that takes O_DIRECT, for the loader's reads")
    probe.unlink()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "scripts" / "demo.py"), "--port", str(free_port()),
         "--state-dir", str(tmp_path / "demo"), "--duration", "120", "--profile", profile],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    out = Output(proc)
    try:
        serving = out.wait_line("gpuscope is serving", timeout=30)
        ready_at = time.monotonic()
        url = serving.split(" at ", 1)[1]
        time.sleep(max(0.0, ready_at + SCRAPE_AFTER - time.monotonic()))
        with urllib.request.urlopen(url, timeout=10) as resp:
            metrics = Exposition(resp.read().decode())
        proc.send_signal(signal.SIGINT)  # Ctrl-C
        assert proc.wait(timeout=30) == 0, out.text()
        out.finish()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    vendor = "amd" if profile.startswith("mi") else "nvidia"
    assert len(metrics.series("gpuscope_gpu_info", vendor=vendor)) == 8, out.text()
    loader_ns, loader = demo.LOADER
    notebook_ns, notebook = demo.NOTEBOOK
    read = metrics.get(
        "gpuscope_pod_io_bytes_total", namespace=loader_ns, pod=loader, direction="read"
    )
    assert read is not None and read > 1e6, (read, out.text())
    throttled = metrics.get(
        "gpuscope_pod_cpu_throttled_seconds_total", namespace=notebook_ns, pod=notebook
    )
    assert throttled is not None and throttled > 1.0, (throttled, out.text())
    startup = metrics.get(
        "gpuscope_pod_gpu_startup_seconds", namespace=demo.TRAINING, pod=demo.LATE_RANK
    )
    assert startup is not None and demo.STARTUP <= startup < SCRAPE_AFTER, startup
    # The master was scheduled before the agent watched: its start-up is not known.
    assert not metrics.series("gpuscope_pod_gpu_startup_seconds", pod=demo.MASTER)

    for workload, cause in (("embed-shards", "input_io"), ("alice-nb", "cpu")):
        causes = metrics.by_label(
            "gpuscope_workload_gpu_idle_cause_seconds_total", "cause", workload=workload
        )
        assert causes.get(cause, 0) > 1.0, (workload, causes)
        assert causes[cause] == max(causes.values()), (workload, causes)

    # The demo's own last table says so too, on the pods' rows.
    rows = last_signals_table(out.lines)
    assert top_cause(rows[f"{loader_ns}/{loader}"]) == "input_io", rows
    assert top_cause(rows[f"{notebook_ns}/{notebook}"]) == "cpu", rows
    assert rows[f"{demo.TRAINING}/{demo.LATE_RANK}"].split()[1] == f"{startup:.0f}s", rows

    # Ctrl-C left nothing of the pods behind.
    uids = {d["pod_uid"] for d, _v in metrics.rows("gpuscope_pod_info") if d.get("pod_uid")}
    assert len(uids) >= 6, uids
    assert cgroups_of(uids) == [], "cgroups left behind"
    assert processes_in(uids) == [], "processes left behind"
    assert not list((tmp_path / "demo").glob("shard.bin"))
    assert not Path(f"/var/tmp/gpuscope-demo-{proc.pid}.bin").exists()
