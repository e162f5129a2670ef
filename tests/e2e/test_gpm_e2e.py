"""The dashboards' MIG panels against a real Prometheus: the real agent on the fake's MIG
profile (dgx-h100-mig: GPUs 6 and 7 in MIG mode, GPM per GPU instance), a pod holding a MIG
device through the kubelet double, every query of those panels returning data (the main
dashboard e2e, tests/e2e/test_prometheus_e2e.py, runs a node without MIG)."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.doubles.fakenvml.control import FakeNvml
from tests.doubles.kube_apiserver import KubeApiServer
from tests.doubles.kube_apiserver import pod as pod_manifest
from tests.doubles.kubelet_server import KubeletServer, container, devices
from tests.doubles.kubelet_server import pod as kubelet_pod
from tests.e2e import test_prometheus_e2e as prometheus_e2e
from tests.e2e.test_prometheus_e2e import (
    MIG_PANELS,
    RATE_INTERVAL,
    SETTLE_TIMEOUT_S,
    SIM_NODE,
    Checks,
)
from tests.support import AgentProcess
from tests.support.observability import all_queries, substitute

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MIG_GPU = 6


def test_the_mig_panels_return_data_with_the_pod_holding_each_device(
    tmp_path: Path, agent_process: Callable[..., AgentProcess]
) -> None:
    fake = FakeNvml("dgx-h100-mig", tmp_path / "mig.state")
    fake.set_utilization(MIG_GPU, 100)
    device = next(d for d in fake.mig_devices(MIG_GPU) if d["profile"] == "3g.40gb")
    fake.set_gpm_activity(
        MIG_GPU, graphics=0.7, sm_active=0.4, mig_instance=device["gpu_instance_id"]
    )
    with KubeletServer() as kubelet, KubeApiServer() as api:
        api.create(
            pod_manifest("infer", "server-0", SIM_NODE, uid="5e7f0b4c-1d2a-4c3b-9e8f-7a6b5c4d3e2f")
        )
        kubelet.set_pods(
            kubelet_pod(
                "infer",
                "server-0",
                container("main", devices("nvidia.com/mig-3g.40gb", device["uuid"])),
            )
        )
        agent = agent_process(
            "--collectors", "gpu,kubelet,pods", "--kubelet-socket", str(kubelet.socket_path),
            "--kubeconfig", str(api.kubeconfig(tmp_path / "kubeconfig")),
            "--node-name", SIM_NODE, "--labels-mode", "none",
            env=fake.env(),
        )  # fmt: skip
        prom = prometheus_e2e.start_prometheus(
            tmp_path / "prom", {SIM_NODE: f"127.0.0.1:{agent.port}"}
        )
        try:
            values = {"cluster": ".*", "node": SIM_NODE, "gpu": ".*",
                      "__rate_interval": RATE_INTERVAL}  # fmt: skip
            queries = [q for q in all_queries() if (q.dashboard, q.panel) in MIG_PANELS]
            assert {(q.dashboard, q.panel) for q in queries} == MIG_PANELS
            deadline = time.monotonic() + SETTLE_TIMEOUT_S
            while True:
                time.sleep(1)
                checks = Checks(prom)
                for q in queries:
                    checks.expect(q.where, substitute(q.expr, values), finite=True)
                holders = prom.query(f'gpuscope_mig_allocation_info{{mig_uuid="{device["uuid"]}"}}')
                if [s["metric"].get("pod") for s in holders] != ["server-0"]:
                    checks.failures["holder"] = f"gpuscope_mig_allocation_info: {holders}"
                if not checks.failures or time.monotonic() > deadline:
                    break
            report = "\n".join(f"  {w}: {why}" for w, why in sorted(checks.failures.items()))
            assert not checks.failures, f"{len(checks.failures)} failed:\n{report}"
        finally:
            prom.proc.terminate()
            prom.proc.wait(10)
