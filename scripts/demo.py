#!/usr/bin/env python3
"""`make demo`: gpuscope on a simulated 8x H100 node with a scripted, changing workload.

The fake NVML library plays the GPUs (tests/doubles/fakenvml), or, for a profile of the
fake AMD SMI library (`--profile mi300x`: tests/doubles/fakeamdsmi/profiles), AMD Instinct
GPUs the agent reads with its `amd` collector, held by pods as `amd.com/gpu`;
tests/doubles/simnode.py
plays the rest of a Kubernetes node: real processes in kubelet-style cgroups as the pods'
containers, a real PodResources gRPC server as the kubelet, an API server double holding the
Pod objects, and real TCP traffic between the pods. The agent is the real `gpuscope`
process, loading the fake through the real pynvml bindings. Prints the /metrics URL and live
per-GPU and per-pod tables until Ctrl-C (or --duration seconds). The pods need root
(cgroups); without it the demo runs with GPUs only.

Every headline signal has a pod behind it: a rank of the training job scheduled after the
agent's first scrape (its start-up time), a data loader reading with O_DIRECT at its
storage's rate while its GPU idles (block I/O, I/O pressure, idle cause `input_io`), and a
notebook over its CPU limit (throttling, idle cause `cpu`). Their cgroups are made where a
kubelet makes them, in the v1 cpu and blkio hierarchies too on a hybrid host
(tests/doubles/podcgroups.py), and go with every process at exit, Ctrl-C included.

`--scenario straggler` runs two synchronous data-parallel jobs of four ranks instead, each
with one rank starved by its data loader (tests/doubles/simnode.py, `straggler_job`): by its
storage on GPUs 0-3, by its CPU limit on GPUs 4-7. The per-pod tables show the starved
rank's stall beside its peers'; a Prometheus with the shipped rules scraping the demo's
/metrics fires TrainingJobStraggler for those two ranks (tests/e2e/test_straggler_e2e.py).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.doubles.fakeamdsmi import control as amd_control  # noqa: E402
from tests.doubles.fakeamdsmi.control import FakeAmdSmi  # noqa: E402
from tests.doubles.fakenvml import control as nvml_control  # noqa: E402
from tests.doubles.fakenvml.control import FakeNvml  # noqa: E402
from tests.doubles.kube_apiserver import owner_reference  # noqa: E402
from tests.doubles.podcgroups import block_device_file  # noqa: E402
from tests.doubles.simgpus import GpuBackend, backend_for  # noqa: E402
from tests.doubles.simnode import (  # noqa: E402
    STARVED_CPUS,
    STARVED_READ_BPS,
    ContainerSpec,
    SimNode,
    straggler_job,
)
from tests.support.promtext import Exposition  # noqa: E402

GIB = 2**30
MB = 1e6
RANK_RATE = 20 * MB  # bytes/s each training rank sends the other (its all-reduce share)
# The training pattern below, averaged: what each rank's processes report per GPU.
TRAIN_PATTERN = [(2.6, 96, 55), (0.6, 8, 70), (0.3, 0, 5)]
TRAIN_SM = sum(d * u for d, u, _ in TRAIN_PATTERN) / sum(d for d, _, _ in TRAIN_PATTERN)
SERVING = ("serving", ["llm-serve-7d9c5b8f4-k2x8m", "llm-serve-7d9c5b8f4-p9q4z"])  # GPUs 4, 5
TRAINING = "ml-team"
MASTER, LATE_RANK = "llama-ft-master-0", "llama-ft-worker-0"  # GPUs 0-1, 2-3
STARTUP = 4.0  # seconds the late rank takes to its first kernel (image pull, initialisation)
NOTEBOOK = ("research", "alice-nb-0")  # GPU 6
NOTEBOOK_CPUS = 0.1  # its CPU limit (a LimitRange default of 100m); its cell wants a whole CPU
LOADER = ("data", "embed-shards-4vq8n")  # GPU 7: Job embed-shards
READ_BPS = 20 * MB  # what the loader's storage delivers (a read limit on its disk)
SHARD_BYTES = 16 << 20  # the file it reads over and over, with O_DIRECT


STORY = f"""\
GPUs 0-3: PyTorchJob llama-ft, 2 ranks x 2 GPUs, talking. Its worker rank is scheduled now,
  after the agent's first scrape, and computes {STARTUP:.0f} s later (its start-up time); the
  master waits for it.
GPUs 4-5: an inference Deployment with a drifting load.
GPU 6: a notebook whose CPU-bound cell runs over its {NOTEBOOK_CPUS * 1000:.0f}m CPU limit:
  throttled, its idle GPU-seconds charged to cpu.
GPU 7: Job embed-shards, its loader reading with O_DIRECT at the storage's {READ_BPS / MB:.0f} MB/s
  while the GPU waits: block I/O, I/O pressure, idle cause input_io. And a stray host
  process holding 3 GiB."""

STRAGGLER_STORY = f"""\
Two synchronous data-parallel PyTorchJobs of four ranks, one GPU each, talking in a ring;
one rank of each holds the job back (its GPU 55 % busy, its peers 92 %: spinning in the
all-reduce while they wait):
GPUs 0-3: ml-team/llama-ft. worker-3's data loader reads with O_DIRECT at the
  {STARVED_READ_BPS / MB:.0f} MB/s its storage allows: its I/O stall stands out from its peers'.
GPUs 4-7: ml-team/bert-ft. worker-1's loader runs over its {STARVED_CPUS * 1000:.0f}m CPU limit:
  throttled, its CPU stall stands out.
Scraped by a Prometheus with the shipped rules, TrainingJobStraggler fires for those two
ranks (causes input_io and cpu), and for no other, within about 4 minutes."""


def add_rank(node: SimNode, rtype: str, gpus: list[int], mem_gib: int, sm_util: float) -> None:
    """One rank (replica index 0 of `rtype`) of PyTorchJob llama-ft."""
    node.add_pod(
        TRAINING,
        f"llama-ft-{rtype}-0",
        containers=[
            ContainerSpec("pytorch", gpus=gpus, gpu_memory_bytes=mem_gib * GIB, sm_util=sm_util)
        ],
        labels={
            "training.kubeflow.org/job-name": "llama-ft",
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/replica-type": rtype,
            "training.kubeflow.org/replica-index": "0",
        },
        owners=[owner_reference("PyTorchJob", "llama-ft", api_version="kubeflow.org/v1")],
    )


def build_pods(node: SimNode, shard: Path | None) -> None:
    """The pods behind the GPU story: who holds what, and who talks to whom. The training
    job's worker rank comes later (schedule_late_rank); its master waits for it, idle."""
    add_rank(node, "master", [0, 1], 62, sm_util=0)
    namespace, names = SERVING
    replica_set = owner_reference("ReplicaSet", "llm-serve-7d9c5b8f4", api_version="apps/v1")
    for gpu, name in zip((4, 5), names, strict=True):
        node.add_pod(
            namespace,
            name,
            containers=[
                ContainerSpec(
                    "vllm", gpus=[gpu], gpu_memory_bytes=18 * GIB, sm_util=35,
                    image="vllm/vllm-openai:v0.6.3",
                )
            ],
            labels={"app": "llm-serve", "pod-template-hash": "7d9c5b8f4"},
            owners=[replica_set],
        )  # fmt: skip
    node.add_pod(
        *NOTEBOOK,
        containers=[
            ContainerSpec(
                "notebook", gpus=[6], gpu_memory_bytes=21 * GIB, sm_util=0,
                image="quay.io/jupyter/pytorch-notebook:cuda12-python-3.11",
                cpu_limit=NOTEBOOK_CPUS, burn_cpu=True,  # a CPU-bound cell, throttled
            )
        ],
        labels={"notebook-name": "alice-nb", "statefulset": "alice-nb"},
        owners=[owner_reference("StatefulSet", "alice-nb", api_version="apps/v1")],
    )  # fmt: skip
    job = owner_reference("Job", "embed-shards", api_version="batch/v1")
    node.add_pod(
        *LOADER,
        containers=[
            ContainerSpec(
                "embed", gpus=[7], gpu_memory_bytes=12 * GIB, sm_util=0,
                read_file=shard, read_bps=READ_BPS,  # its loader waits on storage
            )
        ],
        labels={"batch.kubernetes.io/job-name": "embed-shards", "job-name": "embed-shards"},
        owners=[job],
    )  # fmt: skip
    node.host_process(7, 3 * GIB)  # a stray process outside Kubernetes beside the loader
    for sim in node.pods.values():
        for note in sim.notes:
            print(f"demo: {sim.key}: {note}", file=sys.stderr)


def build_straggler_pods(node: SimNode, shard: Path | None) -> None:
    """--scenario straggler: two jobs of four ranks, one starved rank each (STRAGGLER_STORY);
    without a file on a disk for the loader, both starved by CPU."""
    if shard is not None:
        straggler_job(node, job="llama-ft", gpus=(0, 1, 2, 3), straggler=3, read_file=shard)
    else:
        straggler_job(node, job="llama-ft", gpus=(0, 1, 2, 3), straggler=3, starve="cpu")
    straggler_job(node, job="bert-ft", gpus=(4, 5, 6, 7), straggler=1, starve="cpu")
    for sim in node.pods.values():
        for note in sim.notes:
            print(f"demo: {sim.key}: {note}", file=sys.stderr)


def schedule_late_rank(node: SimNode, stop: threading.Event) -> None:
    """The training job's worker rank, scheduled after the agent's first scrape (when its
    watch for start-ups began): idle for STARTUP seconds, then both ranks train and talk.
    The API writes times to the second, so the pod comes at the next whole second: a pod
    scheduled in the second the watch began could have run unseen, and gets no start-up."""
    began = time.time()
    if stop.wait(math.ceil(began) - began + 0.05):
        return
    add_rank(node, "worker", [2, 3], 63, sm_util=0)
    if stop.wait(STARTUP):
        return
    with node.batch():
        for name in (MASTER, LATE_RANK):
            node.set_usage(TRAINING, name, sm_util=TRAIN_SM)
        if node.gpus.vendor == "nvidia":  # AMD's fake has no pattern: the average holds
            for gpu in range(4):  # after set_usage, which sets the GPUs' sums
                node.fake.set_utilization_pattern(gpu, TRAIN_PATTERN)
    master, worker = f"{TRAINING}/{MASTER}", f"{TRAINING}/{LATE_RANK}"
    node.start_traffic(master, worker, rate=RANK_RATE)
    node.start_traffic(worker, master, rate=RANK_RATE)


def script_workload(
    gpus: GpuBackend, node: SimNode | None, stop: threading.Event, watching: threading.Event
) -> None:
    """A node the way it looks in practice: one busy job, one bursty, idle reservations.

    With pods, the simulated node keeps each GPU's memory and utilization equal to its
    processes' (the pods'); this only adds the training job's burst pattern (whose average
    its processes report), its late rank once the agent watches (`watching`), and the
    inference load's drift.
    """
    fake = gpus.fake
    with gpus.batch():
        if node is None and gpus.vendor == "amd":
            for gpu, (busy, mem_gib) in enumerate([(70, 62)] * 4 + [(35, 18)] * 2 + [(0, 21)]):
                fake.set_activity(gpu, busy, umc=busy // 2)
                fake.set_vram_used(gpu, mem_gib * 1024)
        elif node is None:
            # GPUs 0-3: a data-parallel training job; compute bursts with all-reduce stalls.
            for gpu in range(4):
                fake.set_utilization_pattern(gpu, TRAIN_PATTERN)
                fake.set_memory_used(gpu, (62 + gpu // 2) * GIB)
            # GPUs 4-5: an inference service whose load drifts (changed below).
            for gpu in (4, 5):
                fake.set_utilization(gpu, 35, 20)
                fake.set_memory_used(gpu, 18 * GIB)
            # GPU 6: reserved by a notebook that holds memory and computes nothing.
            fake.set_utilization(6, 0, 0)
            fake.set_memory_used(6, 21 * GIB)
            # GPU 7: free (but for a loader and a stray 3 GiB host process with pods).
            fake.set_utilization(7, 0, 0)
    if node is not None:
        while not watching.wait(0.1):
            if stop.is_set():
                return
        schedule_late_rank(node, stop)
    rng = random.Random(7)
    t0 = time.monotonic()
    tick = 0
    while not stop.wait(5.0):
        tick += 1
        phase = (time.monotonic() - t0) / 60.0 * 2 * math.pi
        # One state-file write for both GPUs. With pods the node's batch takes its lock before
        # the fake's, the one order (set_usage inside fake.batch() would deadlock remove_pod).
        with node.batch() if node is not None else gpus.batch():
            for gpu, name in zip((4, 5), SERVING[1], strict=True):
                load = max(0.0, min(100.0, 45 + 35 * math.sin(phase + gpu) + rng.uniform(-5, 5)))
                if node is not None:
                    node.set_usage(SERVING[0], name, sm_util=load, mem_util=load / 3)
                elif gpus.vendor == "amd":
                    fake.set_activity(gpu, round(load), umc=round(load / 3))
                else:
                    fake.set_utilization(gpu, load, load / 3)
        if tick % 6 == 0:
            if gpus.vendor == "amd":
                fake.post_event(5, "vmfault", "page fault in the inference server")
            else:
                fake.inject_xid(5, 31)  # an application's illegal memory access


def free_port(preferred: int) -> int:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", preferred))
            return preferred
        except OSError:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])


def fetch(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return resp.read().decode()


def summary(now: Exposition, before: Exposition | None, elapsed: float) -> str:
    rows = [
        f"{'GPU':>3}  {'model':<22} {'up':>2} {'util':>5} {'avg':>5} {'memory used':>14} "
        f"{'power':>7} {'temp':>5} {'XIDs':>4}"
    ]
    models = {dict(k)["gpu"]: dict(k)["model"] for k in now.series("gpuscope_gpu_info")}
    for gpu in sorted(models, key=int):

        def get(name: str, gpu: str = gpu, **kw: str) -> float | None:
            return now.get(name, gpu=gpu, **kw)

        busy = get("gpuscope_gpu_busy_seconds_total")
        busy_before = before.get("gpuscope_gpu_busy_seconds_total", gpu=gpu) if before else None
        avg = (
            f"{(busy - busy_before) / elapsed:5.0%}"
            if busy is not None and busy_before is not None and elapsed > 0
            else "    -"
        )
        util = get("gpuscope_gpu_utilization_ratio")
        used = get("gpuscope_gpu_memory_used_bytes") or 0
        total = get("gpuscope_gpu_memory_total_bytes") or 0
        power = get("gpuscope_gpu_power_watts")
        temp = get("gpuscope_gpu_temperature_celsius", sensor="gpu")
        xids = sum(now.series("gpuscope_gpu_xid_errors_total", gpu=gpu).values())
        xids += sum(now.series("gpuscope_gpu_events_total", gpu=gpu).values())  # AMD's
        rows.append(
            f"{gpu:>3}  {models[gpu][:22]:<22} {int(get('gpuscope_gpu_up') or 0):>2} "
            f"{(util or 0):5.0%} {avg} {used / GIB:6.1f}/{total / GIB:5.1f} GiB "
            f"{(power or 0):6.0f}W {(temp or 0):4.0f}C {int(xids):>4}"
        )
    return "\n".join(rows)


def network_line(m: Exposition) -> str:
    absent = {c for c, v in m.by_label("gpuscope_collector_absent", "collector").items() if v}
    status: dict[str, int | str] = {
        c: "absent" if c in absent else int(v)
        for c, v in m.by_label("gpuscope_collector_success", "collector").items()
    }  # "absent": the other vendor's collector on this node (its library is not installed)
    if status.get("net") != 1:
        return f"collectors: {status} (net needs root, BPF and tracefs: see the agent's log)"
    host_tx = sum(m.series("gpuscope_pod_network_transmit_bytes_total", pod_uid="").values())
    nics = len(m.series("gpuscope_nic_info"))
    return f"collectors: {status}; host sent {host_tx / 1e6:.2f} MB since start; {nics} NIC(s)"


COMPILER_LIBRARIES = ("libLLVM", "libclang", "libbcc")


def footprint(pid: int) -> str:
    """The agent's memory and threads, and whether a compiler is mapped in it (the eBPF
    probes are compiled by the `gpuscope bpf-load` child, never in the agent)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        maps = Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return "agent: gone"
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    rss_mb = int(fields["VmRSS"].split()[0]) * 1024 / 1e6
    mapped = sorted({lib for lib in COMPILER_LIBRARIES if lib in maps})
    return f"agent: VmRSS {rss_mb:.1f} MB, {fields['Threads'].strip()} threads, " + (
        f"compiler mapped: {', '.join(mapped)}" if mapped else "no compiler mapped"
    )


PodKey = tuple[str, str]


def _pod_sums(m: Exposition, name: str, **match: str) -> dict[PodKey, float]:
    out: dict[PodKey, float] = {}
    for labels, value in m.series(name, **match).items():
        d = dict(labels)
        if d.get("pod"):
            key = (d.get("namespace", ""), d["pod"])
            out[key] = out.get(key, 0.0) + value
    return out


def _pod_key(d: dict[str, str]) -> PodKey:
    return (d.get("namespace", ""), d.get("pod", ""))


def _pod_gpus_and_workloads(m: Exposition) -> tuple[dict[PodKey, set[str]], dict[PodKey, str]]:
    """GPUs each pod holds and its workload; the allocation's workload wins over pod_info's,
    which names the workload of pods that hold no GPU."""
    gpus: dict[PodKey, set[str]] = {}
    workload: dict[PodKey, str] = {}
    for labels in m.series("gpuscope_gpu_allocation_info"):
        d = dict(labels)
        key = _pod_key(d)
        gpus.setdefault(key, set()).add(d.get("gpu", "?"))
        if d.get("workload"):
            workload[key] = f"{d.get('workload_kind', '')}/{d['workload']}"
    for labels in m.series("gpuscope_pod_info"):
        d = dict(labels)
        key = _pod_key(d)
        if d.get("workload") and key not in workload:
            workload[key] = f"{d.get('workload_kind', '')}/{d['workload']}"
    return gpus, workload


def _pod_counts(m: Exposition, name: str) -> dict[PodKey, int]:
    """Series per pod, to average a ratio that _pod_sums adds up."""
    out: dict[PodKey, int] = {}
    for labels in m.series(name):
        d = dict(labels)
        if d.get("pod"):
            key = (d.get("namespace", ""), d["pod"])
            out[key] = out.get(key, 0) + 1
    return out


@dataclass
class _PodView:
    """The per-pod series of one scrape (and the previous one's network, for a rate)."""

    gpus: dict[PodKey, set[str]]
    workload: dict[PodKey, str]
    memory: dict[PodKey, float]
    util_sum: dict[PodKey, float]
    util_n: dict[PodKey, int]
    idle: dict[str, float]
    tx: dict[PodKey, float]
    tx_before: dict[PodKey, float]

    @classmethod
    def of(cls, now: Exposition, before: Exposition | None) -> _PodView:
        gpus, workload = _pod_gpus_and_workloads(now)
        idle = {
            dict(k).get("gpu", ""): v
            for k, v in now.series("gpuscope_gpu_allocated_idle_seconds").items()
        }
        return cls(
            gpus=gpus,
            workload=workload,
            memory=_pod_sums(now, "gpuscope_pod_gpu_memory_bytes"),
            util_sum=_pod_sums(now, "gpuscope_pod_gpu_utilization_ratio"),
            util_n=_pod_counts(now, "gpuscope_pod_gpu_utilization_ratio"),
            idle=idle,
            tx=_pod_sums(now, "gpuscope_pod_network_transmit_bytes_total"),
            tx_before=(
                _pod_sums(before, "gpuscope_pod_network_transmit_bytes_total") if before else {}
            ),
        )

    def keys(self) -> list[PodKey]:
        """Every named pod any series mentions, in order."""
        keys = sorted(set(self.gpus) | set(self.workload) | set(self.memory) | set(self.tx))
        return [k for k in keys if k[1]]

    def row(self, key: PodKey, elapsed: float) -> str:
        held = sorted(self.gpus.get(key, ()), key=lambda g: int(g) if g.isdigit() else -1)
        idle_s = max((self.idle.get(g, 0.0) for g in held), default=None)
        util = self.util_sum[key] / self.util_n[key] if self.util_n.get(key) else None
        tx, tx_before, memory = self.tx, self.tx_before, self.memory
        rate = (
            f"{(tx[key] - tx_before[key]) / elapsed / MB:6.1f} MB/s"
            if key in tx and key in tx_before and elapsed > 0
            else "         -"
        )
        return (
            f"{key[0] + '/' + key[1]:<42.42} {self.workload.get(key, '-'):<22.22} "
            f"{','.join(held) or '-':<8} "
            f"{(f'{memory[key] / GIB:5.1f} GiB' if key in memory else '-'):>9} "
            f"{(f'{util:5.0%}' if util is not None else '-'):>5} "
            f"{(f'{idle_s:5.0f}s' if idle_s is not None else '-'):>6} {rate:>10} "
            f"{(f'{tx[key] / MB:6.1f} MB' if key in tx else '-'):>9}"
        )


def _stray_line(m: Exposition) -> str | None:
    """GPU memory no allocation accounts for, the leak a reader of the demo should notice."""
    stray = {
        dict(k).get("gpu", "?"): v
        for k, v in m.series("gpuscope_gpu_unallocated_memory_bytes").items()
        if v > 0
    }
    if not stray:
        return None
    where = ", ".join(f"GPU {g}: {v / GIB:.1f} GiB" for g, v in sorted(stray.items()))
    return f"memory held outside the GPUs' allocations: {where}"


# The pod signals of the "why idle" table: (heading, series, labels to match, as a share of
# time (a rate of seconds) or in MB/s (a rate of bytes)).
SIGNALS: tuple[tuple[str, str, dict[str, str], bool], ...] = (
    ("disk read", "gpuscope_pod_io_bytes_total", {"direction": "read"}, False),
    ("I/O stall", "gpuscope_pod_pressure_stalled_seconds_total",
     {"resource": "io", "stall": "some"}, True),
    ("CPU stall", "gpuscope_pod_pressure_stalled_seconds_total",
     {"resource": "cpu", "stall": "some"}, True),
    ("throttled", "gpuscope_pod_cpu_throttled_seconds_total", {}, True),
)  # fmt: skip


def _idle_causes(m: Exposition) -> dict[tuple[str, str], dict[str, float]]:
    """(namespace, "Kind/name") -> idle GPU-seconds by cause, of each workload."""
    out: dict[tuple[str, str], dict[str, float]] = {}
    for d, value in m.rows("gpuscope_workload_gpu_idle_cause_seconds_total"):
        workload = f"{d.get('workload_kind', '')}/{d.get('workload', '')}"
        out.setdefault((d.get("namespace", ""), workload), {})[d.get("cause", "?")] = value
    return out


def signals_summary(now: Exposition, before: Exposition | None, elapsed: float) -> str:
    """Per pod, why its GPUs may wait: its start-up time, its cgroup's disk reads, I/O and
    CPU stalls and CPU throttling since the previous table (rates: "-" until there is one),
    and its workload's idle GPU-seconds by cause."""
    view = _PodView.of(now, before)
    keys = view.keys()
    if not keys:
        return ""
    startup = _pod_sums(now, "gpuscope_pod_gpu_startup_seconds")
    causes = _idle_causes(now)
    columns = []
    for _heading, name, match, share in SIGNALS:
        got = _pod_sums(now, name, **match)
        had = _pod_sums(before, name, **match) if before else {}
        columns.append((got, had, share))
    rows = [
        f"{'pod':<42} {'start-up':>8} "
        + " ".join(f"{heading:>10}" for heading, *_ in SIGNALS)
        + "  idle GPU-seconds of its workload, by cause"
    ]
    for key in keys:
        cells = [f"{startup[key]:7.0f}s" if key in startup else f"{'-':>8}"]
        for got, had, share in columns:
            if key in got and key in had and elapsed > 0:
                rate = (got[key] - had[key]) / elapsed
                cells.append(f"{rate:10.0%}" if share else f"{rate / MB:5.1f} MB/s")
            else:
                cells.append(f"{'-':>10}")
        seconds = causes.get((key[0], view.workload.get(key, "")), {})
        charged = sorted(((v, c) for c, v in seconds.items() if v >= 0.5), reverse=True)
        why = ", ".join(f"{c} {v:.0f}s" for v, c in charged) or "-"
        rows.append(f"{key[0] + '/' + key[1]:<42.42} " + " ".join(cells) + f"  {why}")
    return "\n".join(rows)


def pods_summary(now: Exposition, before: Exposition | None, elapsed: float) -> str:
    """Per pod: its workload, GPUs, GPU memory and utilization, idle time, network sent."""
    view = _PodView.of(now, before)
    keys = view.keys()
    if not keys:
        return "pods: no per-pod series yet (see collectors kubelet and pods above)"
    rows = [
        f"{'pod':<42} {'workload':<22} {'GPUs':<8} {'GPU mem':>9} {'util':>5} "
        f"{'idle':>6} {'net tx':>10} {'total':>9}"
    ]
    rows.extend(view.row(key, elapsed) for key in keys)
    stray = _stray_line(now)
    if stray:
        rows.append(stray)
    return "\n".join(rows)


def agent_flags(node: SimNode | None, gpus: GpuBackend) -> list[str]:
    """Point the agent at the simulated kubelet and API server (flags it knows, if any); on
    AMD at the GPUs' sysfs too."""
    sysfs = node.sysfs if node is not None else getattr(gpus, "sysfs", None)
    extra = ["--sysfs", str(sysfs)] if sysfs is not None else []
    if node is None:
        return extra
    known = subprocess.run(
        [sys.executable, "-m", "gpuscope", "--help"],
        cwd=REPO, capture_output=True, text=True, check=False,
    ).stdout  # fmt: skip
    flags = [
        ("--node-name", node.node_name),
        ("--kubelet-socket", str(node.kubelet_socket)),
        ("--kubeconfig", str(node.kubeconfig)),
    ]
    args = [x for flag, value in flags if flag in known for x in (flag, value)]
    if "--kubelet-socket" not in known:
        print("demo: this agent has no --kubelet-socket yet: no pod attribution", file=sys.stderr)
    return [*extra, *args]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument(
        "--profile", default="dgx-h100",
        help="a fake NVML profile (tests/doubles/fakenvml/profiles) or a fake AMD SMI one "
        "(tests/doubles/fakeamdsmi/profiles: mi300x, mi300x-cpx, mi250x, ...)",
    )  # fmt: skip
    parser.add_argument("--port", type=int, default=int(os.environ.get("DEMO_PORT", "19400")))
    parser.add_argument("--duration", type=float, default=0, help="seconds; 0 = until Ctrl-C")
    parser.add_argument("--every", type=float, default=5.0, help="seconds between tables")
    parser.add_argument(
        "--scenario", choices=("node", "straggler"), default="node",
        help="node: the mixed node of the story below; straggler: two training jobs, one rank "
        "of each starved by its data loader (TrainingJobStraggler)",
    )  # fmt: skip
    parser.add_argument(
        "--state-dir", type=Path, default=REPO / "build" / "demo",
        help="the fake NVML's state, the node's logs and the loader's file (if on a disk)",
    )  # fmt: skip
    args = parser.parse_args()
    # SIGTERM unwinds like Ctrl-C, so the pods' processes and cgroups go either way.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        return demo(args)
    except KeyboardInterrupt:
        return 0


def _shield() -> None:
    """A second Ctrl-C (or a SIGTERM) must not cut the clean-up of processes and cgroups."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)


def shard_file(state_dir: Path) -> Path | None:
    """The loader's file, on the first of the state directory and /var/tmp whose file
    system is on a disk that takes O_DIRECT (tmpfs is on none); None if neither is."""
    for path in (state_dir / "shard.bin", Path("/var/tmp") / f"gpuscope-demo-{os.getpid()}.bin"):
        with contextlib.suppress(OSError):
            if block_device_file(path, SHARD_BYTES) is not None:
                return path
    print("demo: no disk file system that takes O_DIRECT: the loader reads nothing",
          file=sys.stderr)  # fmt: skip
    return None


def make_fake(profile: str, state_dir: Path) -> FakeNvml | FakeAmdSmi:
    """The fake library of the profile's vendor: AMD's for a fakeamdsmi profile (its clock
    at the real time, which the node's backend then follows), else NVIDIA's."""
    if profile in amd_control.list_profiles():
        amd_control.ensure_built()
        return FakeAmdSmi(profile, state_dir / "amd-state", now=time.time())
    nvml_control.ensure_built()
    return FakeNvml(profile, state_dir / "state")


def demo(args: argparse.Namespace) -> int:
    state_dir: Path = args.state_dir
    state_dir.mkdir(parents=True, exist_ok=True)
    fake = make_fake(args.profile, state_dir)
    stop = threading.Event()
    watching = threading.Event()  # the agent's first scrape is done: its watch began
    with contextlib.ExitStack() as cleanup:
        node: SimNode | None = None
        gpus: GpuBackend | None = None
        if os.geteuid() != 0:
            print("demo: not root, so no simulated pods (they need cgroups)", file=sys.stderr)
        elif (count := fake.gpu_count if isinstance(fake, FakeAmdSmi) else fake.gpu_count()) < 8:
            print(f"demo: {args.profile} has {count} GPUs, under 8: no simulated pods",
                  file=sys.stderr)  # fmt: skip
        else:
            shard = shard_file(state_dir)
            if shard is not None:
                cleanup.callback(shard.unlink, missing_ok=True)
            node = cleanup.enter_context(SimNode(fake, state_dir / "node"))
            gpus = node.gpus
            if args.scenario == "straggler":
                build_straggler_pods(node, shard)
            else:
                build_pods(node, shard)
        if gpus is None:  # GPUs only; AMD's still needs its clock moved
            gpus = backend_for(fake, state_dir / "sys")
            cleanup.callback(gpus.close)
        if node is None or args.scenario != "straggler":  # the straggler jobs are steady
            script = threading.Thread(
                target=script_workload, args=(gpus, node, stop, watching), daemon=True
            )
            script.start()
            cleanup.callback(script.join, 10)
        cleanup.callback(stop.set)
        cleanup.callback(_shield)  # first of the clean-up: nothing may cut it short
        return run_agent(args, gpus, node, stop, watching)
    return 0


DEMO_PINS = Path("/sys/fs/bpf/gpuscope-demo")  # not the pins of a real agent on this host


def run_agent(
    args: argparse.Namespace,
    gpus: GpuBackend,
    node: SimNode | None,
    stop: threading.Event,
    watching: threading.Event,
) -> int:
    port = free_port(args.port)
    env = os.environ | gpus.fake.env()
    if node is not None:
        env["NODE_NAME"] = node.node_name
    agent = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuscope",
            "--listen",
            f"127.0.0.1:{port}",
            "--kernel-headers",
            str(REPO / "build" / "kernel-headers" / "debian"),
            "--bpf-pin-root",
            str(DEMO_PINS),
            "--labels-mode",
            "none",  # the node's labels are not published here; `gpuscope labels` shows them
            *agent_flags(node, gpus),
        ],
        cwd=REPO,
        env=env,
    )
    try:
        return watch(args, agent, port, stop, watching, node is not None)
    finally:
        _shield()
        stop.set()
        agent.terminate()
        try:
            agent.wait(timeout=10)
        except subprocess.TimeoutExpired:
            agent.kill()
            agent.wait()
        # The probes stay pinned after the agent exits (that is what lets a restarted agent
        # continue its counters); the demo leaves nothing attached behind it.
        subprocess.run(
            [sys.executable, "-m", "gpuscope", "bpf-load", "--unload", "--bpf-pin-root",
             str(DEMO_PINS)], cwd=REPO, check=False,
        )  # fmt: skip


def watch(
    args: argparse.Namespace,
    agent: subprocess.Popen[bytes],
    port: int,
    stop: threading.Event,
    watching: threading.Event,
    watching_pods: bool,
) -> int:
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if fetch(base + "/readyz").startswith("ready"):
                break
        except OSError:
            pass
        if agent.poll() is not None or time.monotonic() > deadline:
            print("demo: the agent did not become ready", file=sys.stderr)
            return 1
        time.sleep(0.1)

    print(f"\ngpuscope is serving a simulated {args.profile} node at {base}/metrics")
    story = STRAGGLER_STORY if args.scenario == "straggler" else STORY
    print(story if watching_pods else "GPUs only: no simulated pods (see above)")
    print("Try: curl -s " + base + "/metrics | grep -E 'busy_seconds|pod_gpu'   (Ctrl-C to stop)\n")

    # Ctrl-C and SIGTERM end the loop between scrapes, never in the middle of one.
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    started = time.monotonic()
    before: Exposition | None = None
    before_at = time.monotonic()
    try:
        while not stop.is_set():
            now_at = time.monotonic()
            try:
                now = Exposition(fetch(base + "/metrics"))
            except OSError:
                if stop.is_set() or agent.poll() is not None:
                    break  # Ctrl-C reached the agent too: it is going
                raise
            print(time.strftime("%H:%M:%S"), f"({len(now.samples)} series)")
            print(summary(now, before, now_at - before_at))
            print(network_line(now))
            print(footprint(agent.pid))
            print(pods_summary(now, before, now_at - before_at))
            print(signals_summary(now, before, now_at - before_at), flush=True)
            print()
            watching.set()  # this scrape was the agent's first evaluation with GPUs
            before, before_at = now, now_at
            if args.duration and now_at - started >= args.duration:
                break
            stop.wait(args.every)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
