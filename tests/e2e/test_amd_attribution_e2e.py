"""End to end on simulated AMD nodes (issue #23): the real `gpuscope` process with its `amd`
collector on the fake AMD SMI library, the kubelet double advertising `amd.com/gpu` with the
ids AMD's device plugin gives (a GPU's PCI address, `amdgpu_xcp_<N>` for the partitions
beyond the first of a CPX GPU, joined to the processors through the sysfs devices the node
writes), and pods that are real processes in kubelet-style cgroups listed in the fake's
process lists (tests/doubles/simnode.py, tests/doubles/simgpus.py).

On an MI300X in CPX mode each pod holds one partition: /metrics names the partition's holder
(gpuscope_mig_allocation_info, by partition UUID, and gpuscope_gpu_allocation_info on its
GPU), the pod's GPU memory and utilization, and an idle pod's partition counts as reserved
but idle, the same families NVIDIA's pods get. On an MI250X the 8 GCDs come 2 to a package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from tests.doubles.simnode import GIB, ContainerSpec, SimNode
from tests.support import AgentProcess, sim_node_args, wait_for
from tests.support.promtext import Exposition

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.root(reason="the simulated node makes cgroups"),
]

COLLECTORS = ("--collectors", "amd,kubelet,pods")
# pod -> (processor, GPU memory GiB, busy percent) on mi300x-cpx: socket s, XCP k is
# processor s*8 + k; the device plugin names XCP 0 by its PCI address, the others
# amdgpu_xcp_<N> (N = 7s + k - 1).
CPX_PODS: dict[str, tuple[int, int, float]] = {
    "train-0": (0, 20, 90),  # GPU 0, XCP 0: 0000:05:00.0
    "train-1": (1, 18, 70),  # GPU 0, XCP 1: amdgpu_xcp_0
    "notebook": (9, 6, 0),  # GPU 1, XCP 1: amdgpu_xcp_7, holding memory, idle
    "eval": (18, 9, 40),  # GPU 2, XCP 2: amdgpu_xcp_15
}
CPX_IDS = {
    "train-0": "0000:05:00.0",
    "train-1": "amdgpu_xcp_0",
    "notebook": "amdgpu_xcp_7",
    "eval": "amdgpu_xcp_15",
}
NAMESPACE = "ml-team"


def agent_uuid(processor: dict[str, Any]) -> str:
    """A partition's UUID as the agent names it: XCP 0 reports its GPU's UUID, and the agent
    keys GPUs and partitions apart, so it is `<uuid>-xcp0` (agent/amd/device.py)."""
    return f"{processor['uuid']}-xcp0" if int(processor["xcp"]) == 0 else str(processor["uuid"])


def scrape_until(agent: AgentProcess, check: Callable[[Exposition], bool], what: str) -> Exposition:
    seen: list[Exposition] = []

    def ok() -> bool:
        seen.append(agent.scrape())
        return check(seen[-1])

    try:
        wait_for(ok, timeout=20, what=what)
    except AssertionError:
        last = seen[-1] if seen else None
        lines = [
            f"{name}{dict(labels)} {value}"
            for (name, labels), value in (last.samples.items() if last else ())
            if "allocat" in name or "pod_gpu" in name or "collector_success" in name
        ]
        raise AssertionError(
            f"timed out waiting for {what}:\n" + "\n".join(lines) + agent.logs()
        ) from None
    return seen[-1]


def cpx_node(
    agent_process: Callable[..., AgentProcess], sim_node: Callable[..., SimNode]
) -> tuple[Exposition, dict[str, str]]:
    """CPX_PODS on a simulated MI300X CPX node, scraped once every partition is attributed
    and the idle one has been idle 3 s; and each pod's partition UUID."""
    node = sim_node(amd="mi300x-cpx")
    fake = node.fake
    for pod, (proc, mem, busy) in CPX_PODS.items():
        node.add_pod(
            NAMESPACE, pod,
            containers=[ContainerSpec("main", gpus=[proc], gpu_memory_bytes=mem * GIB,
                                      sm_util=busy)],
        )  # fmt: skip
    # What the kubelet double advertises is what AMD's plugin would.
    advertised = {c.device_ids for p in node.pods.values() for c in p.containers.values()}
    assert advertised == {(i,) for i in CPX_IDS.values()}
    assert node.sysfs is not None
    assert (node.sysfs / "devices/platform/amdgpu_xcp_7/drm").is_dir()
    agent = agent_process(*COLLECTORS, *sim_node_args(node), env=fake.env())
    partition_uuid = {pod: agent_uuid(fake.gpu(proc)) for pod, (proc, _m, _b) in CPX_PODS.items()}

    def attributed(m: Exposition) -> bool:
        held = {k["pod"]: k["mig_uuid"] for k, _ in m.rows("gpuscope_mig_allocation_info")}
        idle = m.get("gpuscope_mig_allocated_idle_seconds", mig_uuid=partition_uuid["notebook"])
        return held == partition_uuid and idle is not None and idle >= 3

    m = scrape_until(agent, attributed, "every partition attributed, the idle one idle 3 s")
    return m, partition_uuid


def test_cpx_partitions_are_attributed_to_their_pods(
    agent_process: Callable[..., AgentProcess], sim_node: Callable[..., SimNode]
) -> None:
    m, partition_uuid = cpx_node(agent_process, sim_node)
    assert m.value("gpuscope_collector_success", collector="attribution") == 1

    # Each pod's partition, on its GPU (the socket), by the partition's UUID.
    holders = {
        k["pod"]: (k["gpu"], k["namespace"], k["container"], k["workload_kind"])
        for k, _ in m.rows("gpuscope_mig_allocation_info")
    }
    assert holders == {
        pod: (str(proc // 8), NAMESPACE, "main", "Pod") for pod, (proc, _m, _b) in CPX_PODS.items()
    }
    on_gpu = {(k["gpu"], k["pod"]) for k, _ in m.rows("gpuscope_gpu_allocation_info")}
    assert on_gpu == {(str(proc // 8), pod) for pod, (proc, _m, _b) in CPX_PODS.items()}
    allocated = {k["mig_uuid"] for k, v in m.rows("gpuscope_mig_allocated") if v == 1}
    assert allocated == set(partition_uuid.values())

    # Per-pod GPU memory exactly; utilization from the processes' gfx engine time.
    memory = {k["pod"]: v for k, v in m.rows("gpuscope_pod_gpu_memory_bytes")}
    assert memory == {pod: mem * GIB for pod, (_p, mem, _b) in CPX_PODS.items()}
    util = {k["pod"]: v for k, v in m.rows("gpuscope_pod_gpu_utilization_ratio")}
    for pod, (_p, _m, busy) in CPX_PODS.items():
        assert util[pod] == pytest.approx(busy / 100, abs=0.1), (pod, util)

    # The idle pod's partition is reserved but idle; the busy ones are not.
    def mig_idle(pod: str) -> float | None:
        return m.get("gpuscope_mig_allocated_idle_seconds", mig_uuid=partition_uuid[pod])

    assert (mig_idle("notebook") or 0) >= 3
    for pod in ("train-1", "eval"):
        assert mig_idle(pod) == 0, pod
    idle_by_workload = {
        k["workload"]: v for k, v in m.rows("gpuscope_workload_gpu_idle_seconds_total")
    }
    # GPU-seconds: the idle partition's time weighted by its share of the GPU (1/8 in CPX).
    notebook = idle_by_workload["notebook"]
    assert 0 < notebook <= (mig_idle("notebook") or 0) / 8 + 0.5, idle_by_workload
    assert idle_by_workload["train-0"] == 0 and idle_by_workload["train-1"] == 0, idle_by_workload


def test_cpx_busy_partition_on_an_idle_gpu_is_not_charged_idle(
    agent_process: Callable[..., AgentProcess], sim_node: Callable[..., SimNode]
) -> None:
    """A partition and its GPU are keyed apart (XCP 0 reports the GPU's UUID; the agent
    names it `<uuid>-xcp0`): a busy partition on a GPU whose XCP 0 is idle (eval: GPU 2,
    XCP 2) is not charged the GPU's idle seconds."""
    m, _ = cpx_node(agent_process, sim_node)
    idle = {k["workload"]: v for k, v in m.rows("gpuscope_workload_gpu_idle_seconds_total")}
    assert idle["eval"] == 0, idle


def test_mi250x_gcds_come_two_to_a_package_and_a_gcd_is_attributed(
    agent_process: Callable[..., AgentProcess], sim_node: Callable[..., SimNode]
) -> None:
    node = sim_node(amd="mi250x")
    node.add_pod(
        NAMESPACE, "bert-0",
        containers=[ContainerSpec("main", gpus=[3], gpu_memory_bytes=30 * GIB, sm_util=60)],
    )  # fmt: skip
    bdf = node.fake.profile["gpus"][3]["bdf"]
    assert node.pods[f"{NAMESPACE}/bert-0"].containers["main"].device_ids == (bdf,)
    agent = agent_process(*COLLECTORS, *sim_node_args(node), env=node.fake.env())
    m = scrape_until(
        agent,
        lambda m: (
            bool(m.series("gpuscope_gpu_allocation_info"))
            and bool(m.series("gpuscope_pod_gpu_memory_bytes"))
        ),
        "the GCD's pod attributed",
    )
    assert len(m.series("gpuscope_gpu_info", vendor="amd")) == 8
    per_package: dict[str, int] = {}
    for k, _ in m.rows("gpuscope_gpu_package_info"):
        per_package[k["package"]] = per_package.get(k["package"], 0) + 1
    assert len(per_package) == 4 and set(per_package.values()) == {2}, per_package
    ((labels, _),) = m.rows("gpuscope_gpu_allocation_info")
    assert (labels["gpu"], labels["pod"]) == ("3", "bert-0")
    assert m.value("gpuscope_pod_gpu_memory_bytes", pod="bert-0") == 30 * GIB
    assert m.value("gpuscope_gpu_allocated", gpu="3") == 1
    assert m.value("gpuscope_gpu_allocated", gpu="2") == 0
