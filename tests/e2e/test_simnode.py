"""The simulated GPU node: what the kubelet, the API server, the kernel (cgroups, TCP) and
NVML say about its pods is consistent, seen through the clients the agent uses, and removal
and close leave nothing behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from lightkube import Client, KubeConfig
from lightkube.resources.core_v1 import Node, Pod

from gpuscope.agent.k8s.cgroups import parse_proc_cgroup
from gpuscope.agent.k8s.pod_cgroup_usage import CgroupRoots, PodCgroupReader
from gpuscope.agent.k8s.podresources.client import PodResourcesClient
from gpuscope.agent.k8s.workloads import resolve
from tests.doubles.fakenvml.control import FakeNvml
from tests.doubles.podcgroups import block_device_file
from tests.doubles.simnode import (
    EVAL_POD,
    GIB,
    NB_ALICE_POD,
    TRAINING_TRAFFIC,
    ContainerSpec,
    SimNode,
    SimPod,
    training_scenario,
)
from tests.support import T0, wait_for

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.kernel,
    pytest.mark.root(reason="the simulated node makes cgroups"),
]

NVML_DUMP = """
import json, pynvml
pynvml.nvmlInit()
out = []
for i in range(pynvml.nvmlDeviceGetCount()):
    h = pynvml.nvmlDeviceGetHandleByIndex(i)
    procs = pynvml.nvmlDeviceGetComputeRunningProcesses(h)
    out.append({
        "uuid": pynvml.nvmlDeviceGetUUID(h),
        "procs": {str(p.pid): p.usedGpuMemory for p in procs},
        "used": pynvml.nvmlDeviceGetMemoryInfo(h, pynvml.nvmlMemory_v2).used,  # allocated
        "util": pynvml.nvmlDeviceGetUtilizationRates(h).gpu,
    })
print(json.dumps(out))
"""


@pytest.fixture
def node(sim_node: Callable[..., SimNode]) -> SimNode:
    return sim_node(now=T0)


def nvml(fake: FakeNvml) -> list[dict]:
    """What the real pynvml bindings report through the fake, from another process, a
    second later (utilization is averaged over the last samples)."""
    fake.advance(1.0)
    out = subprocess.run(
        [sys.executable, "-c", NVML_DUMP],
        env=os.environ | fake.env(),
        capture_output=True,
        text=True,
        check=True,
        timeout=30,
    ).stdout
    return json.loads(out)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_training_scenario_is_consistent_everywhere(node: SimNode) -> None:
    pods = training_scenario(node)
    node.wait_traffic(10)
    uuids = [node.fake.gpu_uuid(i) for i in range(8)]
    check_kubelet(node, uuids)
    api_pods = check_api_server(node, pods)
    check_containers(pods, api_pods)
    check_nvml(node, pods)

    # The exact payloads arrived (the receivers' own counts).
    assert node.received(NB_ALICE_POD) == TRAINING_TRAFFIC[(EVAL_POD, NB_ALICE_POD)]
    assert node.received(EVAL_POD) == sum(
        n for (_s, d), n in TRAINING_TRAFFIC.items() if d == EVAL_POD
    )


def check_kubelet(node: SimNode, uuids: list[str]) -> None:
    """The kubelet's PodResources, through the agent's client: each container's device ids
    (GPU 6 time-sliced as <uuid>::0 and ::1), and the allocatable ones."""
    with PodResourcesClient(node.kubelet_socket) as kubelet:
        listed = {
            (p.namespace, p.name, c.name): sorted(d.device_id for d in c.devices)
            for p in kubelet.list()
            for c in p.containers
        }
        allocatable = {d.device_id for d in kubelet.allocatable()}
    assert listed == {
        ("ml-team", "llama-ft-worker-0", "pytorch"): sorted(uuids[0:4]),
        ("eval", "eval-nightly-7xk2p", "evaluator"): sorted(uuids[4:6]),
        ("research", "nb-alice-6c9f8d7b5c-x2m4q", "notebook"): [f"{uuids[6]}::0"],
        ("research", "nb-bob-59d4b8f6d-q8wzt", "notebook"): [f"{uuids[6]}::1"],
    }
    assert uuids[7] in allocatable and f"{uuids[6]}::1" in allocatable


def check_api_server(node: SimNode, pods: dict[str, SimPod]) -> dict[str, Any]:
    """The API server, through lightkube, as the agent asks: this node's pods only, each
    resolving to its workload. Returns the pods by key, for the per-container checks."""
    client = Client(KubeConfig.from_file(str(node.kubeconfig)))
    assert client.get(Node, node.node_name).status.capacity["nvidia.com/gpu"] == "8"
    api_pods = {
        f"{p.metadata.namespace}/{p.metadata.name}": p
        for p in client.list(Pod, namespace="*", fields={"spec.nodeName": node.node_name})
    }
    assert set(api_pods) == {p.key for p in pods.values()}
    workloads = {
        key: (w.kind, w.name, w.replica)
        for key, p in api_pods.items()
        for w in [resolve(p.to_dict())]
    }
    assert workloads == {
        "ml-team/llama-ft-worker-0": ("PyTorchJob", "llama-ft", "worker-0"),
        "eval/eval-nightly-7xk2p": ("Job", "eval-nightly", ""),
        "research/nb-alice-6c9f8d7b5c-x2m4q": ("Deployment", "nb-alice", ""),
        "research/nb-bob-59d4b8f6d-q8wzt": ("Deployment", "nb-bob", ""),
    }
    return api_pods


def check_containers(pods: dict[str, SimPod], api_pods: dict[str, Any]) -> None:
    """Per pod, the API object's uid, phase, IP and container ids match the simulated pod,
    and the kernel puts each process in its container's cgroup."""
    for sim in pods.values():
        obj = api_pods[sim.key]
        assert obj.metadata.uid == sim.uid
        assert obj.status.phase == "Running" and obj.status.podIP == sim.ip
        statuses = {s.name: s.containerID for s in obj.status.containerStatuses}
        assert statuses == {
            name: f"containerd://{c.container_id}" for name, c in sim.containers.items()
        }

        # The kernel: each process sits in its container's cgroup.
        for c in sim.containers.values():
            found = parse_proc_cgroup(Path(f"/proc/{c.pid}/cgroup").read_text())
            assert found is not None
            assert (found.pod_uid, found.container_id) == (sim.uid, c.container_id)
            assert (found.qos, found.runtime) == ("burstable", "containerd")


def check_nvml(node: SimNode, pods: dict[str, SimPod]) -> None:
    """NVML through the real bindings: each GPU lists its pods' pids; device sums follow."""
    gpus = nvml(node.fake)
    worker, evaluator = pods["worker"].pids[0], pods["eval"].pids[0]
    alice, bob = pods["nb-alice"].pids[0], pods["nb-bob"].pids[0]
    assert [set(map(int, g["procs"])) for g in gpus] == [
        *[{worker}] * 4, *[{evaluator}] * 2, {alice, bob}, set()
    ]  # fmt: skip
    assert gpus[0]["procs"][str(worker)] == 71 * GIB
    assert gpus[6]["used"] == 15 * GIB and gpus[7]["used"] == 0
    assert [g["util"] for g in gpus] == [93] * 4 + [61] * 2 + [12, 0]


def test_remove_pod_leaves_nothing(node: SimNode) -> None:
    peer = node.add_pod("a", "server", containers=[ContainerSpec("main", gpus=[7])])
    sim = node.add_pod(
        "a", "two",
        containers=[
            ContainerSpec("main", gpus=[0, 1], gpu_memory_bytes=GIB, sm_util=50),
            ContainerSpec("side", gpus=[2], use_gpus=[2, 3], gpu_memory_bytes=GIB,
                          traffic_to=peer.key, traffic_rate=1e6),  # steady, never done
        ],
        owners=[], qos="guaranteed",
    )  # fmt: skip
    assert "kubepods-pod" in sim.cgroup.name  # guaranteed: no QoS slice
    assert len(nvml(node.fake)[3]["procs"]) == 1  # the rogue use of an unallocated GPU
    node.remove_pod("a", "two")

    assert not any(alive(pid) for pid in sim.pids)
    assert not sim.cgroup.exists()
    assert node.api.get_pod("a", "two") is None
    deleted = [r for r in node.api.requests if r.verb == "delete"]
    assert deleted == []  # removal is the kubelet's doing, not a client's request
    with PodResourcesClient(node.kubelet_socket) as kubelet:
        assert [p.name for p in kubelet.list()] == ["server"]
    gpus = nvml(node.fake)
    assert all(not g["procs"] for g in gpus[:7])
    assert gpus[0]["used"] == 0 and gpus[0]["util"] == 0
    with pytest.raises(KeyError):
        node.remove_pod("a", "two")


def test_paced_transfer_host_process_and_close(sim_node: Callable[..., SimNode]) -> None:
    node = sim_node()
    fake = node.fake
    try:
        server = node.add_pod("x", "server", containers=[ContainerSpec("main")])
        client: SimPod = node.add_pod("x", "client", serve=False, containers=[ContainerSpec(
            "main", traffic_to=server.key, traffic_bytes=300_001, traffic_rate=2e6)])  # fmt: skip
        assert client.port is None
        host = node.host_process(7, 2 * GIB)
        assert parse_proc_cgroup(Path(f"/proc/{host}/cgroup").read_text()) is None
        node.wait_traffic(10)
        assert node.received(server.key) == 300_001
        assert nvml(fake)[7]["procs"] == {str(host): 2 * GIB}
        pids = [*server.pids, *client.pids, host]
    finally:
        node.close()
    assert not any(alive(pid) for pid in pids)
    assert not node._base.exists()
    assert not node.kubelet_socket.exists() and not node.api.running
    assert all(not g["procs"] for g in nvml(fake))
    node.close()  # idempotent


def in_cgroup(pid: int, controller: str, directory: Path, root: Path) -> bool:
    """Whether /proc/<pid>/cgroup puts the process in `directory` of the v1 hierarchy of
    `controller` mounted at `root`."""
    want = "/" + str(directory.relative_to(root))
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _n, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path == want
    return False


def test_pods_join_every_hierarchy_with_their_limits_and_loads(
    node: SimNode, tmp_path: Path
) -> None:
    """As a kubelet does on a hybrid host, a pod is in the v1 cpu and blkio hierarchies too,
    so its CPU limit throttles it there and its reads are counted; its helper processes (a
    CPU burner, an O_DIRECT reader) go with it, and its cgroups from every hierarchy."""
    hier = node.hierarchies
    shard = tmp_path / "shard.bin"
    if block_device_file(shard, 4 << 20) is None:
        pytest.skip(f"{tmp_path} is on no block device, or does not take O_DIRECT")
    busy = node.add_pod("a", "nb", containers=[
        ContainerSpec("nb", gpus=[6], cpu_limit=0.1, burn_cpu=True)])  # fmt: skip
    loader = node.add_pod("a", "loader", containers=[
        ContainerSpec("l", gpus=[7], read_file=shard, read_bps=8_000_000)])  # fmt: skip
    assert busy.notes == loader.notes == []
    for sim in (busy, loader):
        (c,) = sim.containers.values()
        assert len(c.helpers) == 1
        for pid in (c.pid, c.helpers[0].pid):
            found = parse_proc_cgroup(Path(f"/proc/{pid}/cgroup").read_text())
            assert found is not None and found.container_id == c.container_id
            for controller, directory in c.cgroups.v1.items():
                assert in_cgroup(pid, controller, directory, hier.v1[controller]), controller
    nb = node.api.get_pod("a", "nb")
    assert nb is not None
    assert nb["spec"]["containers"][0]["resources"]["limits"]["cpu"] == "100m"

    # The agent's reader, where it looks, sees the throttling and the block reads.
    reader = PodCgroupReader(CgroupRoots.detect(Path("/sys"), hier.v2), interval=0.0)

    def measured() -> bool:
        got = reader.read({busy.uid, loader.uid})
        throttled = got[busy.uid].cpu_throttled_seconds if busy.uid in got else None
        read = got[loader.uid].io_read_bytes if loader.uid in got else None
        return (throttled or 0) > 0.05 and (read or 0) > 1 << 20

    wait_for(measured, timeout=20, what="throttling and block reads")

    helpers = [h for sim in (busy, loader) for c in sim.containers.values() for h in c.helpers]
    node.remove_pod("a", "nb")
    assert not any(d.exists() for d in busy.cgroups.dirs)
    assert helpers[0].poll() is not None
    node.close()
    assert helpers[1].poll() is not None
    assert not any(d.exists() for d in hier.at(node._base.name).dirs)
