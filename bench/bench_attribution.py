#!/usr/bin/env python3
"""Attribution at the kubelet's default pod limit: 8 GPUs and 110 pods, every pod with
network series, every source on (gpu, net, nic, rdma, kubelet, pods).

The real `gpuscope` process runs on a simulated dgx-h100 node (tests/doubles/simnode.py): the pods
are real processes in kubelet-style cgroups, each sending TCP traffic to the next, 16 of
them GPU processes (8 GPUs, two time-sliced shares each). Prints, for docs/performance.md:
  * /metrics latency as a scraper sees it (collection of every source + attribution +
    rendering), median and p90 over N scrapes, and the same for a GPU-only agent on the same
    node in the same run (the baseline);
  * the agent's RSS and anonymous memory after the scrapes;
  * the series count;
  * the attribution stage alone on one collection, and the part of it the GPM-era accounts
    take (MIG devices' last activity, low-activity seconds, energy per pod: issue #13);
  * the per-pod cgroup signals (issue #16): the attribution stage with them off, reading
    the GPU pods (the default) and reading every pod (--pod-signals-all-pods), interleaved,
    as a share of the render; the memory the reader keeps.
Budgets (issue #4): render <= 25 ms median; RSS <= 180 MB, anonymous <= 100 MB.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tracemalloc
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.bench_gpu import proc_cpu_seconds, proc_rss_mb  # noqa: E402
from gpuscope.agent.app.agent import Agent  # noqa: E402
from gpuscope.agent.app.config import parse  # noqa: E402
from gpuscope.agent.attribution.accounts import Accounts  # noqa: E402
from gpuscope.agent.attribution.energy import Energy  # noqa: E402
from gpuscope.agent.attribution.signals import Signals  # noqa: E402
from gpuscope.agent.k8s.collector import PODS as PODS_SOURCE  # noqa: E402
from gpuscope.agent.k8s.pod_cgroup_usage import PodCgroupReader  # noqa: E402
from tests.doubles.fakenvml.control import FakeNvml, ensure_built  # noqa: E402
from tests.doubles.simnode import GIB, ContainerSpec, SimNode  # noqa: E402
from tests.support import free_port  # noqa: E402

PODS = 110
HEADERS = REPO / "build" / "kernel-headers" / "debian"
PINS = Path("/sys/fs/bpf/gpuscope-bench")  # the probes' pins, removed when the bench ends


def grow(node: SimNode, pods: int) -> None:
    """Pods ns-<k>/pod-<i>: the first 16 hold a time-sliced share of a GPU and use it."""
    for i in range(pods):
        gpu = i // 2 if i < 16 else None
        spec = ContainerSpec(
            "main",
            gpus=[gpu] if gpu is not None else (),
            shared_replica=i % 2 if gpu is not None else None,
            gpu_memory_bytes=4 * GIB if gpu is not None else 0,
            sm_util=40 if gpu is not None else 0,
            traffic_to=f"team-{(i - 1) % 10}/pod-{i - 1}" if i else None,
            traffic_bytes=1000 + i if i else 0,
        )
        node.add_pod(
            f"team-{i % 10}",
            f"pod-{i}",
            containers=[spec],
            labels={"batch.kubernetes.io/job-name": f"job-{i // 8}"},
        )
    node.wait_traffic(timeout=120)


def start_agent(
    fake: FakeNvml, node: SimNode, collectors: str
) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            sys.executable, "-m", "gpuscope", "--listen", f"127.0.0.1:{port}",
            "--collectors", collectors, "--kubelet-socket", str(node.kubelet_socket),
            "--kubeconfig", str(node.kubeconfig), "--node-name", node.node_name,
            "--kernel-headers", str(HEADERS), "--bpf-pin-root", str(PINS),
            "--labels-mode", "none", "--log-level", "warning",
        ],
        cwd=REPO,
        env=os.environ | fake.env(),
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(url + "/readyz", timeout=2).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("the agent did not become ready")


def in_process_agents(fake: FakeNvml, node: SimNode) -> tuple[Agent, Agent]:
    """All sources and GPU only, in this process (as bench_gpu.py measures the GPU render).
    Started before the pods, so their probes see all the traffic. Every render collects
    anew (--collection-max-age 0): renders back to back would otherwise share one
    collection and time only the text."""
    fake.activate()
    common = ["--listen", ":0", "--kubelet-socket", str(node.kubelet_socket),
              "--kubeconfig", str(node.kubeconfig), "--node-name", node.node_name,
              "--kernel-headers", str(HEADERS), "--bpf-pin-root", str(PINS),
              "--labels-mode", "none", "--collection-max-age", "0"]  # fmt: skip
    full = Agent(parse(common, env={}))
    gpu_only = Agent(parse([*common, "--collectors", "gpu"], env={}))
    full.start()
    gpu_only.start()
    return full, gpu_only


def render_times(full: Agent, gpu_only: Agent, n: int) -> tuple[list[float], list[float]]:
    """Collection + attribution + rendering, interleaved so both see the same machine."""
    for _ in range(5):
        full.collector.render_text()
        gpu_only.collector.render_text()
    times: list[float] = []
    base: list[float] = []
    for _ in range(n):
        for agent, into in ((full, times), (gpu_only, base)):
            t = time.perf_counter()
            agent.collector.render_text()
            into.append(time.perf_counter() - t)
    return times, base


def _timed(obj: object, name: str, spent: list[float]) -> None:
    """Wrap obj.name so each call adds its duration to spent[0]."""
    inner = getattr(obj, name)

    def call(*args: object, **kwargs: object) -> object:
        t = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            spent[0] += time.perf_counter() - t

    setattr(obj, name, call)


def stage_times(full: Agent, n: int) -> tuple[list[float], list[float]]:
    """The attribution stage on the agent's latest collection, n times: the whole stage and
    the share of it in the GPM-era accounts (energy per pod, low-activity seconds, MIG last
    activity), per call."""
    collection = full.scrape().collection
    att = full.attributor
    accounts, energy = att.stages["accounts"], att.stages["energy"]
    assert isinstance(accounts, Accounts) and isinstance(energy, Energy)
    spent = [0.0]
    for obj, name in (
        (energy.accountant, "evaluate"),
        (accounts.low, "evaluate"),
        (accounts.mig_active, "update"),
    ):
        _timed(obj, name, spent)
    whole, new = [], []
    for _ in range(n):
        spent[0] = 0.0
        t = time.perf_counter()
        att.attribute(collection)
        whole.append(time.perf_counter() - t)
        new.append(spent[0])
    return whole, new


@dataclass
class SignalCosts:
    """The per-pod cgroup signals' share (issue #16), on the attribution stage alone."""

    off: list[float]  # the stage on one collection, signals off
    gpu_pods: list[float]  # ... reading the pods that hold a GPU (the default)
    all_pods: list[float]  # ... reading every pod (--pod-signals-all-pods)
    pods_read: int
    kept_kb: float  # what the reader holds for every pod (tracemalloc)


def signal_costs(full: Agent, n: int) -> SignalCosts:
    """The attribution stage on one collection with the signals off, on for GPU pods and on
    for all pods, interleaved, each call reading the files (as at Prometheus' 15 s interval,
    where every scrape finds the 1 s cache expired), and the reader's memory for every pod.
    The stage is where the reads happen; the rest of a render does not change."""
    att = full.attributor
    stage = att.stages["signals"]
    assert isinstance(stage, Signals)
    reader = stage.reader
    assert reader is not None
    collection = full.scrape().collection
    pods = collection.last_records(PODS_SOURCE)
    assert pods is not None
    gpu_reader = PodCgroupReader(reader.roots, interval=0.0)
    all_reader = PodCgroupReader(reader.roots, interval=0.0)
    modes: dict[str, list[float]] = {"off": [], "gpu": [], "all": []}
    settings = {"off": (None, False), "gpu": (gpu_reader, False), "all": (all_reader, True)}
    for signals, every in settings.values():  # warm up: the searches, once
        stage.reader, stage.all_pods = signals, every
        att.attribute(collection)
    pods_read = len(att.attribute(collection).pod_signals)
    for _ in range(n):
        for mode, (signals, every) in settings.items():
            stage.reader, stage.all_pods = signals, every
            t = time.perf_counter()
            att.attribute(collection)
            modes[mode].append(time.perf_counter() - t)
    stage.reader, stage.all_pods = reader, False
    tracemalloc.start()
    kept = PodCgroupReader(reader.roots)
    before = tracemalloc.get_traced_memory()[0]
    kept.read(list(pods.pods))
    kept_kb = (tracemalloc.get_traced_memory()[0] - before) / 1024
    tracemalloc.stop()
    return SignalCosts(modes["off"], modes["gpu"], modes["all"], pods_read, kept_kb)


def signal_report(c: SignalCosts, render_ms: float) -> None:
    off, _ = summary(c.off)
    gpu, gpu90 = summary(c.gpu_pods)
    every, every90 = summary(c.all_pods)
    print(f"pod cgroup signals, attribution stage reading them every call: median "
          f"{off:.2f} ms off; GPU pods {gpu:.2f} ms (p90 {gpu90:.2f}): +{gpu - off:.2f} ms, "
          f"{(gpu - off) / render_ms:+.1%} of this run's render median, "
          f"{(gpu - off) / 17.2:+.1%} of 17.2 ms; all {c.pods_read} pods {every:.2f} ms "
          f"(p90 {every90:.2f}): +{every - off:.2f} ms, {(every - off) / render_ms:+.1%} "
          f"of the render, {(every - off) / 17.2:+.1%} of 17.2 ms  (budget: +20%)")  # fmt: skip
    print(f"pod cgroup signals: reader memory for every pod {c.kept_kb:.1f} KiB")


def scrape_times(url: str, n: int) -> tuple[list[float], bytes]:
    body = b""
    for _ in range(5):
        body = urllib.request.urlopen(url + "/metrics", timeout=10).read()  # warm up
    times = []
    for _ in range(n):
        t = time.perf_counter()
        body = urllib.request.urlopen(url + "/metrics", timeout=10).read()
        times.append(time.perf_counter() - t)
        time.sleep(0.05)
    return times, body


def cpu_window(pid: int, url: str, window: float, every: float = 15.0) -> float:
    """The agent's CPU share of one core while Prometheus-like scrapes come every 15 s."""
    cpu0, t0 = proc_cpu_seconds(pid), time.monotonic()
    while time.monotonic() - t0 < window:
        urllib.request.urlopen(url + "/metrics", timeout=10).read()
        time.sleep(min(every, max(0.0, window - (time.monotonic() - t0))))
    return (proc_cpu_seconds(pid) - cpu0) / (time.monotonic() - t0)


def summary(times: list[float]) -> tuple[float, float]:
    return statistics.median(times) * 1e3, statistics.quantiles(times, n=10)[-1] * 1e3


def count_series(text: str) -> int:
    """Sample lines of an exposition: every line that is neither blank nor a comment."""
    return sum(1 for line in text.splitlines() if line and line[0] != "#")


def count_named(text: str) -> int:
    """Pod network series that name their pod: attribution reached the pods it should."""
    return sum(
        1
        for line in text.splitlines()
        if line.startswith("gpuscope_pod_network_transmit_bytes_total") and 'pod="pod-' in line
    )


@dataclass
class Measured:
    """Everything one run measures, kept together so the report is printed in one place."""

    times: list[float]
    base_times: list[float]
    body: bytes
    base_body: bytes
    cpu_share: float
    rss: float
    anon: float
    inproc: list[float]
    inproc_base: list[float]
    stage: list[float]
    stage_new: list[float]
    signals: SignalCosts


def measure(
    procs: tuple[subprocess.Popen[bytes], subprocess.Popen[bytes]],
    urls: tuple[str, str],
    full: Agent,
    gpu_only: Agent,
    args: argparse.Namespace,
) -> Measured:
    """Scrapes of both agents over HTTP, the full agent's CPU and memory, then (with the
    subprocesses stopped, so they take no CPU from it) the in-process render times."""
    agent, base = procs
    url, base_url = urls
    times, body = scrape_times(url, args.scrapes)
    base_times, base_body = scrape_times(base_url, args.scrapes)
    cpu_share = cpu_window(agent.pid, url, args.window)
    rss, anon = proc_rss_mb(agent.pid)
    agent.terminate()
    base.terminate()
    inproc, inproc_base = render_times(full, gpu_only, args.scrapes)
    stage, stage_new = stage_times(full, 10 * args.scrapes)
    signals = signal_costs(full, 5 * args.scrapes)
    return Measured(
        times,
        base_times,
        body,
        base_body,
        cpu_share,
        rss,
        anon,
        inproc,
        inproc_base,
        stage,
        stage_new,
        signals,
    )


def report(m: Measured, window: float) -> None:
    """The lines docs/performance.md quotes, each next to its budget."""
    text = m.body.decode()
    imed, ip90 = summary(m.inproc)
    ibmed, _ = summary(m.inproc_base)
    med, p90 = summary(m.times)
    bmed, bp90 = summary(m.base_times)
    print(f"series: {count_series(text)} (GPU-only agent: {count_series(m.base_body.decode())}); "
          f"pods with named network series: {count_named(text)}")  # fmt: skip
    print(f"render (collect every source + attribution + text), in-process: "
          f"median {imed:.2f} ms, p90 {ip90:.2f} ms  (budget: median <= 25 ms); "
          f"GPU-only: {ibmed:.2f} ms")  # fmt: skip
    print(f"/metrics latency over HTTP, all sources + attribution: "
          f"median {med:.2f} ms, p90 {p90:.2f} ms")  # fmt: skip
    print(f"/metrics latency, GPU-only agent (baseline): median {bmed:.2f} ms, "
          f"p90 {bp90:.2f} ms; ratio {med / bmed:.2f}")  # fmt: skip
    print(f"agent CPU, scraped every 15 s for {window:.0f} s: "
          f"{m.cpu_share:.2%} of one core")  # fmt: skip
    print(f"agent RSS {m.rss:.1f} MB, anonymous {m.anon:.1f} MB  "
          "(budget: RSS <= 180 MB, anonymous <= 100 MB)")  # fmt: skip
    smed, sp90 = summary(m.stage)
    nmed, np90 = summary(m.stage_new)
    print(f"attribution stage on one collection: median {smed:.3f} ms, p90 {sp90:.3f} ms; "
          f"of it energy per pod + low-activity + MIG activity: median {nmed * 1e3:.1f} us, "
          f"p90 {np90 * 1e3:.1f} us ({nmed / smed:.1%} of the stage)")  # fmt: skip
    signal_report(m.signals, imed)


def stop_all(agents: tuple[Agent, Agent], procs: tuple[subprocess.Popen[bytes], ...]) -> None:
    """Stop the in-process agents and reap the subprocesses, whether or not the run got far."""
    for a in agents:
        a.stop()
    for p in procs:
        if p.poll() is None:
            p.terminate()
        p.wait(timeout=10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--pods", type=int, default=PODS)
    parser.add_argument("--scrapes", type=int, default=60)
    parser.add_argument("--window", type=float, default=60.0, help="CPU window, seconds")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root (cgroups, BPF)")
    ensure_built()
    with tempfile.TemporaryDirectory() as tmp:
        fake = FakeNvml("dgx-h100", Path(tmp) / "state")
        with SimNode(fake, Path(tmp) / "node") as node:
            agent, url = start_agent(fake, node, "gpu,net,nic,rdma,kubelet,pods")
            base, base_url = start_agent(fake, node, "gpu")
            full, gpu_only = in_process_agents(fake, node)
            try:
                t0 = time.monotonic()
                grow(node, args.pods)
                print(f"{args.pods} pods started in {time.monotonic() - t0:.1f} s")
                time.sleep(3)  # a kubelet poll and the API watch catch up
                m = measure((agent, base), (url, base_url), full, gpu_only, args)
                report(m, args.window)
            finally:
                stop_all((full, gpu_only), (agent, base))
                shutil.rmtree(PINS, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
