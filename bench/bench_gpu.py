#!/usr/bin/env python3
"""GPU-source benchmarks on the fake `dgx-h100` node (8 GPUs, 18 NVLinks each).

Prints, for docs/performance.md:
  * /metrics render time (median, p90 over N renders, in-process, sampler running);
  * sampler tick cost and its CPU share at the 1 s interval (in-process);
  * the real `gpuscope` process, GPU source only, sampling at 1 s and scraped every 15 s:
    its CPU share of one core over a window and its RSS;
  * the number of series per node.
Budgets (issue #2): render <= 10 ms median, sampler CPU <= 1% of one core, RSS <= 60 MB.
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


from prometheus_client import generate_latest  # noqa: E402

from gpuscope.agent.app import Agent  # noqa: E402
from gpuscope.agent.config import parse  # noqa: E402
from gpuscope.agent.gpu.source import GpuSource  # noqa: E402
from tests.doubles.fakenvml.control import FakeNvml, ensure_built  # noqa: E402
from tests.support import free_port  # noqa: E402

CLK_TCK = os.sysconf("SC_CLK_TCK")


def proc_cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK  # utime + stime


def proc_rss_mb(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    values = {
        line.split(":")[0]: int(line.split()[1])
        for line in status.splitlines()
        if line.startswith(("VmRSS", "RssAnon"))
    }
    return values["VmRSS"] / 1024, values["RssAnon"] / 1024


def bench_in_process(state: Path, renders: int) -> dict[str, float]:
    fake = FakeNvml("dgx-h100", state)
    for gpu in range(8):
        fake.set_utilization_pattern(gpu, [(1.0, 90, 50), (0.5, 10, 5)])
    fake.activate()
    agent = Agent(parse(["--listen", ":0", "--collectors", "gpu"], env={}), background=False)
    agent.start()
    gpu_source = agent.source("gpu")
    assert isinstance(gpu_source, GpuSource) and gpu_source.sampler is not None
    try:
        for _ in range(10):
            agent.collector.render_text()  # warm up
        times = []
        for _ in range(renders):
            t = time.perf_counter()
            body = agent.collector.render_text()
            times.append(time.perf_counter() - t)
        baseline = []  # the same scrape through prometheus_client's generate_latest
        for _ in range(renders):
            t = time.perf_counter()
            generate_latest(agent.registry)
            baseline.append(time.perf_counter() - t)
        series = sum(1 for line in body.decode().splitlines() if line and not line.startswith("#"))
        ticks = []
        for _ in range(200):
            time.sleep(0.002)  # let the fake produce new samples
            t = time.perf_counter()
            gpu_source.sampler.tick()
            ticks.append(time.perf_counter() - t)
        return {
            "render_median_ms": statistics.median(times) * 1e3,
            "render_p90_ms": statistics.quantiles(times, n=10)[-1] * 1e3,
            "baseline_median_ms": statistics.median(baseline) * 1e3,
            "series": series,
            "tick_median_ms": statistics.median(ticks) * 1e3,
            "bytes": len(body),
        }
    finally:
        agent.stop()


def bench_process(state: Path, window: float, scrape_every: float) -> dict[str, float]:
    fake = FakeNvml("dgx-h100", state)
    for gpu in range(8):
        fake.set_utilization_pattern(gpu, [(1.0, 90, 50), (0.5, 10, 5)])
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuscope",
            "--listen",
            f"127.0.0.1:{port}",
            "--collectors",
            "gpu",
            "--labels-mode",
            "none",  # the GPU source alone: node labels would add the API client
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=os.environ | fake.env(),
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(url + "/readyz", timeout=2).read()
                break
            except OSError:
                time.sleep(0.05)
        ready_s = time.monotonic() - (deadline - 30)
        urllib.request.urlopen(url + "/metrics", timeout=5).read()
        time.sleep(2)
        cpu0, t0 = proc_cpu_seconds(proc.pid), time.monotonic()
        next_scrape = t0 + scrape_every
        while time.monotonic() - t0 < window:
            time.sleep(max(0.0, min(next_scrape, t0 + window) - time.monotonic()))
            if time.monotonic() >= next_scrape:
                urllib.request.urlopen(url + "/metrics", timeout=5).read()
                next_scrape += scrape_every
        cpu1, t1 = proc_cpu_seconds(proc.pid), time.monotonic()
        rss, anon = proc_rss_mb(proc.pid)
        return {
            "process_cpu_share": (cpu1 - cpu0) / (t1 - t0),
            "rss_mb": rss,
            "rss_anon_mb": anon,
            "ready_s": ready_s,
        }
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--renders", type=int, default=300)
    parser.add_argument("--window", type=float, default=60.0, help="CPU measurement seconds")
    parser.add_argument("--scrape-every", type=float, default=15.0)
    args = parser.parse_args()
    ensure_built()
    with tempfile.TemporaryDirectory() as tmp:
        inproc = bench_in_process(Path(tmp) / "a", args.renders)
        proc = bench_process(Path(tmp) / "b", args.window, args.scrape_every)
    tick_share = inproc["tick_median_ms"] / 1000.0  # one tick per second
    print("gpuscope GPU-source benchmark, fake dgx-h100 (8 GPUs x 18 NVLinks)")
    print(
        f"  series per node                 {inproc['series']:.0f}  ({inproc['bytes']:.0f} bytes)"
    )
    print(f"  /metrics render, median         {inproc['render_median_ms']:.2f} ms   (budget 10 ms)")
    print(f"  /metrics render, p90            {inproc['render_p90_ms']:.2f} ms")
    print(
        f"  same scrape via generate_latest {inproc['baseline_median_ms']:.2f} ms   "
        f"(ours takes {inproc['render_median_ms'] / inproc['baseline_median_ms']:.2f}x of it)"
    )
    print(f"  sampler tick, median            {inproc['tick_median_ms']:.3f} ms")
    print(f"  sampler CPU at 1 s interval     {tick_share:.3%} of one core   (budget 1%)")
    print(
        f"  agent process CPU (sampling 1 s, scraped every {args.scrape_every:g} s, "
        f"{args.window:g} s window)  {proc['process_cpu_share']:.3%} of one core"
    )
    print(f"  agent RSS, GPU source only      {proc['rss_mb']:.1f} MB  (budget 60 MB)")
    print(f"  agent RssAnon                   {proc['rss_anon_mb']:.1f} MB")
    print(f"  start to ready                  {proc['ready_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
