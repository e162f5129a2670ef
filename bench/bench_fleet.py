#!/usr/bin/env python3
"""A fleet on one machine: Debian's Prometheus scraping N simulated GPU nodes (issues #15, #25).

Each node is a SimNode (tests/doubles/simnode.py: its own fake NVML profile, a kubelet
PodResources server, an API server double and a few pods that are real processes in
kubelet-style cgroups) with a fake sysfs tree of NICs and RDMA ports (make_sysfs.py), and a
real `gpuscope` agent process (collectors gpu, nic, rdma, kubelet, pods: not net, whose BPF
compile would cost a core-minute per agent here), its own --node-name and port, and
--series-node-label true. Prometheus (the binary the e2e tests run) scrapes every agent at
--scrape-interval with daemonset/rules/gpuscope.rules.yml loaded and a `cluster` target
label; the agents serve dcgm-exporter's DCGM_FI_* names themselves with --dcgm-compat (on
by default here; no DCGM rule group exists to evaluate). It remote-writes to a small HTTP
receiver in this process that counts the bytes it gets and decodes them (snappy +
protobuf) to count the samples, and to Debian's VictoriaMetrics single node (unless
--no-victoria-metrics).

Printed figures, no assertions:
  * series per node and scrape bytes (plain and gzip) per profile, at each --metrics-detail
    level the agent accepts (the fleet runs at the first; the others are measured on one
    extra agent per profile), and with the fleet's --dcgm-compat against without it (one
    extra agent per profile, at the fleet's level);
  * Prometheus head series, samples appended per second (prometheus_tsdb_head_samples_
    appended_total over the measuring window), RSS and Go heap in use, per head series;
  * remote-write bytes per sample and per node per second;
  * every evaluation of each rule group over the window (/api/v1/rules, polled: median and
    max), and the slowest rules of the groups outside gpuscope.rules.yml;
  * the latency of every dashboard query (dashboards/*.json, Grafana variables substituted)
    through /api/v1/query, median of --tries, and every query that errors;
  * VictoriaMetrics: samples ingested per second, bytes per sample on disk, RSS and CPU
    beside Prometheus's, every dashboard query's latency there, and its answer compared with
    Prometheus's at the same timestamp (same series, values within 5 %, or how they differ).
Everything it started goes on exit, on Ctrl-C and on SIGTERM.

    .venv/bin/python bench/bench_fleet.py            # 50 nodes, 15 s scrapes, 150 s window
    .venv/bin/python bench/bench_fleet.py --nodes 5 --duration 30   # a quick look
    .venv/bin/python bench/bench_fleet.py --extra-rules candidate.yml   # A/B a rule change
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import http.server
import itertools
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

from prometheus_client.parser import text_string_to_metric_families

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# The simulated kubelets are gRPC servers in this process: quiet its note on every fork.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")

from bench.bench_gpu import proc_cpu_seconds, proc_rss_mb  # noqa: E402
from tests.doubles.fakenvml import control as fakenvml_control  # noqa: E402
from tests.doubles.fakenvml.control import FakeNvml, ensure_built, load_profile  # noqa: E402
from tests.doubles.kube_apiserver import owner_reference  # noqa: E402
from tests.doubles.make_sysfs import write_tree  # noqa: E402
from tests.doubles.netlab import cgroup_v2_root  # noqa: E402
from tests.doubles.simnode import GIB, ContainerSpec, SimNode, pytorchjob_pod  # noqa: E402
from tests.support import GPUSCOPE, AgentProcess, free_port, sim_node_args  # noqa: E402
from tests.support.observability import (  # noqa: E402
    Query,
    all_queries,
    label_values_query,
    substitute,
)
from tests.support.prometheus_process import (  # noqa: E402
    PrometheusFailed,
    launch_prometheus,
    launch_victoria_metrics,
)

UUID_LABEL = re.compile(r'[{,]uuid="([^"]+)"')
# A server's own /metrics: {(name, labels): value}.
Metrics = Mapping[tuple[str, frozenset[tuple[str, str]]], float]
RULES_DIR = REPO / "daemonset" / "rules"
# The agents' --dcgm-compat values: the DCGM names are the agent's, not rules (#25).
DCGM_COMPAT = ("off", "on", "exported-labels")
NO_DCGM = "no-dcgm"  # the per-level key of the agents measured without --dcgm-compat
PROFILES = ("dgx-h100", "dgx-h100", "dgx-h100-mig", "hgx-a100-mig", "pcie-l40s", "mixed")
LEVELS = ("default", "full")
COLLECTORS = "gpu,nic,rdma,kubelet,pods"
CLUSTER = "fleet-bench"
JOB = "gpuscope"
RANKS_PER_JOB_NODE = 2  # each training job spans 4 nodes, 2 ranks a node


# --- the nodes ------------------------------------------------------------------------------


def node_fake(profile: str, index: int, state: Path) -> FakeNvml:
    """The fake NVML of node `index`: `profile` with UUIDs and serials of its own (the
    profiles' are fixed, and one UUID on two nodes breaks every join on uuid, as it never
    happens on real GPUs)."""

    def load(name: str) -> dict[str, Any]:
        loaded = load_profile(name)
        for gpu in loaded["gpus"]:
            gpu["uuid"] = f"{gpu['uuid'][:-12]}{index:06x}{gpu['uuid'][-6:]}"
            gpu["serial"] = f"{index:04d}{gpu['serial'][4:]}"
            for mig in gpu.get("mig_devices", []):
                mig["uuid"] = f"{mig['uuid'][:-12]}{index:06x}{mig['uuid'][-6:]}"
        return loaded

    with mock.patch.object(fakenvml_control, "load_profile", load):
        return FakeNvml(profile, state)


def free_gpus(fake: FakeNvml) -> list[int]:
    """GPUs without MIG devices: the simulated kubelet hands out whole GPUs only."""
    return [g for g in range(fake.gpu_count()) if not fake.mig_devices(g)]


def build_pods(node: SimNode, index: int) -> int:
    """The pods of node `index`: two ranks of a PyTorchJob that spans 4 nodes, an inference
    replica, an idle notebook (on the GPUs without MIG, as far as they go) and a CPU-only pod.
    Returns the number of pods."""
    gpus = free_gpus(node.fake)
    share = max(1, len(gpus) // 4)
    job = f"train-{index // 4}"
    pods = 0
    for r in range(RANKS_PER_JOB_NODE):
        held = gpus[r * share : (r + 1) * share]
        if not held:
            break
        rank = (index % 4) * RANKS_PER_JOB_NODE + r
        node.add_pod(
            "ml-team",
            f"{job}-worker-{rank}",
            containers=[ContainerSpec("pytorch", gpus=held, gpu_memory_bytes=60 * GIB, sm_util=90)],
            **pytorchjob_pod(job, rank),
        )
        pods += 1
    rest = gpus[RANKS_PER_JOB_NODE * share :]
    rs = owner_reference("ReplicaSet", "llm-serve-7d9c5b8f4", api_version="apps/v1")
    singles = (
        ("serving", f"llm-serve-7d9c5b8f4-n{index}", 35.0, {"app": "llm-serve"}, rs),
        ("research", f"nb-{index}-0", 0.0, {"notebook-name": f"nb-{index}"},
         owner_reference("StatefulSet", f"nb-{index}", api_version="apps/v1")),
    )  # fmt: skip
    for gpu, (namespace, name, sm, labels, owner) in zip(rest, singles, strict=False):
        node.add_pod(
            namespace,
            name,
            containers=[ContainerSpec("main", gpus=[gpu], gpu_memory_bytes=16 * GIB, sm_util=sm)],
            labels=labels,
            owners=[owner],
        )
        pods += 1
    node.add_pod(
        "monitoring",
        f"node-exporter-{index}",
        containers=[ContainerSpec("node-exporter", image="quay.io/prometheus/node-exporter")],
        labels={"app": "node-exporter"},
        owners=[owner_reference("DaemonSet", "node-exporter", api_version="apps/v1")],
    )
    return pods + 1


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM when this benchmark dies, however it dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def launch_agent(
    node: SimNode, sysfs: Path, logdir: Path, level: str | None, *extra: str
) -> AgentProcess:
    """The real agent on `node`, not waited for (AgentProcess.wait_ready does that)."""
    port = free_port()
    args = [
        *sim_node_args(node),
        "--kubelet-interval", "10",  # the default; sim_node_args polls every second
        "--collectors", COLLECTORS,
        "--sysfs", str(sysfs),  # NICs and RDMA ports; the pods' cgroups are the host's:
        "--cgroup-root", str(cgroup_v2_root()),
        "--series-node-label", "true",
        "--log-level", "warning",
        *(["--metrics-detail", level] if level else []),
        *extra,
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUSCOPE_")}
    env.pop("FAKENVML_STATE", None)
    env |= node.fake.env() | {"PYTHONUNBUFFERED": "1"}
    log_path = logdir / f"{node.node_name}-{level or 'agent'}-{port}.log"
    with log_path.open("w") as log:
        proc = subprocess.Popen(
            [*GPUSCOPE, "--listen", f"127.0.0.1:{port}", *args],
            cwd=REPO,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            preexec_fn=_die_with_parent,
        )
    return AgentProcess(proc=proc, port=port, log_path=log_path)


def accepted_levels(wanted: Sequence[str]) -> tuple[list[str | None], str]:
    """The detail levels to run, and a note. Without --metrics-detail in the agent's --help,
    one run without the flag (None)."""
    out = subprocess.run(
        [*GPUSCOPE, "--help"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout
    if "--metrics-detail" not in out:
        return [None], "the agent has no --metrics-detail flag: one level, its only one"
    return list(wanted), ""


# --- Prometheus and a remote-write receiver --------------------------------------------------


def snappy_decompress(data: bytes) -> bytes:
    """Snappy's block format (what remote write sends), without the C library."""
    pos, length, shift = 0, 0, 0
    while True:
        b = data[pos]
        pos += 1
        length |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            break
    out = bytearray()
    n = len(data)
    while pos < n:
        tag = data[pos]
        pos += 1
        kind = tag & 3
        if kind == 0:  # literal
            size = tag >> 2
            if size >= 60:
                extra = size - 59
                size = int.from_bytes(data[pos : pos + extra], "little")
                pos += extra
            size += 1
            out += data[pos : pos + size]
            pos += size
            continue
        if kind == 1:
            size = 4 + ((tag >> 2) & 7)
            offset = ((tag >> 5) << 8) | data[pos]
            pos += 1
        else:
            size = (tag >> 2) + 1
            width = 2 if kind == 2 else 4
            offset = int.from_bytes(data[pos : pos + width], "little")
            pos += width
        start = len(out) - offset
        if offset >= size:
            out += out[start : start + size]
        else:  # overlapping copy: the pattern repeats
            while size > 0:
                chunk = out[start : start + min(size, offset)]
                out += chunk
                size -= len(chunk)
    if len(out) != length:
        raise ValueError(f"snappy: {len(out)} bytes, header says {length}")
    return bytes(out)


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    value, shift = 0, 0
    while True:
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        shift += 7
        if b < 0x80:
            return value, pos


def _fields(buf: bytes) -> Iterator[tuple[int, bytes | None]]:
    """(field number, bytes of a length-delimited field or None) of a protobuf message."""
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = _varint(buf, pos)
        wire = key & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
            yield key >> 3, None
        elif wire == 1:
            pos += 8
            yield key >> 3, None
        elif wire == 2:
            size, pos = _varint(buf, pos)
            yield key >> 3, buf[pos : pos + size]
            pos += size
        elif wire == 5:
            pos += 4
            yield key >> 3, None
        else:
            raise ValueError(f"protobuf wire type {wire}")


def write_request_counts(raw: bytes) -> tuple[int, int, int]:
    """(series, samples, metadata entries) of a prometheus.WriteRequest."""
    series = samples = metadata = 0
    for number, value in _fields(raw):
        if number == 1 and value is not None:  # TimeSeries: labels 1, samples 2
            series += 1
            samples += sum(1 for f, _ in _fields(value) if f == 2)
        elif number == 3:
            metadata += 1
    return series, samples, metadata


@dataclass
class Receiver:
    """Counts what Prometheus remote-writes to it (http://127.0.0.1:<port>/api/v1/write)."""

    requests: int = 0
    wire_bytes: int = 0  # request bodies as sent: snappy-compressed protobuf
    raw_bytes: int = 0  # the same uncompressed
    series: int = 0
    samples: int = 0
    metadata: int = 0
    undecoded: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def snapshot(self) -> dict[str, int]:
        with self.lock:
            return {
                k: getattr(self, k)
                for k in ("requests", "wire_bytes", "raw_bytes", "series", "samples", "metadata")
            }


@contextlib.contextmanager
def receiver() -> Iterator[tuple[Receiver, int]]:
    counts = Receiver()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
            try:
                raw = snappy_decompress(body)
                series, samples, metadata = write_request_counts(raw)
            except (ValueError, IndexError):
                raw, series, samples, metadata = b"", 0, 0, 0
                with counts.lock:
                    counts.undecoded += 1
            with counts.lock:
                counts.requests += 1
                counts.wire_bytes += len(body)
                counts.raw_bytes += len(raw)
                counts.series += series
                counts.samples += samples
                counts.metadata += metadata
            self.send_response(204)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield counts, int(server.server_address[1])
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[str]
    log: Path

    def api(self, path: str, **params: str) -> tuple[Any, str]:
        """(data, error) of an HTTP API call."""
        url = f"{self.url}{path}?{urllib.parse.urlencode(params)}"
        try:
            with urllib.request.urlopen(url, timeout=60) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            body = json.loads(err.read() or b"{}")
        except OSError as err:
            return None, str(err)
        if body.get("status") != "success":
            return None, str(body.get("error", body))
        return body["data"], ""

    def query(self, expr: str) -> list[dict[str, Any]]:
        data, error = self.api("/api/v1/query", query=expr)
        if error:
            raise RuntimeError(f"{expr}: {error}")
        result: list[dict[str, Any]] = data["result"]
        return result

    def own_metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Prometheus' own /metrics (it does not scrape itself here)."""
        with urllib.request.urlopen(self.url + "/metrics", timeout=30) as resp:
            text = resp.read().decode()
        return {
            (s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text)
            for s in family.samples
        }


def one(metrics: Metrics, name: str, **match: str) -> float:
    """The sum of `name`'s series that carry the labels `match`."""
    return sum(v for (n, labels), v in metrics.items() if n == name and match.items() <= labels)


def rule_files(args: argparse.Namespace) -> list[Path]:
    return [RULES_DIR / "gpuscope.rules.yml", *args.extra_rules]


def dcgm_args(args: argparse.Namespace) -> list[str]:
    """The fleet agents' --dcgm-compat, where on."""
    return [] if args.dcgm_compat == "off" else ["--dcgm-compat", args.dcgm_compat]


def start_prometheus(
    tmp: Path,
    targets: Mapping[str, int],
    interval: int,
    remote_urls: Sequence[str],
    rules: Sequence[Path],
) -> Prometheus:
    """Debian's prometheus (as tests/e2e/test_prometheus_e2e.py runs it), scraping every
    127.0.0.1:<port> as job gpuscope with a `cluster` target label; the agents put `node` on
    their series themselves (--series-node-label)."""
    config: dict[str, Any] = {
        "global": {
            "scrape_interval": f"{interval}s",
            "scrape_timeout": f"{min(interval, 10)}s",
            "evaluation_interval": f"{interval}s",
        },
        "rule_files": [str(p) for p in rules],
        "scrape_configs": [
            {
                "job_name": JOB,
                "honor_labels": True,
                "static_configs": [
                    {"targets": [f"127.0.0.1:{p}" for p in targets.values()],
                     "labels": {"cluster": CLUSTER}},
                ],
            }
        ],
    }  # fmt: skip
    if remote_urls:
        config["remote_write"] = [{"url": url} for url in remote_urls]
    try:
        url, proc, log = launch_prometheus(
            tmp, config, ready_timeout=60, preexec_fn=_die_with_parent
        )
    except PrometheusFailed as exc:
        raise SystemExit(str(exc)) from None
    return Prometheus(url, proc, log)


def stop_process(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# --- measuring -------------------------------------------------------------------------------


def fetch(url: str, gzipped: bool) -> bytes:
    headers = {"Accept-Encoding": "gzip"} if gzipped else {}
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=30) as r:
        return bytes(r.read())


def scrape_sizes(agent: AgentProcess) -> tuple[int, int, int]:
    """(series, plain bytes, gzip bytes) of one /metrics, as a scraper receives it."""
    plain = fetch(agent.url + "/metrics", False)
    packed = fetch(agent.url + "/metrics", True)
    series = sum(1 for line in plain.splitlines() if line and not line.startswith(b"#"))
    return series, len(plain), len(packed)


def series_groups(agent: AgentProcess) -> Counter[str]:
    """Series of one /metrics by group: gpuscope_gpu_<word>, else gpuscope_<word>; and
    "(per GPU, most)": the most series that carry one GPU's uuid (issue #15's budget)."""
    groups: Counter[str] = Counter()
    per_gpu: Counter[str] = Counter()
    for line in fetch(agent.url + "/metrics", False).decode().splitlines():
        if line and not line.startswith("#"):
            words = line.split("{")[0].split(" ")[0].split("_")
            groups["_".join(words[:3] if words[1:2] == ["gpu"] else words[:2])] += 1
            if (uuid := UUID_LABEL.search(line)) is not None:
                per_gpu[uuid.group(1)] += 1
    groups["(per GPU, most)"] = max(per_gpu.values(), default=0)
    return groups


def template_values(prom: Prometheus, node: str, elapsed: float, interval: int) -> dict[str, Any]:
    """Each dashboard's variables as a user would set them: every cluster, one node, every
    GPU, the workload holding the most GPUs (a training job)."""
    top = prom.query("topk(1, count by (namespace, workload) (gpuscope_gpu_allocation_info))")
    labels = top[0]["metric"] if top else {}
    common = {
        "cluster": ".*",
        "__rate_interval": "1m",
        "__interval": f"{interval}s",
        "__interval_ms": f"{interval * 1000}",
        "__range": f"{max(int(elapsed), 60)}s",
    }
    return {
        "gpu-fleet": {**common, "vendor": ".*", "model": ".*"},
        "node": {**common, "node": node, "gpu": ".*"},
        "training-job": {
            **common,
            "namespace": labels.get("namespace", "ml-team"),
            "workload": labels.get("workload", "train-0"),
        },
        "network": {**common, "node": node, "namespace": ".*"},
    }


@dataclass
class RuleTimes:
    """Every evaluation of every rule group (and rule) seen in /api/v1/rules while polled:
    Prometheus keeps only the last one, so the window is polled more often than the groups
    evaluate and each evaluation counted once, by its lastEvaluation timestamp."""

    groups: dict[str, dict[str, float]] = field(default_factory=dict)
    rules: dict[tuple[str, int], tuple[str, dict[str, float]]] = field(default_factory=dict)

    def poll(self, prom: Prometheus) -> None:
        data, _ = prom.api("/api/v1/rules")
        for g in (data or {}).get("groups", []):
            key = f"{Path(g['file']).name};{g['name']}"
            when = g.get("lastEvaluation", "")
            if when.startswith("0001"):
                continue
            self.groups.setdefault(key, {})[when] = float(g.get("evaluationTime", 0))
            for i, r in enumerate(g["rules"]):
                _, seen = self.rules.setdefault((key, i), (r.get("name", ""), {}))
                seen[r.get("lastEvaluation", when)] = float(r.get("evaluationTime", 0))

    def group_ms(self) -> dict[str, list[float]]:
        return {k: [v * 1e3 for v in d.values()] for k, d in self.groups.items()}

    def rule_ms(self, group: str) -> dict[str, float]:
        """Median evaluation time of each rule of `group`; a name recorded twice (GPU
        temperature alerts) is the sum of its rules' medians."""
        out: dict[str, float] = {}
        for (g, _), (name, d) in self.rules.items():
            if g == group and d:
                out[name] = out.get(name, 0.0) + statistics.median(d.values()) * 1e3
        return out


@dataclass
class Timed:
    query: Query
    expr: str
    median_ms: float
    series: int
    error: str
    result: Any = None


def time_queries(
    server: Prometheus,
    queries: Sequence[Query],
    values: Mapping[str, Mapping[str, str]],
    tries: int,
    at: float,
    **extra: str,
) -> list[Timed]:
    """Each dashboard query through the HTTP API at time `at`, median of `tries`; a
    variable's label_values(selector, label) as Grafana asks it, /api/v1/label/<label>/values
    over the hour before `at`. `extra`: more parameters for every call."""
    out = []
    for q in queries:
        expr = substitute(q.expr, values[q.dashboard])
        times, result, error = [], None, ""
        for _ in range(tries):
            start = time.perf_counter()
            lv = label_values_query(expr) if q.kind == "variable" else None
            if lv is not None:
                result, error = server.api(
                    f"/api/v1/label/{lv[1]}/values",
                    **{"match[]": lv[0], "start": f"{at - 3600:.0f}", "end": f"{at:.0f}"},
                )
            else:
                result, error = server.api("/api/v1/query", query=expr, time=f"{at:.3f}", **extra)
            times.append((time.perf_counter() - start) * 1e3)
            if error:
                break
        n = 0
        if isinstance(result, list):
            n = len(result)
        elif isinstance(result, dict) and isinstance(result.get("result"), list):
            n = len(result["result"])
        out.append(Timed(q, expr, statistics.median(times), n, error, result))
    return out


# --- VictoriaMetrics: a distributed store's PromQL, fed by remote write ----------------------


def start_victoria_metrics(tmp: Path) -> Prometheus:
    """Debian's VictoriaMetrics single node (1.79) on loopback, a remote-write target of the
    fleet's Prometheus, answering the same HTTP query API."""
    try:
        url, proc, log = launch_victoria_metrics(tmp, ready_timeout=60, preexec_fn=_die_with_parent)
    except PrometheusFailed as exc:
        raise SystemExit(f"{exc}\n(or run with --no-victoria-metrics)") from None
    return Prometheus(url, proc, log)


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _normalized(result: Any) -> tuple[dict[frozenset[tuple[str, str]], float], set[str]] | None:
    """{label set without __name__: value} and the metric names of a query's data (None for
    label values)."""
    if not isinstance(result, dict):
        return None
    if result.get("resultType") == "scalar":
        return {frozenset(): float(result["result"][1])}, set()
    out, names = {}, set()
    for s in result.get("result", []):
        metric = dict(s["metric"])
        names.add(metric.pop("__name__", ""))
        out[frozenset(metric.items())] = float(s["value"][1])
    return out, names - {""}


def compare(prom: Timed, vm: Timed) -> tuple[str, str]:
    """(category, detail) of VictoriaMetrics' answer against Prometheus's: error, equal,
    close (values within 5 %), values (same series, a value further off), ties (other series
    with the same values: topk among equals), series (the series differ)."""
    if vm.error:
        return "error", vm.error
    a, b = _normalized(prom.result), _normalized(vm.result)
    if a is None or b is None:
        left, right = set(prom.result or []), set(vm.result or [])
        if left == right:
            return "equal", ""
        return "series", f"values only in Prometheus {sorted(left - right)[:3]}, " + (
            f"only in VictoriaMetrics {sorted(right - left)[:3]}"
        )
    (pa, pnames), (va, vnames) = a, b
    if set(pa) != set(va) and sorted(pa.values()) == sorted(va.values()):
        return "ties", (
            f"{len(set(pa) - set(va))} of {len(pa)} series differ, with the same values: "
            "another pick among equal values (topk, bottomk)"
        )
    if set(pa) != set(va):
        only_p, only_v = set(pa) - set(va), set(va) - set(pa)
        detail = f"{len(pa)} series in Prometheus, {len(va)} in VictoriaMetrics"
        if only_p:
            detail += f"; only in Prometheus e.g. {dict(sorted(next(iter(only_p))))}"
        if only_v:
            detail += f"; only in VictoriaMetrics e.g. {dict(sorted(next(iter(only_v))))}"
        return "series", detail
    worst, where = 0.0, frozenset()
    for key, pv in pa.items():
        vv = va[key]
        if math.isnan(pv) and math.isnan(vv):
            continue
        diff = abs(pv - vv) / max(abs(pv), abs(vv), 1e-12)
        if diff > worst:
            worst, where = diff, key
    names = "" if pnames == vnames else f"; names {sorted(pnames)} / {sorted(vnames)}"
    if worst <= 1e-6:
        return "equal", names.lstrip("; ")
    detail = (f"max relative difference {worst:.1%} at {dict(sorted(where))}: "
              f"{pa[where]:.6g} / {va[where]:.6g}{names}")  # fmt: skip
    return ("close" if worst <= 0.05 else "values"), detail


def pct(values: Sequence[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(p * len(s)))]


# --- the run ---------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=50)
    ap.add_argument("--profiles", default=",".join(PROFILES), help="fake NVML profiles, cycled")
    ap.add_argument("--levels", default=",".join(LEVELS), help="--metrics-detail levels")
    ap.add_argument("--scrape-interval", type=int, default=15, help="seconds")
    ap.add_argument(
        "--duration", type=float, default=150, help="seconds measured once every node is up"
    )
    ap.add_argument("--tries", type=int, default=3, help="runs of each dashboard query")
    ap.add_argument("--no-remote-write", action="store_true")
    ap.add_argument(
        "--no-victoria-metrics",
        action="store_true",
        help="remote-write to the counting receiver only, not also to VictoriaMetrics",
    )
    ap.add_argument(
        "--dcgm-compat",
        choices=DCGM_COMPAT,
        default="on",
        help="the agents' --dcgm-compat: they serve dcgm-exporter's DCGM_FI_* names themselves "
        "(no rules); also measured without it on one extra agent per profile",
    )
    ap.add_argument(
        "--extra-rules",
        type=Path,
        action="append",
        default=[],
        help="another rule file to load (a candidate beside the shipped rules: its records "
        "must have names of their own)",
    )
    ap.add_argument("--keep", action="store_true", help="keep the work directory")
    args = ap.parse_args()

    # SIGTERM unwinds like Ctrl-C: every agent, Prometheus and node goes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    ensure_built()
    profiles = args.profiles.split(",")
    levels, level_note = accepted_levels(args.levels.split(","))
    work = Path(tempfile.mkdtemp(prefix="gpuscope-fleet-"))
    with contextlib.ExitStack() as stack:
        if not args.keep:
            stack.callback(shutil.rmtree, work, True)
        run(stack, work, args, profiles, levels, level_note)


def run(
    stack: contextlib.ExitStack,
    work: Path,
    args: argparse.Namespace,
    profiles: Sequence[str],
    levels: Sequence[str | None],
    level_note: str,
) -> None:
    t_begin = time.monotonic()
    sysfs = write_tree(work / "sysfs")
    logs = work / "logs"
    logs.mkdir()
    nodes: list[tuple[str, SimNode]] = []
    pods = 0
    for i, profile in zip(range(args.nodes), itertools.cycle(profiles)):
        name = f"gpu-node-{i:03d}"
        fake = node_fake(profile, i, work / f"{name}.state")
        node = stack.enter_context(SimNode(fake, work / name, name))
        pods += build_pods(node, i)
        nodes.append((profile, node))
    mix = ", ".join(f"{c} {p}" for p, c in Counter(p for p, _ in nodes).items())
    print(f"{args.nodes} simulated nodes ({mix}), {pods} pods "
          f"({time.monotonic() - t_begin:.0f} s)", flush=True)  # fmt: skip

    fleet_level = levels[0]
    agents = [launch_agent(node, sysfs, logs, fleet_level, *dcgm_args(args)) for _, node in nodes]
    for agent in agents:
        stack.callback(agent.stop)
    remote: Receiver | None = None
    remote_urls: list[str] = []
    vm: Prometheus | None = None
    if not args.no_remote_write:
        remote, remote_port = stack.enter_context(receiver())
        remote_urls.append(f"http://127.0.0.1:{remote_port}/api/v1/write")
        args.receiver_url = remote_urls[0]
        if not args.no_victoria_metrics:
            vm = start_victoria_metrics(work / "victoria-metrics")
            stack.callback(stop_process, vm.proc)
            remote_urls.append(f"{vm.url}/api/v1/write")
    prom = start_prometheus(
        work / "prometheus",
        {node.node_name: a.port for (_, node), a in zip(nodes, agents, strict=True)},
        args.scrape_interval,
        remote_urls,
        rule_files(args),
    )
    stack.callback(stop_process, prom.proc)
    prom_base_rss = proc_rss_mb(prom.proc.pid)[0]
    for agent in agents:
        agent.wait_ready(timeout=300)
    print(f"{len(agents)} agents ready ({time.monotonic() - t_begin:.0f} s); Prometheus "
          f"RSS before any agent answered {prom_base_rss:.0f} MB", flush=True)  # fmt: skip

    # Every target scraped (twice, so that rates have two points), then the window.
    deadline = time.monotonic() + 10 * args.scrape_interval
    while time.monotonic() < deadline:
        up = prom.query(f'count(up{{job="{JOB}"}} == 1)')
        if up and int(float(up[0]["value"][1])) == len(agents):
            break
        time.sleep(2)
    time.sleep(2 * args.scrape_interval)
    m0, t0 = prom.own_metrics(), time.monotonic()
    r0 = remote.snapshot() if remote else {}
    cpu0 = {a.proc.pid: proc_cpu_seconds(a.proc.pid) for a in agents}
    cpu0[prom.proc.pid] = proc_cpu_seconds(prom.proc.pid)
    v0 = vm.own_metrics() if vm else {}
    if vm:
        cpu0[vm.proc.pid] = proc_cpu_seconds(vm.proc.pid)
    print(f"measuring for {args.duration:.0f} s ...", flush=True)
    rule_times = RuleTimes()
    while time.monotonic() - t0 < args.duration:
        rule_times.poll(prom)
        time.sleep(min(args.scrape_interval / 3, max(0.0, args.duration - time.monotonic() + t0)))
    m1, t1 = prom.own_metrics(), time.monotonic()
    r1 = remote.snapshot() if remote else {}
    window = t1 - t0
    agent_cores = sum(proc_cpu_seconds(a.proc.pid) - cpu0[a.proc.pid] for a in agents) / window
    prom_cores = (proc_cpu_seconds(prom.proc.pid) - cpu0[prom.proc.pid]) / window
    prom_rss = proc_rss_mb(prom.proc.pid)[0]
    agent_rss = [proc_rss_mb(a.proc.pid)[0] for a in agents]
    v1 = vm.own_metrics() if vm else {}
    vm_cores = (proc_cpu_seconds(vm.proc.pid) - cpu0[vm.proc.pid]) / window if vm else 0.0
    vm_rss = proc_rss_mb(vm.proc.pid)[0] if vm else 0.0

    # Series and bytes per node, per profile, at each level.
    per_level: dict[str | None, dict[str, list[tuple[int, int, int]]]] = {fleet_level: {}}
    groups: dict[str | None, Counter[str]] = {}
    group_node = next(i for i, (p, _) in enumerate(nodes) if p == profiles[0])
    groups[fleet_level] = series_groups(agents[group_node])
    for (profile, _), agent in zip(nodes, agents, strict=True):
        per_level[fleet_level].setdefault(profile, []).append(scrape_sizes(agent))
    for level in levels[1:]:
        per_level[level] = {}
        for profile, node in {p: n for p, n in reversed(nodes)}.items():
            extra = launch_agent(node, sysfs, logs, level, *dcgm_args(args))
            try:
                extra.wait_ready(timeout=120)
                time.sleep(3)
                scrape_sizes(extra)
                per_level[level][profile] = [scrape_sizes(extra)]
                if profile == profiles[0]:
                    groups[level] = series_groups(extra)
            except AssertionError as err:
                print(f"level {level}: {str(err).splitlines()[0]}")
            finally:
                extra.stop()

    if dcgm_args(args):  # what --dcgm-compat costs: the same nodes without it
        per_level[NO_DCGM] = {}
        for profile, node in {p: n for p, n in reversed(nodes)}.items():
            extra = launch_agent(node, sysfs, logs, fleet_level)
            try:
                extra.wait_ready(timeout=120)
                time.sleep(3)
                scrape_sizes(extra)
                per_level[NO_DCGM][profile] = [scrape_sizes(extra)]
            except AssertionError as err:
                print(f"without --dcgm-compat: {str(err).splitlines()[0]}")
            finally:
                extra.stop()

    # Dashboard queries at this scale.
    # Both stores answer at one timestamp, old enough for remote write to have delivered it
    # (VictoriaMetrics also hides the last 30 s by default: -search.latencyOffset).
    values = template_values(prom, nodes[0][1].node_name, t1 - t_begin, args.scrape_interval)
    at = time.time() - max(45, 2 * args.scrape_interval)
    timed = time_queries(prom, all_queries(), values, args.tries, at)
    vm_timed = time_queries(vm, all_queries(), values, args.tries, at, nocache="1") if vm else []
    m2 = prom.own_metrics()
    rules, error = prom.api("/api/v1/rules")
    unhealthy = [
        f"{r.get('name')}: {r.get('lastError') or r.get('health')}"
        for g in (rules or {}).get("groups", [])
        for r in g["rules"]
        if r.get("health") != "ok"
    ] + ([f"/api/v1/rules: {error}"] if error else [])

    report(args, nodes, levels, level_note, per_level, m0, m1, m2, window, prom_base_rss,
           prom_rss, prom_cores, agent_cores, agent_rss, r0, r1, timed, unhealthy,
           rule_times)  # fmt: skip
    if vm:
        with contextlib.suppress(OSError):  # its in-memory rows to parts on disk
            urllib.request.urlopen(vm.url + "/internal/force_flush", timeout=60).close()
        disk = {
            "prometheus": (dir_bytes(work / "prometheus" / "data"),
                           one(m2, "prometheus_tsdb_head_samples_appended_total")),
            "victoria-metrics": (dir_bytes(work / "victoria-metrics" / "data"), 0.0),
        }  # fmt: skip
        report_victoria_metrics(
            v0,
            v1,
            vm.own_metrics(),
            m0,
            m1,
            window,
            vm_cores,
            vm_rss,
            prom_cores,
            prom_rss,
            disk,
            timed,
            vm_timed,
            f"{vm.url}/api/v1/write",
        )
    print(f"\nseries of one {profiles[0]} node by metric group, at each level")
    names = sorted({g for c in groups.values() for g in c},
                   key=lambda g: -max(c[g] for c in groups.values()))  # fmt: skip
    print(f"  {'group':<28}" + "".join(f"{level!s:>9}" for level in groups))
    for name in names:
        print(f"  {name:<28}" + "".join(f"{c[name]:>9}" for c in groups.values()))


def report_victoria_metrics(
    v0: Metrics,
    v1: Metrics,
    v2: Metrics,
    m0: Metrics,
    m1: Metrics,
    window: float,
    vm_cores: float,
    vm_rss: float,
    prom_cores: float,
    prom_rss: float,
    disk: Mapping[str, tuple[int, float]],
    timed: Sequence[Timed],
    vm_timed: Sequence[Timed],
    vm_url: str,
) -> None:
    def typed(metrics: Metrics, name: str, prefix: str = "") -> float:
        return sum(
            v
            for (n, labels), v in metrics.items()
            if n == name and dict(labels).get("type", "").startswith(prefix)
        )

    ingested = (one(v1, "vm_rows_inserted_total") - one(v0, "vm_rows_inserted_total")) / window
    queue = {"url": vm_url}
    sent = (
        one(m1, "prometheus_remote_storage_samples_total", **queue)
        - one(m0, "prometheus_remote_storage_samples_total", **queue)
    ) / window
    rows = typed(v2, "vm_rows", "storage/")
    data = typed(v2, "vm_data_size_bytes")
    samples_only = typed(v2, "vm_data_size_bytes", "storage/")
    vm_dir, _ = disk["victoria-metrics"]
    prom_dir, appended = disk["prometheus"]
    print("\nVictoriaMetrics 1.79 (single node, Debian), fed by the same Prometheus's remote write")
    print(
        f"  samples ingested per second   {ingested:,.0f} (vm_rows_inserted_total; Prometheus "
        f"sent {sent:,.0f} a second to it)"
    )
    print(
        f"  on disk                       {data / 1e6:.1f} MB (vm_data_size_bytes, index "
        f"{typed(v2, 'vm_data_size_bytes', 'indexdb') / 1e6:.1f} MB) for {rows:,.0f} rows: "
        f"{data / max(rows, 1):.2f} B a sample, {samples_only / max(rows, 1):.2f} without the "
        f"index; the directory {vm_dir / 1e6:.1f} MB"
    )
    print(
        f"  Prometheus on disk            {prom_dir / 1e6:.1f} MB (WAL and head chunks) for "
        f"{appended:,.0f} samples appended: {prom_dir / max(appended, 1):.2f} B a sample"
    )
    print(
        f"  RSS                           {vm_rss:.0f} MB "
        f"(process_resident_memory_bytes {one(v2, 'process_resident_memory_bytes') / 1e6:.0f} MB)"
        f"; Prometheus {prom_rss:.0f} MB"
    )
    print(
        f"  CPU                           {vm_cores:.3f} cores; Prometheus {prom_cores:.3f} "
        "(scraping and rules too)"
    )

    results = [(p, v, *compare(p, v)) for p, v in zip(timed, vm_timed, strict=True)]
    by = Counter(r[2] for r in results)
    print(
        f"\ndashboard queries in VictoriaMetrics: {len(results)}, errors {by['error']}; against "
        f"Prometheus at the same timestamp: equal {by['equal']}, within 5 % {by['close']}, "
        f"values further off {by['values']}, other picks among ties {by['ties']}, "
        f"series differ {by['series']}"
    )
    ok = [v.median_ms for v in vm_timed if not v.error]
    pms = [p.median_ms for p in timed if not p.error]
    if ok and pms:
        print(
            f"  latency median {statistics.median(ok):.1f} ms, p90 {pct(ok, 0.9):.1f} ms, max "
            f"{max(ok):.1f} ms, sum {sum(ok) / 1e3:.2f} s (Prometheus: "
            f"{statistics.median(pms):.1f} / {pct(pms, 0.9):.1f} / {max(pms):.1f} ms, "
            f"{sum(pms) / 1e3:.2f} s)"
        )
    for category in ("error", "series", "values", "ties", "close"):
        for p, _, cat, detail in results:
            if cat == category:
                print(f"  {cat.upper():<6} {p.query.where}: {detail}\n         {p.expr}")


def report(
    args: argparse.Namespace,
    nodes: Sequence[tuple[str, SimNode]],
    levels: Sequence[str | None],
    level_note: str,
    per_level: Mapping[str | None, Mapping[str, list[tuple[int, int, int]]]],
    m0: Metrics,
    m1: Metrics,
    m2: Metrics,
    window: float,
    prom_base_rss: float,
    prom_rss: float,
    prom_cores: float,
    agent_cores: float,
    agent_rss: Sequence[float],
    r0: Mapping[str, int],
    r1: Mapping[str, int],
    timed: Sequence[Timed],
    unhealthy: Sequence[str],
    rule_times: RuleTimes,
) -> None:
    n = len(nodes)
    print(f"\n== fleet: {n} nodes, scrape interval {args.scrape_interval} s, window "
          f"{window:.0f} s, rule files {', '.join(p.name for p in rule_files(args))}")  # fmt: skip
    print(f"   agents --dcgm-compat {args.dcgm_compat}: the DCGM_FI_* names are served by the "
          "agents; no DCGM rule group is evaluated")  # fmt: skip
    if level_note:
        print(f"   ({level_note})")
    print("\nseries per node and /metrics bytes (median over the nodes of a profile)")
    print(f"  {'level':<9} {'profile':<14} {'nodes':>5} {'series':>7} {'plain KB':>9} "
          f"{'gzip KB':>8} {'ratio':>6}")  # fmt: skip
    fleet_series = []
    for level in [*levels, *([NO_DCGM] if NO_DCGM in per_level else [])]:
        for profile, sizes in per_level.get(level, {}).items():
            s = statistics.median(x[0] for x in sizes)
            plain = statistics.median(x[1] for x in sizes)
            packed = statistics.median(x[2] for x in sizes)
            if level == levels[0]:
                fleet_series += [x[0] for x in sizes]
            print(f"  {level or '-':<9} {profile:<14} {len(sizes):>5} {s:>7.0f} "
                  f"{plain / 1e3:>9.1f} {packed / 1e3:>8.1f} {plain / packed:>5.1f}x")  # fmt: skip
    head = one(m1, "prometheus_tsdb_head_series")
    appended = one(m1, "prometheus_tsdb_head_samples_appended_total") - one(
        m0, "prometheus_tsdb_head_samples_appended_total"
    )
    rate = appended / window
    heap = one(m1, "go_memstats_heap_inuse_bytes")
    print(f"\nfleet series scraped (sum over agents) {sum(fleet_series):,}, "
          f"mean {statistics.mean(fleet_series):.0f} a node")  # fmt: skip
    print(f"Prometheus head series                 {head:,.0f} ({head / n:.0f} a node, "
          "recorded series and up/scrape_* included)")  # fmt: skip
    print(f"samples appended per second            {rate:,.0f} ({rate / n:.1f} a node; "
          f"{rate * args.scrape_interval / n:.0f} a node a scrape)")  # fmt: skip
    print(f"Prometheus RSS                         {prom_rss:.0f} MB ({prom_base_rss:.0f} MB "
          f"before any agent answered): {prom_rss * 1e6 / head:,.0f} B a head series, "
          f"{(prom_rss - prom_base_rss) * 1e6 / head:,.0f} B above the baseline")  # fmt: skip
    print(f"Go heap in use                         {heap / 1e6:.0f} MB: "
          f"{heap / head:,.0f} B a head series")  # fmt: skip
    print(f"Prometheus CPU                         {prom_cores:.3f} cores")
    print(f"agents: CPU {agent_cores:.3f} cores for {n} ({agent_cores / n * 100:.2f} % of a "
          f"core each), RSS median {statistics.median(agent_rss):.0f} MB, "
          f"max {max(agent_rss):.0f} MB")  # fmt: skip

    if r1:
        d = {k: r1[k] - r0[k] for k in r1}
        queue = {"url": args.receiver_url}  # not VictoriaMetrics' queue
        sent = one(m1, "prometheus_remote_storage_samples_total", **queue) - one(
            m0, "prometheus_remote_storage_samples_total", **queue
        )
        sent_bytes = one(m1, "prometheus_remote_storage_bytes_total", **queue) - one(
            m0, "prometheus_remote_storage_bytes_total", **queue
        )
        samples = d["samples"] or sent
        print("\nremote write (to a receiver in this process, queue_config defaults)")
        print(f"  requests {d['requests']}, samples {d['samples']:,} decoded "
              f"({sent:,.0f} by prometheus_remote_storage_samples_total), series entries "
              f"{d['series']:,}, metadata entries {d['metadata']:,}")  # fmt: skip
        if samples:
            print(f"  wire bytes (snappy) {d['wire_bytes'] / window / 1e3:,.1f} KB/s = "
                  f"{d['wire_bytes'] / samples:.2f} B a sample, "
                  f"{d['wire_bytes'] / window / n:,.0f} B/s a node")  # fmt: skip
            print(f"  uncompressed        {d['raw_bytes'] / window / 1e3:,.1f} KB/s = "
                  f"{d['raw_bytes'] / samples:.1f} B a sample "
                  f"(snappy {d['raw_bytes'] / max(d['wire_bytes'], 1):.1f}x)")  # fmt: skip
            print(f"  prometheus_remote_storage_bytes_total {sent_bytes / window / 1e3:,.1f} KB/s"
                  f" = {sent_bytes / samples:.2f} B a sample")  # fmt: skip

    samples_of = {
        dict(labels)["rule_group"]: v
        for (name, labels), v in m2.items()
        if name == "prometheus_rule_group_last_evaluation_samples"
    }
    group_ms = rule_times.group_ms()
    print(f"\nrule groups: evaluation time over the window ({len(group_ms)} groups; median, "
          "max and number of evaluations)")  # fmt: skip
    for group, ms in sorted(group_ms.items(), key=lambda kv: -statistics.median(kv[1])):
        file, name = group.split(";")
        samples = next((v for k, v in samples_of.items() if k.endswith(f"{file};{name}")), 0)
        print(f"  {statistics.median(ms):8.1f} ms  max {max(ms):8.1f} ms  n {len(ms):>3}  "
              f"{samples:>7,.0f} samples  {name} ({file})")  # fmt: skip
    medians = [statistics.median(ms) for ms in group_ms.values()]
    print(f"  sum of the medians {sum(medians):.1f} ms an evaluation interval; "
          f"{len(unhealthy)} rules not healthy")  # fmt: skip
    for group in sorted(g for g in group_ms if "gpuscope.rules.yml" not in g):
        top = sorted(rule_times.rule_ms(group).items(), key=lambda kv: -kv[1])
        print(
            f"  slowest rules of {group.split(';')[1]} (median ms): "
            + ", ".join(f"{name} {ms:.1f}" for name, ms in top[:6])
        )
    for line in unhealthy:
        print(f"  UNHEALTHY {line}")

    ok = [t for t in timed if not t.error]
    errors = [t for t in timed if t.error]
    empty = [t for t in ok if t.series == 0]
    ms = [t.median_ms for t in ok]
    print(f"\ndashboard queries: {len(timed)} ({args.tries} tries each, median), "
          f"{len(errors)} errors, {len(empty)} empty")  # fmt: skip
    if ms:
        print(f"  median {statistics.median(ms):.1f} ms, p90 {pct(ms, 0.9):.1f} ms, "
              f"max {max(ms):.1f} ms, sum {sum(ms) / 1e3:.2f} s")  # fmt: skip
        print("  slowest:")
        for t in sorted(ok, key=lambda t: -t.median_ms)[:10]:
            print(f"  {t.median_ms:8.1f} ms {t.series:>5} series  {t.query.where}")
        by_dash: dict[str, list[float]] = {}
        for t in ok:
            by_dash.setdefault(t.query.dashboard, []).append(t.median_ms)
        for dash, values in sorted(by_dash.items()):
            print(f"  {dash:<13} {len(values):>3} queries, median {statistics.median(values):6.1f}"
                  f" ms, sum {sum(values):7.0f} ms")  # fmt: skip
    for t in errors:
        print(f"  ERROR {t.query.where}: {t.error}\n        {t.expr}")
    if empty:
        print("  empty: " + "; ".join(t.query.where for t in empty))


if __name__ == "__main__":
    main()
