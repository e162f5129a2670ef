#!/usr/bin/env python3
"""The `amd` collector's cost on fake AMD nodes, beside the `gpu` collector's on the fake
dgx-h100 measured in the same run (the baseline; this machine is noisy).

Prints, for docs/performance.md (issue #23):
  * per scrape: one collection (`Source.read()`: every GPU through its gate) and one
    /metrics render (a collection and the exposition), median and p90, in-process;
  * per tick: one sampler tick (the accumulators or the sampled activity of every GPU) and
    its CPU share of one core at the 1 s interval;
  * the real `gpuscope --collectors amd` process sampling at 1 s, scraped every 15 s: CPU
    share of one core over a window, RSS, start to ready;
on 8x MI300X (SPX), 8x MI300X in CPX (64 processors) and 8 MI250X GCDs.

The fake answers from memory in microseconds where the real library reads sysfs and the
firmware's metrics table: these figures are the agent's own cost, the library's comes from
`gpuscope check` (amd_costs) on hardware.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.doubles.fakeamdsmi.control import ROCM_DIR, STATE_ENV, FakeAmdSmi, ensure_built  # noqa: E402

# The bindings load the library at import, from $ROCM_PATH: set before anything imports them;
# the state file each node reads is named per node below ($FAKEAMDSMI_STATE at init).
os.environ["ROCM_PATH"] = os.environ["ROCM_HOME"] = str(ROCM_DIR)

from prometheus_client import generate_latest  # noqa: E402

from gpuscope.agent.app.agent import Agent  # noqa: E402
from gpuscope.agent.app.config import parse  # noqa: E402
from tests.doubles.fakenvml.control import FakeNvml  # noqa: E402
from tests.doubles.fakenvml.control import ensure_built as ensure_nvml  # noqa: E402
from tests.support import free_port  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")
PROFILES = ("mi300x", "mi300x-cpx", "mi250x")


def median_p90(values: list[float]) -> tuple[float, float]:
    s = sorted(values)
    return statistics.median(s), s[min(len(s) - 1, int(0.9 * len(s)))]


def timed(fn, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def bench_in_process(collector: str, agent: Agent, n: int) -> dict[str, float]:
    source = agent.source(collector)
    sampler = source.sampler  # type: ignore[attr-defined]
    reads = timed(source.read, n)
    ticks = timed(sampler.tick, n)
    renders = timed(lambda: generate_latest(agent.registry), n)
    read_med, read_p90 = median_p90(reads)
    tick_med, tick_p90 = median_p90(ticks)
    render_med, render_p90 = median_p90(renders)
    return {
        "read_med_ms": read_med * 1e3,
        "read_p90_ms": read_p90 * 1e3,
        "tick_med_ms": tick_med * 1e3,
        "tick_p90_ms": tick_p90 * 1e3,
        "render_med_ms": render_med * 1e3,
        "render_p90_ms": render_p90 * 1e3,
    }


def amd_agent(profile: str, workdir: Path) -> tuple[FakeAmdSmi, Agent]:
    fake = FakeAmdSmi(profile, workdir / f"{profile}.state", now=time.time())
    for gpu in range(0, fake.gpu_count, max(1, fake.gpu_count // 8)):
        fake.set_activity(gpu, 60)
    os.environ[STATE_ENV] = str(fake.state_path)
    argv = ["--listen", "127.0.0.1:0", "--collectors", "amd", "--collection-max-age", "0"]
    agent = Agent(parse(argv, env={}), background=False)
    agent.start()
    return fake, agent


def nvidia_agent(workdir: Path) -> tuple[FakeNvml, Agent]:
    fake = FakeNvml("dgx-h100", workdir / "dgx.state")
    fake.activate()
    argv = ["--listen", "127.0.0.1:0", "--collectors", "gpu", "--collection-max-age", "0"]
    agent = Agent(parse(argv, env={}), background=False)
    agent.start()
    return fake, agent


def bench_process(profile: str, workdir: Path, window: float) -> dict[str, float]:
    fake = FakeAmdSmi(profile, workdir / f"{profile}.proc.state", now=time.time())
    port = free_port()
    env = os.environ | fake.env()
    env.pop("FAKENVML_STATE", None)
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, "-m", "gpuscope", "--listen", f"127.0.0.1:{port}", "--collectors", "amd"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        while True:
            try:
                with urllib.request.urlopen(url + "/metrics", timeout=2) as r:
                    if b"gpuscope_gpu_info{" in r.read():
                        break
            except OSError:
                time.sleep(0.02)
        ready = time.monotonic() - t0
        cpu0, w0 = proc_cpu(proc.pid), time.monotonic()
        next_scrape = w0
        while time.monotonic() - w0 < window:
            if time.monotonic() >= next_scrape:
                with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
                    r.read()
                next_scrape += 15
            time.sleep(0.2)
        cpu = (proc_cpu(proc.pid) - cpu0) / (time.monotonic() - w0)
        rss = rss_mb(proc.pid)
    finally:
        proc.terminate()
        proc.wait(timeout=10)
    return {"ready_s": ready, "cpu_share": cpu, "rss_mb": rss}


def proc_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def row(name: str, r: dict[str, float]) -> str:
    return (
        f"  {name:<22} read {r['read_med_ms']:6.2f} / {r['read_p90_ms']:6.2f} ms   "
        f"tick {r['tick_med_ms']:6.2f} / {r['tick_p90_ms']:6.2f} ms ({r['tick_med_ms'] / 10:.3f}% "
        f"of a core at 1 s)   render {r['render_med_ms']:6.2f} / {r['render_p90_ms']:6.2f} ms"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=200, help="repetitions per figure")
    p.add_argument("--window", type=float, default=30.0, help="process CPU window, seconds")
    args = p.parse_args()
    ensure_built()
    ensure_nvml()
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        results: dict[str, dict[str, float]] = {}
        _, nv = nvidia_agent(workdir)
        try:
            results["dgx-h100 (gpu)"] = bench_in_process("gpu", nv, args.n)
        finally:
            nv.stop()
        for profile in PROFILES:
            _, agent = amd_agent(profile, workdir)
            try:
                results[f"{profile} (amd)"] = bench_in_process("amd", agent, args.n)
            finally:
                agent.stop()
        process = bench_process("mi300x", workdir, args.window)
    print("gpuscope amd collector benchmark: median / p90 over", args.n, "runs, in-process")
    for name, r in results.items():
        print(row(name, r))
    base = results["dgx-h100 (gpu)"]
    mi = results["mi300x (amd)"]
    print(
        f"  mi300x / dgx-h100 ratios: read {mi['read_med_ms'] / base['read_med_ms']:.2f}x, "
        f"tick {mi['tick_med_ms'] / base['tick_med_ms']:.2f}x, "
        f"render {mi['render_med_ms'] / base['render_med_ms']:.2f}x"
    )
    print(
        f"  gpuscope --collectors amd on mi300x: ready in {process['ready_s']:.2f} s, "
        f"CPU {process['cpu_share']:.2%} of one core (1 s ticks, 15 s scrapes, "
        f"{args.window:.0f} s), RSS {process['rss_mb']:.1f} MB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
