#!/usr/bin/env python3
"""GPU-source benchmarks on the fake `dgx-h100` node (8 GPUs, 18 NVLinks each).

Prints, for docs/performance.md:
  * /metrics render time (median, p90 over N renders, in-process, sampler running);
  * sampler tick cost and its CPU share at the 1 s interval (in-process);
  * the real `gpuscope` process, GPU source only, sampling at 1 s and scraped every 15 s:
    its CPU share of one core over a window and its RSS;
  * the number of series per node;
  * NVML GPM (issue #13): the cost of one GPU's GPM reads per tick (nvmlGpmSampleGet +
    nvmlGpmMetricsGet, called directly), and render / tick with GPM against the same agent
    with GPM switched off (alternating runs, this machine is noisy).
Budgets (issue #2): render <= 10 ms median, sampler CPU <= 1% of one core, RSS <= 60 MB.
GPM (issue #13): GPU-only render within 10% of it without GPM, GPM sampling <= 0.05% of a
core per GPU.
"""

from __future__ import annotations

import argparse
import dataclasses
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

from gpuscope.agent.app.agent import Agent  # noqa: E402
from gpuscope.agent.app.config import parse  # noqa: E402
from gpuscope.agent.app.exposition import catalog  # noqa: E402
from gpuscope.agent.gpu import gpm  # noqa: E402
from gpuscope.agent.gpu.nvml import Nvml  # noqa: E402
from gpuscope.agent.gpu.source import GpuSource  # noqa: E402
from gpuscope.exporters.prometheus.families import Families  # noqa: E402
from gpuscope.exporters.prometheus.gpu import render_gpu  # noqa: E402
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


def bench_in_process(
    state: Path, renders: int, *, with_gpm: bool = True, args: tuple[str, ...] = ()
) -> dict[str, float]:
    real_read = gpm.GpmReader.read
    if not with_gpm:  # the same agent on a GPU without GPM: no GPM calls, no GPM series
        gpm.GpmReader.read = lambda self: None  # type: ignore[method-assign]
    try:
        return _bench_in_process(state, renders, args)
    finally:
        gpm.GpmReader.read = real_read  # type: ignore[method-assign]


def bench_gpm_reads(
    state: Path, reads: int, profile: str = "dgx-h100", gpu: int = 0
) -> dict[str, float]:
    """One GPU's GPM work per tick, called directly on this thread (no gate hand-off)."""
    fake = FakeNvml(profile, state)
    fake.set_utilization_pattern(gpu, [(1.0, 90, 50), (0.5, 10, 5)])
    fake.activate()
    nvml = Nvml()
    nvml.init()
    try:
        handle = nvml.call("nvmlDeviceGetHandleByIndex", gpu)
        reader = gpm.GpmReader(nvml, handle, time.monotonic)
        reader.read()  # support, MIG instances, first samples
        times = []
        for _ in range(reads):
            time.sleep(0.001)  # the second sample must be later than the first
            t = time.perf_counter()
            reader.read()
            times.append(time.perf_counter() - t)
        reader.close()
        return {"gpm_read_median_us": statistics.median(times) * 1e6}
    finally:
        nvml.shutdown()


def bench_gpm_render(state: Path, rounds: int) -> dict[str, float]:
    """What the GPM series add to the GPU render: one real snapshot rendered to text with and
    without its GPM fields, alternating render by render, so the machine's drift cancels."""
    fake = FakeNvml("dgx-h100", state)
    for gpu in range(8):
        fake.set_utilization_pattern(gpu, [(1.0, 90, 50), (0.5, 10, 5)])
    fake.activate()
    agent = Agent(parse(["--listen", ":0", "--collectors", "gpu"], env={}), background=False)
    agent.start()
    gpu_source = agent.source("gpu")
    assert isinstance(gpu_source, GpuSource) and gpu_source.sampler is not None
    try:
        for _ in range(3):
            time.sleep(0.01)
            gpu_source.sampler.tick()
        with_gpm = gpu_source.read()
        without = dataclasses.replace(
            with_gpm,
            gpus=tuple(
                dataclasses.replace(
                    r,
                    sm_active_seconds=None,
                    extension=dataclasses.replace(
                        r.extension, gpm=None, tensor_active_seconds=None, dram_active_seconds=None
                    )
                    if r.extension is not None
                    else None,
                )
                for r in with_gpm.gpus
            ),
        )
        times: dict[bool, list[float]] = {True: [], False: []}
        for i in range(2 * rounds):
            gpm_on = i % 2 == 0
            snapshot = with_gpm if gpm_on else without
            t = time.perf_counter()
            out = Families(catalog())
            render_gpu(snapshot, out)
            out.render_text()
            times[gpm_on].append(time.perf_counter() - t)
        return {
            "gpu_text_with_ms": statistics.median(times[True]) * 1e3,
            "gpu_text_without_ms": statistics.median(times[False]) * 1e3,
        }
    finally:
        agent.stop()


def _bench_in_process(state: Path, renders: int, args: tuple[str, ...]) -> dict[str, float]:
    fake = FakeNvml("dgx-h100", state)
    for gpu in range(8):
        fake.set_utilization_pattern(gpu, [(1.0, 90, 50), (0.5, 10, 5)])
    fake.activate()
    argv = ["--listen", ":0", "--collectors", "gpu", *args]
    agent = Agent(parse(argv, env={}), background=False)
    agent.start()
    gpu_source = agent.source("gpu")
    assert isinstance(gpu_source, GpuSource) and gpu_source.sampler is not None
    try:
        for _ in range(3):  # GPM series exist once a GPU has had a window (two samples)
            time.sleep(0.01)
            gpu_source.sampler.tick()
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
    parser.add_argument("--gpm-pairs", type=int, default=3, help="with/without GPM runs")
    args = parser.parse_args()
    ensure_built()
    with tempfile.TemporaryDirectory() as tmp:
        inproc = bench_in_process(Path(tmp) / "a", args.renders)
        pairs = []
        for i in range(args.gpm_pairs):
            # every render collects anew: what GPM adds to a collection, not a shared one
            fresh = ("--collection-max-age", "0")
            off = bench_in_process(Path(tmp) / f"off{i}", args.renders, with_gpm=False, args=fresh)
            on = bench_in_process(Path(tmp) / f"on{i}", args.renders, args=fresh)
            pairs.append((off, on))
        text = bench_gpm_render(Path(tmp) / "t", 1000)
        reads = bench_gpm_reads(Path(tmp) / "g", 2000)
        mig_reads = bench_gpm_reads(Path(tmp) / "m", 2000, profile="dgx-h100-mig", gpu=6)
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
    print("NVML GPM (issue #13)")
    per_gpu = reads["gpm_read_median_us"]
    print(
        f"  GPM reads of one GPU per tick   {per_gpu:.1f} us  = {per_gpu / 1e6:.4%} of one core "
        "per GPU at 1 s   (budget 0.05%)"
    )
    mig = mig_reads["gpm_read_median_us"]
    print(f"  ... of a MIG GPU (GPU + 4 GIs)  {mig:.1f} us")
    for i, (off, on) in enumerate(pairs):
        change = on["render_median_ms"] / off["render_median_ms"] - 1
        print(
            f"  pair {i}: render (collecting) without / with GPM  {off['render_median_ms']:.2f} / "
            f"{on['render_median_ms']:.2f} ms ({change:+.1%}); "
            f"tick {off['tick_median_ms']:.3f} / {on['tick_median_ms']:.3f} ms; "
            f"series {off['series']:.0f} / {on['series']:.0f}"
        )
    added = text["gpu_text_with_ms"] - text["gpu_text_without_ms"]
    print(
        f"  GPU series to text, without / with GPM  {text['gpu_text_without_ms']:.3f} / "
        f"{text['gpu_text_with_ms']:.3f} ms: GPM adds {added:.3f} ms = "
        f"{added / inproc['render_median_ms']:.1%} of the render median above (budget 10%)"
    )
    changes = sorted(on["render_median_ms"] / off["render_median_ms"] - 1 for off, on in pairs)
    ticks = sorted(on["tick_median_ms"] - off["tick_median_ms"] for off, on in pairs)
    print(
        f"  median over pairs: render {statistics.median(changes):+.1%}   (budget +10%); "
        f"tick +{statistics.median(ticks) * 1000 / 8:.1f} us per GPU"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
