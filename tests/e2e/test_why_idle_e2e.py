"""The "why idle" panels (issue #16) that tests/e2e/test_prometheus_e2e.py's node cannot feed,
against a real Prometheus: the real agent on a simulated GPU node with a rank of a
PyTorchJob scheduled after the agent started (so its start-up time is measured), its pod's
cgroup readable for CPU throttling and block I/O (the simulated node makes the pod's v1 cpu
and blkio directories on a hybrid host, as the kubelet does), and a
kubernetes-state-metrics double naming another rank of the same job Pending (the gang rule).

Each query must return a finite value; the gang rule must count the job's GPU."""

from __future__ import annotations

import contextlib
import http.server
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.doubles.kube_apiserver import owner_reference
from tests.doubles.netlab import cgroup_v2_root
from tests.doubles.simnode import GIB, ContainerSpec, SimNode
from tests.e2e.test_prometheus_e2e import (
    KUBE_STATE_METRICS_RULES,
    WHY_IDLE_PANELS,
    Checks,
    start_prometheus,
)
from tests.support import AgentProcess, sim_node_args, wait_for
from tests.support.observability import all_queries, recording_rules, substitute

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.kernel,
    pytest.mark.root(reason="the simulated node makes cgroups, the agent loads BPF"),
]

NODE = "sim-node-1"
NAMESPACE, JOB = "ml-team", "llama-ft"
PANELS = WHY_IDLE_PANELS
(GANG_RULE,) = KUBE_STATE_METRICS_RULES
# kube-state-metrics' series for a rank of the job that waits to be scheduled.
KSM_TEXT = f"""\
# TYPE kube_pod_status_phase gauge
kube_pod_status_phase{{namespace="{NAMESPACE}",pod="{JOB}-worker-1",uid="u-w1",phase="Pending"}} 1
kube_pod_status_phase{{namespace="{NAMESPACE}",pod="{JOB}-worker-1",uid="u-w1",phase="Running"}} 0
# TYPE kube_pod_owner gauge
kube_pod_owner{{namespace="{NAMESPACE}",pod="{JOB}-worker-1",uid="u-w1",owner_kind="PyTorchJob",\
owner_name="{JOB}",owner_is_controller="true"}} 1
"""
TIMEOUT_S = 60.0


@contextlib.contextmanager
def kube_state_metrics_double() -> Iterator[str]:
    """host:port serving KSM_TEXT at /metrics."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = KSM_TEXT.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_why_idle_panels_and_the_gang_rule_return_data(
    tmp_path: Path, agent_process: Callable[..., AgentProcess], sim_node: Callable[..., SimNode]
) -> None:
    sim = sim_node(NODE)
    agent = agent_process(
        *sim_node_args(sim), "--cgroup-root", str(cgroup_v2_root()),
        "--series-node-label", "true",
        env=sim.fake.env(),
    )  # fmt: skip
    agent.wait_ready()
    # The agent's watch for start-ups begins at its first evaluation with GPU records (a
    # scrape); the API double writes times to the second, so the pod comes a second later.
    wait_for(lambda: "gpuscope_gpu_info{" in agent.get("/metrics")[1], timeout=30, what="GPUs")
    watch_began = time.time()
    while int(time.time()) <= int(watch_began):
        time.sleep(0.05)
    # Scheduled after the agent's watch began, idle until the agent has seen it: its start-up
    # time is measured (a pod already active when first seen has none).
    pod = sim.add_pod(
        NAMESPACE, f"{JOB}-worker-0",
        containers=[ContainerSpec("pytorch", gpus=[0], gpu_memory_bytes=40 * GIB, sm_util=0)],
        labels={
            "training.kubeflow.org/job-name": JOB,
            "training.kubeflow.org/operator-name": "pytorchjob-controller",
            "training.kubeflow.org/replica-type": "worker",
            "training.kubeflow.org/replica-index": "0",
        },
        owners=[owner_reference("PyTorchJob", JOB, api_version="kubeflow.org/v1")],
    )  # fmt: skip

    def listed() -> bool:
        time.sleep(0.2)
        return any(
            line.startswith("gpuscope_pod_info{") and f'pod="{pod.name}"' in line
            for line in agent.get("/metrics")[1].splitlines()
        )

    wait_for(
        listed,
        timeout=30,
        what="the agent lists the new rank",
    )
    sim.set_usage(NAMESPACE, pod.name, sm_util=80)
    with kube_state_metrics_double() as ksm:
        # The double is one more target of the same job: the rule reads its series by name.
        prom = start_prometheus(
            tmp_path / "prometheus",
            {NODE: f"127.0.0.1:{agent.port}", "kube-state-metrics": ksm},
            frozenset({NODE}),
        )
        try:
            values = {
                "cluster": ".*",
                "namespace": NAMESPACE,
                "workload": JOB,
                "__rate_interval": "4s",
                "__range": "30s",
                "__interval": "1s",
                "__interval_ms": "1000",
            }
            queries = [q for q in all_queries() if (q.dashboard, q.panel) in PANELS]
            assert {(q.dashboard, q.panel) for q in queries} == PANELS
            (gang,) = [r for r in recording_rules() if r["record"] == GANG_RULE]
            deadline = time.monotonic() + TIMEOUT_S
            while True:
                time.sleep(1)
                checks = Checks(prom)
                for q in queries:
                    checks.expect(q.where, substitute(q.expr, values), finite=True)
                checks.expect(f"{GANG_RULE}: expression", gang["expr"])
                recorded = checks.expect(f"{GANG_RULE}: recorded series", GANG_RULE)
                if recorded and [float(s["value"][1]) for s in recorded] != [1.0]:
                    checks.failures["gang GPUs"] = f"{recorded}: the job holds 1 GPU"
                if not checks.failures or time.monotonic() > deadline:
                    break
        finally:
            prom.proc.terminate()
            prom.proc.wait(timeout=10)
    report = "\n".join(f"  {w}: {why}" for w, why in sorted(checks.failures.items()))
    assert not checks.failures, f"{report}\nagent log (tail):\n{agent.logs()[-3000:]}"
