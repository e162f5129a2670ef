#!/usr/bin/env python3
"""The GPU-only gpuscope agent beside nvitop-exporter, on the same fake GPUs (issue #24).

For every shipped fake NVML profile (tests/doubles/fakenvml/profiles), both exporters run as
real processes on one fake node (one state file: the same GPUs, the same utilization
pattern), each sampling every second, its default:

  * gpuscope: `gpuscope --collectors gpu --labels-mode none` (the GPU collector
    alone; node labels are a separate feature nvitop-exporter does not have);
  * nvitop-exporter 1.7.2 (nvitop 1.7.2 and its dependencies, from PyPI, in its own venv
    under build/, installed on first use with this machine's pip configuration).

Both run as installed: nvitop-exporter from its venv, gpuscope from a venv of its own under
build/ where this checkout is pip-installed as the image installs it, its cache of compiled
dataclass methods written as the image's build writes it (`install_gpuscope`).

Measured, per run:

  * start: process spawn to the first /metrics answer that holds a GPU series (gpuscope:
    a `gpuscope_gpu_` sample; nvitop-exporter: `gpu_utilization_Percentage`), polled every
    10 ms; the two start one after the other, alternating which goes first;
  * CPU: both then run side by side, each scraped every `--scrape-every` seconds (15 s, as a
    Prometheus default), over `--window` seconds: CPU time (utime + stime) over wall time,
    as % of one core;
  * VmRSS and threads at the end of the window;
  * scrape latency: after the window, `--latency-scrapes` scrapes of each, one after the
    other; the median.

Printed: medians over `--runs` runs per profile and the ratio gpuscope / nvitop-exporter
(below 1: gpuscope is lighter or faster). A benchmark: it prints figures, it asserts none.
`--quick` is one run of a 15 s window on three profiles (about two minutes).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.doubles.fakenvml.control import FakeNvml, ensure_built, list_profiles  # noqa: E402

NVITOP_VERSION = "1.7.2"
NVITOP_VENV = REPO / "build" / f"venv-nvitop-exporter-{NVITOP_VERSION}"
NVITOP_BIN = NVITOP_VENV / "bin" / "nvitop-exporter"
CLK_TCK = os.sysconf("SC_CLK_TCK")
QUICK_PROFILES = ("pcie-l40s", "dgx-h100", "dgx-h100-mig")
GPUSCOPE_VENV = REPO / "build" / "venv-gpuscope-bench"


def ensure_nvitop() -> Path:
    """nvitop-exporter in its own venv under build/, installed once (a second call installs
    nothing): `pip install nvitop-exporter==1.7.2` pulls nvitop, nvidia-ml-py, psutil and
    prometheus-client as nvitop's metadata asks."""
    stamp = NVITOP_VENV / ".installed"
    if stamp.exists() and NVITOP_BIN.exists():
        return NVITOP_BIN
    base = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
    if not (NVITOP_VENV / "bin" / "python").exists():
        subprocess.run([base, "-m", "venv", str(NVITOP_VENV)], check=True)
    subprocess.run(
        [
            str(NVITOP_VENV / "bin" / "python"),
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            f"nvitop-exporter=={NVITOP_VERSION}",
        ],
        check=True,
    )
    stamp.write_text(NVITOP_VERSION + "\n")
    return NVITOP_BIN


def installed_versions() -> str:
    out = subprocess.run(
        [str(NVITOP_VENV / "bin" / "python"), "-m", "pip", "list", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
    ).stdout
    wanted = ("nvitop", "nvitop-exporter", "nvidia-ml-py", "psutil", "prometheus_client")
    rows = [line.split() for line in out.splitlines()[2:] if line.split()]
    return ", ".join(f"{r[0]} {r[1]}" for r in rows if r[0] in wanted)


def install_gpuscope() -> Path:
    """This checkout installed as the image installs it (daemonset/Dockerfile): the package
    built from a copy of its sources, pip-installed with the project's constraints into a
    venv of its own under build/, setuptools removed, then `codecache.warm()`.
    nvitop-exporter is measured as pip installed it too; running gpuscope from the
    checkout's editable install instead
    would add its editable finder to every start, and under PYTHONDONTWRITEBYTECODE (this
    VM and CI set it) the compiling of every module edited since its .pyc was written."""
    if not (GPUSCOPE_VENV / "bin" / "python").exists():
        base = getattr(sys, "_base_executable", None) or shutil.which("python3") or sys.executable
        subprocess.run([base, "-m", "venv", str(GPUSCOPE_VENV)], check=True)
    python = str(GPUSCOPE_VENV / "bin" / "python")
    pip = [python, "-m", "pip", "-q", "--disable-pip-version-check"]
    with tempfile.TemporaryDirectory(prefix="bench-gpuscope-src-") as src_name:
        src = Path(src_name)
        for name in ("pyproject.toml", "README.md", "LICENSE", "requirements-dev.txt"):
            shutil.copy2(REPO / name, src / name)
        for name in ("agent", "exporters"):
            shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        shutil.copytree(REPO / "gpuscope", src / "gpuscope", symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__"))  # fmt: skip
        subprocess.run([*pip, "uninstall", "--yes", "gpuscope"], check=False)
        subprocess.run(
            [*pip, "install", "--constraint", str(src / "requirements-dev.txt"), str(src)],
            check=True,
        )
    # As the image does: setuptools' distutils-precedence.pth would import its _distutils_hack
    # at every start. (pip stays: it adds nothing to a start, and the next run installs with it.)
    subprocess.run([*pip, "uninstall", "--yes", "setuptools"], check=False)
    warm = "from gpuscope.agent import codecache; codecache.warm()"
    subprocess.run([python, "-c", warm], cwd="/", check=True, stdout=subprocess.DEVNULL)
    return GPUSCOPE_VENV / "bin" / "gpuscope"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def status_fields(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "RssAnon", "Threads"):
            out[key] = int(value.split()[0])
    return out


@dataclass
class Exporter:
    name: str
    argv: Callable[[int], list[str]]
    is_gpu_series: Callable[[str], bool]


def gpuscope_exporter(binary: Path) -> Exporter:
    return Exporter(
        "gpuscope",
        lambda port: [
            str(binary),
            "--listen",
            f"127.0.0.1:{port}",
            "--collectors",
            "gpu",
            "--labels-mode",
            "none",
            "--log-level",
            "warning",
        ],
        lambda body: "\ngpuscope_gpu_" in body,
    )


def nvitop_exporter(binary: Path) -> Exporter:
    return Exporter(
        "nvitop",
        lambda port: [
            str(binary),
            "--bind-address",
            "127.0.0.1",
            "--port",
            str(port),
            "--hostname",
            "bench",
        ],
        lambda body: "\ngpu_utilization_Percentage{" in body,
    )


@dataclass
class Running:
    exporter: Exporter
    proc: subprocess.Popen[bytes]
    port: int
    start_s: float = 0.0
    scrapes: list[float] = field(default_factory=list)

    def scrape(self) -> str:
        t = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/metrics", timeout=30) as r:
            body: str = r.read().decode()
        self.scrapes.append(time.perf_counter() - t)
        return body


def start(exporter: Exporter, env: dict[str, str], log: Path) -> Running:
    """Spawn and wait for the first /metrics answer with a GPU series (the start figure)."""
    port = free_port()
    with log.open("ab") as out:
        t0 = time.monotonic()
        proc = subprocess.Popen(
            exporter.argv(port), cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    running = Running(exporter, proc, port)
    deadline = t0 + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{exporter.name} exited {proc.returncode}; see {log}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                body = r.read().decode()
            if exporter.is_gpu_series(body):
                running.start_s = time.monotonic() - t0
                return running
        except OSError:
            pass
        time.sleep(0.01)
    proc.kill()
    raise RuntimeError(f"{exporter.name}: no GPU series after 60 s; see {log}")


def stop(running: Running) -> None:
    running.proc.terminate()
    try:
        running.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        running.proc.kill()
        running.proc.wait()


@contextlib.contextmanager
def started(exporters: list[Exporter], env: dict[str, str], log: Path) -> Iterator[list[Running]]:
    runs: list[Running] = []
    try:
        for exporter in exporters:
            runs.append(start(exporter, env, log))
        yield runs
    finally:
        for running in runs:
            stop(running)


def one_run(
    profile: str,
    exporters: list[Exporter],
    tmp: Path,
    args: argparse.Namespace,
) -> dict[str, dict[str, float]]:
    tmp.mkdir(parents=True, exist_ok=True)
    fake = FakeNvml(profile, tmp / f"{profile}.state")
    for gpu in range(fake.gpu_count()):
        fake.set_utilization_pattern(gpu, [(1.0, 90, 50), (0.5, 10, 5)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")}
    env |= fake.env()
    log = tmp / f"{profile}.log"
    with started(exporters, env, log) as runs:
        time.sleep(args.settle)
        for r in runs:
            r.scrape()
        r0 = {r.exporter.name: (cpu_seconds(r.proc.pid), time.monotonic()) for r in runs}
        for r in runs:
            r.scrapes.clear()
        t0 = time.monotonic()
        next_scrape = t0 + args.scrape_every
        while time.monotonic() - t0 < args.window:
            time.sleep(max(0.0, min(next_scrape, t0 + args.window) - time.monotonic()))
            if time.monotonic() >= next_scrape:
                for r in runs:
                    r.scrape()
                next_scrape += args.scrape_every
        out: dict[str, dict[str, float]] = {}
        for r in runs:
            cpu0, w0 = r0[r.exporter.name]
            cpu = (cpu_seconds(r.proc.pid) - cpu0) / (time.monotonic() - w0)
            status = status_fields(r.proc.pid)
            out[r.exporter.name] = {
                "start_s": r.start_s,
                "cpu_pct": cpu * 100,
                "rss_mb": status["VmRSS"] / 1024,
                "anon_mb": status["RssAnon"] / 1024,
                "threads": status["Threads"],
            }
        for r in runs:  # latency, after the CPU window
            r.scrapes.clear()
            for _ in range(args.latency_scrapes):
                r.scrape()
            out[r.exporter.name]["scrape_ms"] = statistics.median(r.scrapes) * 1e3
            out[r.exporter.name]["series"] = sum(
                1 for line in r.scrape().splitlines() if line and not line.startswith("#")
            )
    return out


ROWS = (
    ("start_s", "start to first GPU series (s)", "{:.3f}"),
    ("rss_mb", "VmRSS (MB)", "{:.1f}"),
    ("cpu_pct", "CPU (% of a core)", "{:.2f}"),
    ("scrape_ms", "scrape latency, median (ms)", "{:.2f}"),
    ("anon_mb", "RssAnon (MB)", "{:.1f}"),
    ("threads", "threads", "{:.0f}"),
    ("series", "series", "{:.0f}"),
)


def machine() -> str:
    model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    return (
        f"{os.cpu_count()} CPUs ({model}), Linux {platform.release()}, "
        f"Python {platform.python_version()}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--profiles", help="comma-separated fake NVML profiles (default: all)")
    parser.add_argument("--runs", type=int, default=3, help="runs per profile (median)")
    parser.add_argument("--window", type=float, default=30.0, help="CPU window, seconds")
    parser.add_argument("--scrape-every", type=float, default=15.0, help="seconds")
    parser.add_argument("--settle", type=float, default=2.0, help="seconds after start")
    parser.add_argument("--latency-scrapes", type=int, default=20)
    parser.add_argument("--quick", action="store_true", help="1 run, 15 s window, 3 profiles")
    args = parser.parse_args()
    if args.quick:
        args.runs, args.window = 1, 15.0
        args.profiles = args.profiles or ",".join(QUICK_PROFILES)
    profiles = args.profiles.split(",") if args.profiles else list_profiles()
    ensure_built()
    nvitop = nvitop_exporter(ensure_nvitop())
    exporters = [gpuscope_exporter(install_gpuscope()), nvitop]
    print(f"gpuscope GPU-only vs nvitop-exporter ({installed_versions()})")
    print(f"machine: {machine()}")
    print(
        f"{args.runs} run(s) per profile; both sample every 1 s; CPU over {args.window:g} s, "
        f"scraped every {args.scrape_every:g} s; scrape latency: median of "
        f"{args.latency_scrapes} scrapes; medians over runs; ratio = gpuscope / nvitop"
    )
    with tempfile.TemporaryDirectory(prefix="bench-nvitop-") as tmp_name:
        tmp = Path(tmp_name)
        # One discarded start of each: the page cache warm.
        with started(exporters, os.environ | FakeNvml("pcie-l40s", tmp / "w").env(), tmp / "w"):
            pass
        for profile in profiles:
            results: dict[str, list[dict[str, float]]] = {e.name: [] for e in exporters}
            for i in range(args.runs):
                order = exporters if i % 2 == 0 else exporters[::-1]
                for name, figures in one_run(profile, order, tmp / str(i), args).items():
                    results[name].append(figures)
            gpus = FakeNvml(profile, tmp / "n").gpu_count()
            print(f"\n{profile} ({gpus} GPUs)")
            print(f"  {'':32} {'gpuscope':>10} {'nvitop':>10} {'ratio':>7}")
            for key, label, fmt in ROWS:
                ours = statistics.median(r[key] for r in results["gpuscope"])
                theirs = statistics.median(r[key] for r in results["nvitop"])
                ratio = f"{ours / theirs:.2f}" if theirs else "-"
                print(f"  {label:32} {fmt.format(ours):>10} {fmt.format(theirs):>10} {ratio:>7}")
            if args.runs > 1:
                for key in ("start_s", "cpu_pct"):
                    each = " / ".join(
                        f"{a[key]:.3g}:{b[key]:.3g}"
                        for a, b in zip(results["gpuscope"], results["nvitop"], strict=True)
                    )
                    print(f"  each run, {key} gpuscope:nvitop  {each}")
            sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
