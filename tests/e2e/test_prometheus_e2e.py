"""End to end with a real Prometheus: Debian's `prometheus` scrapes the real `gpuscope` agent
on a simulated GPU node (tests/doubles/simnode.py: fake NVML, kubelet and API doubles, pods as real
processes with real traffic) with the rules file loaded, then every dashboard query, every
recording rule and every alert expression is evaluated through the HTTP API.

The node is driven into the alerting states the fakes allow: a lost GPU, critical XIDs and
one asking for a recovery action (154), uncorrectable ECC errors, row remaps pending (on a
time-sliced GPU) and failed, an NVLink down and another one erring, a hot and thermally
throttled GPU, a power-braked one, a busy GPU on a narrowed PCIe link, PCIe replays, packet
loss on one pod's path (nftables), an agent whose GPU collector fails and a target that
does not answer. Every series carries a `cluster` target label, as a Thanos or Mimir
external label would, for the dashboards' cluster variable. The simulated node's agent puts
`node` on its series itself (--series-node-label) and its scrape adds none, as with a plain
static scrape config: the dashboards and rules must work with that too.

What "returns data" means here (all failures are reported at once, by dashboard and panel
title, or by rule):
- dashboard queries, with the template variables set to values read from the data
  ($__rate_interval 4 s = 4 scrape intervals, $__range the time since Prometheus started):
  at least one series with a finite value;
- recording rules: the expression and the recorded series both return series; Prometheus
  reports every rule healthy (no evaluation error, e.g. a failed join);
- alerts, three ways: (1) with every comparison made `bool` (so the selectors, joins and
  functions are proven on the real output even where a threshold cannot be reached), for
  every alert; (2) as written with its range windows shortened to 8 s (the test lasts
  seconds, not hours), for the alerts provoked here; (3) pending or firing in Prometheus
  itself, with the windows as written, labelled with the pod that holds the GPU, for the
  provoked alerts whose windows allow it within the test. NOT_PROVOKED says which alerts
  the fakes cannot drive, and why.

The same Prometheus proof runs against a simulated AMD MI300X node (the agent's `amd`
collector on the fake AMD SMI library, the same pods holding `amd.com/gpu`): every query and
rule that selects no NVIDIA-only family (XIDs, GPM, MIG, NVLink, row remapping...: the `gpu`
collector's families the `amd` collector does not render) must return data there too; the
NVIDIA-only ones may be empty and are reported. On the NVIDIA node the AMD-only queries
(XGMI) are the ones allowed to be empty.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from gpuscope.agent.app.registry import BY_NAME
from gpuscope.exporters.prometheus.render import renderer_of
from tests.doubles.fakeamdsmi.control import FakeAmdSmi
from tests.doubles.fakenvml.control import FakeNvml
from tests.doubles.kube_apiserver import owner_reference
from tests.doubles.make_sysfs import write_tree
from tests.doubles.netlab import cgroup_v2_root
from tests.doubles.simnode import (
    EVAL_POD,
    GIB,
    NB_ALICE_POD,
    WORKER_POD,
    ContainerSpec,
    SimNode,
    training_scenario,
)
from tests.support import GOLDEN_DIR, AgentProcess, free_port, sim_node_args
from tests.support.observability import (
    RULES,
    Query,
    alerting_rules,
    all_queries,
    label_values_query,
    recording_rules,
    selectors,
    substitute,
)
from tests.support.prometheus_process import PrometheusFailed, launch_prometheus

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.kernel,
    pytest.mark.root(reason="the simulated node makes cgroups, the agent loads BPF"),
]

SCRAPE_INTERVAL_S = 1
RATE_INTERVAL = "4s"  # Grafana's $__rate_interval: 4 x the scrape interval
SHORT_WINDOW = "8s"  # alert windows, shortened for check (2)
SETTLE_TIMEOUT_S = 30.0  # after the states are provoked, until every check passes

SIM_NODE = "sim-node-1"
# Panels that read MIG devices only: empty on this dgx-h100 node (no MIG), proven on the
# fake's MIG profile by tests/e2e/test_gpm_e2e.py.
MIG_PANELS = frozenset({("node", "MIG instances"), ("node", "MIG busy")})
# Panels and a rule this node cannot feed (start-up times need a rank scheduled after the
# agent started, throttling and block I/O the v1 cpu and blkio pod directories of a hybrid
# host, the gang rule kube-state-metrics): proven by tests/e2e/test_why_idle_e2e.py.
WHY_IDLE_PANELS = frozenset(
    {
        ("training-job", "CPU throttled by pod"),
        ("training-job", "Disk reads by pod"),
        ("training-job", "Disk writes and GPU busy by pod"),
        ("training-job", "GPU start-up time by pod"),
        ("gpu-fleet", "Waiting gangs"),
    }
)
# The training job dashboard's straggler row and its alert annotation, proven with two
# starved ranks and the alert firing by tests/e2e/test_straggler_e2e.py. The row's panels
# return data here too; the annotation (the alert firing, after 2 minutes) cannot.
STRAGGLER_PANELS = frozenset(
    {
        ("training-job", "Stragglers"),
        ("training-job", "Straggler score by rank"),
        ("training-job", "Straggler score by rank and cause"),
        ("training-job", "Rank signals"),
        ("training-job", "Stalls against the job median"),
        ("training-job", "annotation Straggler alerts"),
    }
)
KUBE_STATE_METRICS_RULES = frozenset(
    {"namespace_workload:gpuscope_gpus_allocated_gang_pending:count"}
)
BROKEN_NODE = "broken-node"  # an agent whose gpu collector fails (NVML's init fails)
GONE_NODE = "gone-node"  # a target nothing listens on
# The dashboards' cluster variable reads this label (a Thanos or Mimir external label,
# here a target label); the queries run with its All value (.*), as on a single Prometheus.
CLUSTER = "sim-cluster"
# Nodes whose agent puts `node` on its series itself (--series-node-label): their scrape
# adds none, as a plain static scrape config would not. The others get it from the scrape.
AGENT_LABELLED = frozenset({SIM_NODE})
STRAGGLER_POD = "ml-team/llama-ft-worker-1"
CRITICAL_XID, OTHER_XID, RECOVERY_XID = 48, 31, 154
HW_POWER_BRAKE = 0x08 | 0x80  # hw_slowdown and hw_power_brake, as NVML sets them together

WORKER = {"namespace": "ml-team", "pod": "llama-ft-worker-0", "workload": "llama-ft"}
EVAL = {"namespace": "eval", "pod": "eval-nightly-7xk2p", "workload": "eval-nightly"}
# Provoked alerts: labels at least one of their series must carry (checks 2 and 3). Rules
# sharing a name (GPUTemperatureHigh, one per sensor) count as proven if any of them is.
PROVOKED: dict[str, dict[str, str]] = {
    "GPULost": {"node": SIM_NODE, "gpu": "3", **WORKER},
    "GPUXidCritical": {"node": SIM_NODE, "gpu": "4", **EVAL},
    "GPURowRemapFailure": {"node": SIM_NODE, "gpu": "4", **EVAL},
    "GPURowRemapPending": {"node": SIM_NODE, "gpu": "6", "namespace": "research"},
    "GPUNVLinkDown": {"node": SIM_NODE, "gpu": "1", **WORKER},
    "GPUNVLinkErrors": {"node": SIM_NODE, "gpu": "1", **WORKER},
    "GPUTemperatureHigh": {"node": SIM_NODE, "gpu": "2", "sensor": "gpu", **WORKER},
    "GPUThrottledThermal": {"node": SIM_NODE, "gpu": "2", **WORKER},
    "GPUPCIeLinkDegraded": {"node": SIM_NODE, "gpu": "0", **WORKER},
    "GPUPCIeReplayRate": {"node": SIM_NODE, "gpu": "0", **WORKER},
    "GPUHardwareSlowdown": {"node": SIM_NODE, "gpu": "1", **WORKER},
    "GPUEccUncorrectable": {"node": SIM_NODE, "gpu": "4", **EVAL},
    "GPURecoveryActionRequired": {"node": SIM_NODE, "gpu": "4", **EVAL},
    "PodTCPRetransmitRatioHigh": {"node": SIM_NODE, "pod": "llama-ft-worker-1"},
    "GpuscopeCollectorFailing": {"node": BROKEN_NODE, "collector": "gpu"},
    "GpuscopeDown": {"node": GONE_NODE},
}
NOT_PROVOKED = {
    "GPUStuck": "its threshold is one NVML call blocked for 60 s; tests/e2e/test_hang_e2e.py "
    "hangs a GPU under a real Prometheus and evaluates it with a 2 s threshold",
    "GpuscopeCollectorStuck": "the simulated node's collectors do not hang; the stuck series "
    "are proven in tests/unit/agent/test_deadlines.py and test_health.py",
    "GPUAllocatedIdle": "its threshold is 30 minutes of idleness, measured by the agent in real "
    "time",
    'GPUTemperatureHigh{sensor="memory"}': "the fake NVML's HBM temperature follows memory "
    "utilization (70 °C at most) and has no override",
}
# Alerts on a series the default detail level serves only while the exception holds: on a
# node where it does not, even their bool form has no data.
EMPTY_WHEN_HEALTHY_AT_DEFAULT = {
    "GPUStuck": "gpuscope_gpu_stuck_seconds is served only while a GPU is stuck; "
    "tests/e2e/test_hang_e2e.py proves the alert at the default level",
}
# Recording rules with a threshold the test cannot reach: their expression is checked with
# comparisons made bool (the recorded series cannot exist yet).
THRESHOLDED_RECORDING = {
    "namespace:gpuscope_gpus_allocated_idle:count": "counts GPUs idle for 5 minutes or more",
}
# Check (3) needs the windows as written to be satisfied within the test: not these.
NOT_IN_PROMETHEUS_STATE = {
    "GPUPCIeLinkDegraded": "rate(busy[5m]) > 0.1 needs 30+ s of data at 93 % busy",
    "PodTCPRetransmitRatioHigh": "rate(retransmits[5m]) >= 1 needs minutes of data",
}
# Alerts provoked on the AMD node (tests/doubles/fakeamdsmi), as PROVOKED.
AMD_PROVOKED: dict[str, dict[str, str]] = {
    "GPULost": {"node": SIM_NODE, "gpu": "3", **WORKER},
    "GPUTemperatureHigh": {"node": SIM_NODE, "gpu": "2", "sensor": "gpu", **WORKER},
    "GPUEccUncorrectable": {"node": SIM_NODE, "gpu": "4", **EVAL},
    "GpuscopeCollectorFailing": {"node": BROKEN_NODE, "collector": "gpu"},
    "GpuscopeDown": {"node": GONE_NODE},
}
# The collectors of the AMD node's agent: the defaults but NVIDIA's `gpu` (which, without
# NVML, reads failing: its own alert).
AMD_COLLECTORS = "amd,net,nic,rdma,kubelet,pods"
_COMPARISON = re.compile(r"(==|!=|>=|<=|>(?!=)|<(?!=))(?!\s*bool\b)")


def broken_driver(tmp_path: Path) -> dict[str, str]:
    """A node whose NVIDIA library is there but whose nvmlInit fails (the fake NVML reading
    a state file that is not one): a failing collector. A node with no library at all would
    be an absent one, which GpuscopeCollectorFailing leaves out."""
    state = tmp_path / "broken-nvml.state"
    state.write_text("not a state file\n")
    env = FakeNvml("dgx-h100", tmp_path / "broken-base.state").env()
    return {**env, "FAKENVML_STATE": str(state)}


# --- PromQL rewriting for the alert checks ------------------------------------------------


def _outside_strings_and_braces(expr: str, fn: Callable[[str], str]) -> str:
    """Apply fn to the parts of expr outside string literals and label matchers."""
    out: list[str] = []
    buf: list[str] = []
    i = 0
    while i < len(expr):
        c = expr[i]
        if c in "\"'{":
            out.append(fn("".join(buf)))
            buf = []
            end = expr.index("}" if c == "{" else c, i + 1)
            while c != "{" and expr[end - 1] == "\\":
                end = expr.index(c, end + 1)
            out.append(expr[i : end + 1])
            i = end + 1
            continue
        buf.append(c)
        i += 1
    out.append(fn("".join(buf)))
    return "".join(out)


def relaxed(expr: str) -> str:
    """Every comparison made `bool`: filters keep all their series (as 0 or 1)."""
    return _outside_strings_and_braces(expr, lambda s: _COMPARISON.sub(r"\1 bool", s))


def shortened(expr: str) -> str:
    """Range windows shortened to SHORT_WINDOW; offsets (XID "new series") left as written."""
    return _outside_strings_and_braces(
        expr, lambda s: re.sub(r"\[\d+[smhd]\]", f"[{SHORT_WINDOW}]", s)
    )


def test_relaxed_and_shortened_rewrite_only_operators_and_windows() -> None:
    expr = 'rate(x{a!="b", c=~"<.*"}[5m]) > 0.1 and on (u) (y == 1) or z offset 1h >= bool 2'
    assert relaxed(expr) == (
        'rate(x{a!="b", c=~"<.*"}[5m]) > bool 0.1 and on (u) (y == bool 1) or z offset 1h >= bool 2'
    )
    assert shortened(expr).startswith(f'rate(x{{a!="b", c=~"<.*"}}[{SHORT_WINDOW}]) > 0.1')
    assert "offset 1h" in shortened(expr)


# --- Prometheus -----------------------------------------------------------------------------


@dataclass
class Prometheus:
    url: str
    proc: subprocess.Popen[str]
    log: Path
    started: float = field(default_factory=time.time)

    def get(self, path: str, **params: str) -> Any:
        url = f"{self.url}{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            with urllib.request.urlopen(url, timeout=10) as resp:
                body = json.loads(resp.read())
        except urllib.error.HTTPError as err:
            body = json.loads(err.read() or b"{}")
        if body.get("status") != "success":
            raise PromQLError(body.get("error", str(body)))
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr, time=f"{time.time():.3f}")
        if data["resultType"] == "scalar":
            return [{"metric": {}, "value": data["result"]}]
        result: list[dict[str, Any]] = data["result"]
        return result

    def series_labels(self, selector: str, label: str) -> list[str]:
        data = self.get(
            "/api/v1/series", **{"match[]": selector, "start": f"{self.started - 60:.0f}"}
        )
        return sorted({s[label] for s in data if s.get(label)})

    def logs(self) -> str:
        return self.log.read_text()[-4000:] if self.log.exists() else ""


class PromQLError(Exception):
    pass


def start_prometheus(
    tmp: Path, targets: dict[str, str], agent_labelled: frozenset[str] = frozenset()
) -> Prometheus:
    """Debian's prometheus on loopback, scraping {node: host:port} as job gpuscope (the
    static `node` label stands in for the PodMonitor's relabeling from the pod's node;
    nodes in `agent_labelled` get none: their agent adds it, --series-node-label)."""
    config = {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
            "scrape_timeout": f"{SCRAPE_INTERVAL_S}s",
            "evaluation_interval": "1s",
        },
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {
                "job_name": "gpuscope",
                "honor_labels": True,  # as the PodMonitor and docs/deploy.md's job
                "static_configs": [
                    {
                        "targets": [address],
                        "labels": {"cluster": CLUSTER}
                        | ({} if node in agent_labelled else {"node": node}),
                    }
                    for node, address in targets.items()
                ],
            }
        ],
    }
    try:
        url, proc, log = launch_prometheus(tmp, config)
    except PrometheusFailed as exc:
        pytest.fail(str(exc))
    return Prometheus(url, proc, log)


# --- the node -------------------------------------------------------------------------------


@dataclass
class NodeUnderTest:
    targets: dict[str, str]  # node label -> host:port to scrape
    sim: SimNode
    fake: FakeNvml | FakeAmdSmi
    agent: AgentProcess
    provoke_later: Callable[[], None]  # once Prometheus has seen the counters' start
    provoked: dict[str, dict[str, str]]  # alert -> labels one of its series must carry
    not_provoked: dict[str, str]  # alert -> why the fakes cannot drive it
    detail: str = "default"  # the agent's --metrics-detail
    vendor: str = "nvidia"  # of the simulated node's GPUs


@contextlib.contextmanager
def packet_loss(port: int, one_in: int) -> Iterator[bool]:
    """Drop one in `one_in` loopback packets to `port` (nftables); False if nft is missing."""
    nft = shutil.which("nft")
    table = f"gpuscope_e2e_{os.getpid()}"
    if nft is None:
        yield False
        return
    script = (
        f"add table inet {table}\n"
        f"add chain inet {table} input {{ type filter hook input priority 0 ; }}\n"
        f'add rule inet {table} input iifname "lo" tcp dport {port} '
        f"numgen random mod {one_in} == 0 drop\n"
    )
    proc = subprocess.run([nft, "-f", "-"], input=script, text=True, capture_output=True)
    try:
        yield proc.returncode == 0
    finally:
        subprocess.run([nft, "delete", "table", "inet", table], capture_output=True)


def add_straggler(sim: SimNode) -> None:
    """A second, slower rank of the PyTorchJob on GPU 7 (the job's straggler)."""
    ns, name = STRAGGLER_POD.split("/")
    sim.add_pod(
        ns, name,
        containers=[ContainerSpec("pytorch", gpus=[7], gpu_memory_bytes=40 * GIB, sm_util=35)],
        labels={
            "training.kubeflow.org/job-name": "llama-ft",
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/replica-type": "worker",
            "training.kubeflow.org/replica-index": "1",
        },
        owners=[owner_reference("PyTorchJob", "llama-ft", api_version="kubeflow.org/v1")],
    )  # fmt: skip


def busy_training_node(sim: SimNode) -> None:
    """What both vendors' proofs run: issue #4's training scenario, the slower second rank,
    GPU 6 (alice and bob) allocated and idle, and steady traffic from the worker to the
    evaluator and from the evaluator to alice's notebook."""
    training_scenario(sim)
    add_straggler(sim)
    ns, name = NB_ALICE_POD.split("/")
    sim.set_usage(ns, name, sm_util=0)
    sim.wait_traffic()
    sim.start_traffic(WORKER_POD, EVAL_POD, rate=4e6)
    sim.start_traffic(EVAL_POD, NB_ALICE_POD, rate=1e6)


def break_gpus(fake: FakeNvml) -> None:
    """The failure states present from the start, for the alerts that need them."""
    with fake.batch():
        fake.set_pcie_link(0, width=8)  # GPU 0 busy (93 %) on x8 of x16
        fake.set_nvlink_up(1, 2, False)
        fake.set_temperature(2, 95)
        fake.set_throttle_reasons(2, 0x20)  # sw_thermal
        fake.set_throttle_reasons(1, HW_POWER_BRAKE)
        fake.set_remapped_rows(4, 3, 1, pending=False, failure=True)
        fake.set_remapped_rows(6, 1, 0, pending=True, failure=False)


def provoker(fake: FakeNvml, stop: threading.Event) -> Callable[[], None]:
    """What to break once Prometheus has seen the counters start: a lost GPU, XIDs (one
    asking for a recovery action), and NVLink errors, PCIe replays and uncorrectable ECC
    errors that keep coming (every second until `stop`)."""

    def errors_keep_coming() -> None:
        while not stop.wait(1.0):
            fake.add_nvlink_errors(1, 0, "crc_flit", 3)
            fake.add_pcie_replays(0, 20)  # 1,200 a minute, above 8
            fake.add_ecc_errors(4, uncorrected=1)  # so that an 8 s window sees them too

    def provoke_later() -> None:
        fake.lose_gpu(3)  # while running: a GPU lost before the agent starts has no UUID
        fake.inject_xid(4, CRITICAL_XID)
        fake.inject_xid(4, RECOVERY_XID)
        fake.inject_xid(5, OTHER_XID)
        threading.Thread(target=errors_keep_coming, daemon=True).start()

    return provoke_later


def expected_alerts(lossy: bool) -> tuple[dict[str, dict[str, str]], dict[str, str]]:
    """(provoked, not provoked) alerts; the retransmit one needs nft's packet loss."""
    provoked, not_provoked = dict(PROVOKED), dict(NOT_PROVOKED)
    if not lossy:
        del provoked["PodTCPRetransmitRatioHigh"]
        not_provoked["PodTCPRetransmitRatioHigh"] = "nft could not add packet loss"
    return provoked, not_provoked


@pytest.fixture(params=["default", "full"])
def gpu_node(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    agent_process: Callable[..., AgentProcess],
    sim_node: Callable[..., SimNode],
) -> Iterator[NodeUnderTest]:
    """The simulated node (tests/doubles/simnode.py) with issue #4's training scenario plus a
    second, slower rank of the PyTorchJob on GPU 7, steady traffic, and the fakes' failure
    states; its agent at each detail level (--metrics-detail): every dashboard and rule must
    work at the default level, and at full detail."""
    detail = ("--metrics-detail", request.param)
    sim = sim_node(SIM_NODE)  # on real time: the agent's sampler runs
    fake = sim.fake
    sysfs = write_tree(tmp_path / "sys")  # NICs and RDMA ports matching the dgx-h100 GPUs
    busy_training_node(sim)
    worker_port = sim.pods[WORKER_POD].port
    assert worker_port is not None
    with packet_loss(worker_port, one_in=4) as lossy:
        # Small paced sends (10 kB every 0.1 s) on a path losing a quarter of its packets.
        sim.start_traffic(STRAGGLER_POD, WORKER_POD, rate=1e5)
        break_gpus(fake)
        agent = agent_process(
            *sim_node_args(sim), "--sysfs", str(sysfs), "--cgroup-root", str(cgroup_v2_root()),
            "--series-node-label", "true", *detail,
            env=fake.env(),
        )  # fmt: skip
        broken = agent_process(
            "--collectors", "gpu", "--labels-mode", "none", *detail,
            env=broken_driver(tmp_path),
        )  # fmt: skip
        stop = threading.Event()
        targets = {
            SIM_NODE: f"127.0.0.1:{agent.port}",
            BROKEN_NODE: f"127.0.0.1:{broken.port}",
            GONE_NODE: f"127.0.0.1:{free_port()}",
        }
        provoked, not_provoked = expected_alerts(lossy)
        try:
            yield NodeUnderTest(
                targets, sim, fake, agent, provoker(fake, stop), provoked, not_provoked,
                request.param,
            )  # fmt: skip
        finally:
            stop.set()


def amd_provoker(fake: FakeAmdSmi, stop: threading.Event) -> Callable[[], None]:
    """A lost GPU and uncorrectable ECC errors that keep coming, once Prometheus has seen
    the counters start."""

    def errors_keep_coming() -> None:
        n = 0
        while not stop.wait(1.0):
            n += 1
            fake.set_ecc(4, "umc", 0, n)

    def provoke_later() -> None:
        fake.lose(3)
        threading.Thread(target=errors_keep_coming, daemon=True).start()

    return provoke_later


@pytest.fixture
def amd_node(
    tmp_path: Path,
    agent_process: Callable[..., AgentProcess],
    sim_node: Callable[..., SimNode],
) -> Iterator[NodeUnderTest]:
    """The training scenario and straggler of `gpu_node` on a simulated MI300X node (fake
    AMD SMI, `amd.com/gpu`), with XGMI traffic among the training job's GPUs, a hot GPU and
    an XGMI link down; its agent at the default detail level with the `amd` collector."""
    sysfs = write_tree(tmp_path / "sys")  # NICs and RDMA ports, as on the NVIDIA node
    sim = sim_node(SIM_NODE, amd="mi300x", sysfs=sysfs)
    fake = sim.fake
    busy_training_node(sim)
    sim.start_traffic(STRAGGLER_POD, WORKER_POD, rate=1e5)
    with sim.batch():
        for gpu in range(4):  # the training job's all-reduce over XGMI
            for link in range(3):
                fake.set_xgmi_link(gpu, link, read_kbps=2e6, write_kbps=2e6)
        fake.set_xgmi_link(1, 5, status="down")
        fake.set_temperature(2, "junction", 95)
    agent = agent_process(
        *sim_node_args(sim), "--cgroup-root", str(cgroup_v2_root()),
        "--series-node-label", "true", "--collectors", AMD_COLLECTORS,
        env=fake.env(),
    )  # fmt: skip
    broken = agent_process(
        "--collectors", "gpu", "--labels-mode", "none", env=broken_driver(tmp_path)
    )
    stop = threading.Event()
    targets = {
        SIM_NODE: f"127.0.0.1:{agent.port}",
        BROKEN_NODE: f"127.0.0.1:{broken.port}",
        GONE_NODE: f"127.0.0.1:{free_port()}",
    }
    not_provoked = {
        **{k: v for k, v in NOT_PROVOKED.items() if not k.startswith("GPUTemperatureHigh")},
        **{
            name: "NVIDIA-only: proven on the NVIDIA node"
            for name in PROVOKED
            if name not in AMD_PROVOKED and name != "PodTCPRetransmitRatioHigh"
        },
        "PodTCPRetransmitRatioHigh": "no GPU in it: proven on the NVIDIA node",
    }
    try:
        yield NodeUnderTest(
            targets, sim, fake, agent, amd_provoker(fake, stop), dict(AMD_PROVOKED),
            not_provoked, "default", "amd",
        )  # fmt: skip
    finally:
        stop.set()


def _prometheus(tmp_path: Path, node: NodeUnderTest) -> Iterator[Prometheus]:
    prom = start_prometheus(tmp_path / "prometheus", node.targets, AGENT_LABELLED)
    yield prom
    prom.proc.terminate()
    try:
        prom.proc.wait(timeout=10)
    except subprocess.TimeoutExpired:
        prom.proc.kill()


@pytest.fixture
def prometheus(tmp_path: Path, gpu_node: NodeUnderTest) -> Iterator[Prometheus]:
    yield from _prometheus(tmp_path, gpu_node)


@pytest.fixture
def amd_prometheus(tmp_path: Path, amd_node: NodeUnderTest) -> Iterator[Prometheus]:
    yield from _prometheus(tmp_path, amd_node)


# Attribution families fed only by NVIDIA's SM activity (GPM or DCGM's profiling metrics).
SM_ACTIVITY_DERIVED = frozenset(
    {
        "gpuscope_workload_gpu_low_activity_seconds_total",
        "gpuscope_workload_gpu_low_activity_cause_seconds_total",
    }
)


def _vendor_only() -> dict[str, frozenset[str]]:
    """Each vendor's own metric families. AMD's: the `amd` collector's that NVIDIA's `gpu`
    collector does not render. NVIDIA's: the `gpu` collector's of which no AMD golden
    exposition at the default detail level (tests/golden/amd-*.prom: every fake AMD profile)
    has a sample (so gpuscope_gpu_throttle_reasons, which AMD GPUs serve at full detail only,
    beside their gpuscope_gpu_throttle_seconds_total), the
    attribution families fed by SM activity, and, for both, the series recorded from any of
    these."""
    nvidia_r, amd_r = renderer_of(BY_NAME["gpu"]), renderer_of(BY_NAME["amd"])
    assert nvidia_r is not None and amd_r is not None
    amd_seen = {  # families with samples (an empty one keeps its HELP and TYPE lines)
        re.split(r"[{ ]", line, maxsplit=1)[0]
        for path in GOLDEN_DIR.glob("amd-*.prom")
        if not path.stem.endswith("-full")  # the AMD node's agent runs at the default level
        for line in path.read_text().splitlines()
        if line and not line.startswith("#")
    }
    nvidia = {m.name for m in nvidia_r.metrics} - amd_seen | SM_ACTIVITY_DERIVED
    amd = {m.name for m in amd_r.metrics} - {m.name for m in nvidia_r.metrics}
    for _ in range(3):  # recording rules of recorded series
        for rule in recording_rules():
            for families in (nvidia, amd):
                if any(m in families for m, _labels in selectors(rule["expr"])):
                    families.add(rule["record"])
    return {"nvidia": frozenset(nvidia), "amd": frozenset(amd)}


VENDOR_ONLY = _vendor_only()


def other_vendor_only(expr: str, vendor: str) -> list[str]:
    """The families `expr` selects that only the other vendor's GPUs have."""
    other = VENDOR_ONLY["amd" if vendor == "nvidia" else "nvidia"]
    return sorted({m for m, _labels in selectors(expr) if m in other})


# --- the checks -----------------------------------------------------------------------------


def _finite(result: list[dict[str, Any]]) -> bool:
    return any(math.isfinite(float(s["value"][1])) for s in result)


def _why_empty(prom: Prometheus, expr: str) -> str:
    absent = []
    for metric, _labels in selectors(expr):
        if metric and not prom.query(f"count({metric})"):
            absent.append(metric)
    return f"no series ({'absent: ' + ', '.join(absent) if absent else 'all metrics present'})"


@dataclass
class Checks:
    prom: Prometheus
    vendor: str = "nvidia"
    failures: dict[str, str] = field(default_factory=dict)
    # where -> the other vendor's families it selects: empty here, and rightly so
    other_vendor_empty: dict[str, list[str]] = field(default_factory=dict)
    returned: set[str] = field(default_factory=set)  # where data came back

    def expect(self, where: str, expr: str, *, finite: bool = False) -> list[dict[str, Any]]:
        try:
            result = self.prom.query(expr)
        except PromQLError as err:
            self.failures[where] = f"error: {err}\n      {expr}"
            return []
        if result:
            self.returned.add(where)
        if not result and (others := other_vendor_only(expr, self.vendor)):
            self.other_vendor_empty[where] = others
        elif not result:
            self.failures[where] = f"{_why_empty(self.prom, expr)}\n      {expr}"
        elif finite and not _finite(result):
            self.failures[where] = f"only NaN/Inf values\n      {expr}"
        return result


def template_values(
    prom: Prometheus, elapsed: float
) -> tuple[dict[str, dict[str, str]], list[str]]:
    """Each dashboard's variable values, read from the data as Grafana would, or problems."""
    problems = []
    nodes = prom.series_labels("gpuscope_gpu_info", "node")
    if nodes != [SIM_NODE]:
        problems.append(f"label_values(gpuscope_gpu_info, node) = {nodes}")
    # The training job: the workload with the most pods (llama-ft: two ranks).
    top = prom.query("topk(1, count by (namespace, workload) (gpuscope_pod_info))")
    namespace, workload = (
        (top[0]["metric"].get("namespace", ""), top[0]["metric"].get("workload", ""))
        if top
        else ("", "")
    )
    if not workload:
        problems.append("no workload in gpuscope_pod_info")
    common = {
        "cluster": ".*",
        "__rate_interval": RATE_INTERVAL,
        "__interval": f"{SCRAPE_INTERVAL_S}s",
        "__interval_ms": f"{SCRAPE_INTERVAL_S * 1000}",
        "__range": f"{max(int(elapsed), 2)}s",
    }
    values = {
        "gpu-fleet": {**common, "vendor": ".*", "model": ".*"},
        "node": {**common, "node": nodes[0] if nodes else SIM_NODE, "gpu": ".*"},
        "training-job": {**common, "namespace": namespace, "workload": workload},
        "network": {**common, "node": ".*", "namespace": ".*"},
    }
    return values, problems


def check_dashboards(checks: Checks, values: dict[str, dict[str, str]]) -> None:
    for q in all_queries():
        if (q.dashboard, q.panel) in MIG_PANELS | WHY_IDLE_PANELS:
            continue
        if (q.dashboard, q.panel) == ("training-job", "annotation Straggler alerts"):
            continue  # the alert fires after 2 minutes: tests/e2e/test_straggler_e2e.py
        vals = values[q.dashboard]
        if q.kind == "variable":
            check_variable(checks, q, vals)
            continue
        checks.expect(q.where, substitute(q.expr, vals), finite=True)


def check_variable(checks: Checks, q: Query, vals: dict[str, str]) -> None:
    parsed = label_values_query(q.expr)
    assert parsed, q
    selector, label = parsed
    found = checks.prom.series_labels(substitute(selector, vals), label)
    chosen = vals.get(q.panel.removeprefix("variable "), "")
    if not found:
        checks.failures[q.where] = f"no values\n      {q.expr}"
    elif chosen not in found and chosen != ".*":
        checks.failures[q.where] = f"{chosen!r} not among {found}"


def check_rules(checks: Checks, node: NodeUnderTest) -> None:
    for rule in recording_rules():
        name = rule["record"]
        if name in KUBE_STATE_METRICS_RULES:
            continue
        if name in THRESHOLDED_RECORDING:
            checks.expect(f"recording rule {name}: comparisons made bool", relaxed(rule["expr"]))
            continue
        checks.expect(f"recording rule {name}: expression", rule["expr"])
        checks.expect(f"recording rule {name}: recorded series", name)
    for rule in alerting_rules():
        where = f"alert {rule['alert']} {rule.get('labels', {})}"
        if node.detail == "default" and rule["alert"] in EMPTY_WHEN_HEALTHY_AT_DEFAULT:
            continue
        checks.expect(f"{where}: comparisons made bool", relaxed(rule["expr"]))
    for name, labels in node.provoked.items():
        variants = [r["expr"] for r in alerting_rules() if r["alert"] == name]
        results = []
        for expr in variants:
            with contextlib.suppress(PromQLError):
                results += checks.prom.query(shortened(expr))
        if not any(labels.items() <= s["metric"].items() for s in results):
            got = [s["metric"] for s in results]
            checks.failures[f"alert {name}: as written, {SHORT_WINDOW} windows"] = (
                f"no series with {labels}; got {got}"
            )
    for name, labels in node.provoked.items():
        if name in NOT_IN_PROMETHEUS_STATE:
            continue
        alerts = checks.prom.query(f'ALERTS{{alertname="{name}"}}')
        if not any(labels.items() <= s["metric"].items() for s in alerts):
            got = [s["metric"] for s in alerts]
            checks.failures[f"alert {name}: pending or firing in Prometheus"] = (
                f"no alert with {labels}; got {got}"
            )
    groups = checks.prom.get("/api/v1/rules")["groups"]
    for group in groups:
        for rule in group["rules"]:
            if rule.get("health") != "ok":
                checks.failures[f"rule {rule['name']}: health"] = (
                    f"{rule.get('health')}: {rule.get('lastError')}"
                )
    loaded = sum(len(g["rules"]) for g in groups)
    if loaded != len(recording_rules()) + len(alerting_rules()):
        checks.failures["rules loaded"] = f"{loaded} rules in Prometheus"


def test_every_dashboard_query_and_rule_returns_data(
    gpu_node: NodeUnderTest, prometheus: Prometheus
) -> None:
    prove(gpu_node, prometheus)


def test_every_vendor_neutral_query_and_rule_returns_data_on_an_amd_node(
    amd_node: NodeUnderTest, amd_prometheus: Prometheus
) -> None:
    checks = prove(amd_node, amd_prometheus)
    # The vendor-neutral panels a fleet of AMD GPUs is judged by, and XGMI.
    for where in (
        "gpu-fleet.json / 'GPUs by vendor and model' / A",
        "gpu-fleet.json / 'Utilization by vendor and model' / A",
        "gpu-fleet.json / 'Allocated GPUs by vendor and model' / A",
        "node.json / 'NVLink and XGMI throughput' / C",
        "node.json / 'NVLinks and XGMI links up' / B",
    ):
        assert where in checks.returned, where
    vendors = amd_prometheus.series_labels("gpuscope_gpu_info", "vendor")
    assert vendors == ["amd"], vendors


def prove(gpu_node: NodeUnderTest, prometheus: Prometheus) -> Checks:
    """Every dashboard query and rule returns data from the node (see the module docstring);
    on an AMD node the NVIDIA-only ones may be empty, and are listed."""
    # Let Prometheus see the counters before they move, then provoke the events.
    deadline = time.monotonic() + 15
    while not prometheus.query(f'gpuscope_gpu_up{{node="{SIM_NODE}"}}'):
        assert time.monotonic() < deadline, f"no scrape of the agent:\n{prometheus.logs()}"
        time.sleep(0.2)
    time.sleep(2 * SCRAPE_INTERVAL_S)
    gpu_node.provoke_later()

    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        time.sleep(1)
        checks = Checks(prometheus, gpu_node.vendor)
        values, problems = template_values(prometheus, time.time() - prometheus.started)
        for i, p in enumerate(problems):
            checks.failures[f"template values {i}"] = p
        check_dashboards(checks, values)
        check_rules(checks, gpu_node)
        if not checks.failures or time.monotonic() > deadline:
            break
    report = "\n".join(f"  {where}: {why}" for where, why in sorted(checks.failures.items()))
    not_provoked = "\n".join(f"  {k}: {v}" for k, v in gpu_node.not_provoked.items())
    print(f"\nAlerts not provoked (checked with comparisons made bool only):\n{not_provoked}")
    empty = "\n".join(
        f"  {w}: {', '.join(m)}" for w, m in sorted(checks.other_vendor_empty.items())
    )
    print(
        f"\nOn this {gpu_node.vendor} node, {len(checks.returned)} queries returned data; "
        f"{len(checks.other_vendor_empty)} are empty, selecting the other vendor's families:\n"
        f"{empty}"
    )
    assert not checks.failures, (
        f"{len(checks.failures)} check(s) failed:\n{report}\n"
        f"template values: {json.dumps(values)}\n"
        f"agent log (tail):\n{gpu_node.agent.logs()[-3000:]}"
    )
    return checks
