"""End to end on a simulated node whose GPUs are allocated through DRA: the real `gpuscope`
process (fake NVML) with the `dra` collector, the API server double serving the pod's
ResourceClaim (made from a template) and NVIDIA's driver's ResourceSlice, the kubelet double
answering the claim as DynamicResources with the driver's CDI names (no GPU UUID in them),
and the pod a real process in a kubelet-style cgroup, registered with NVML on its GPU. The
second test is a Kubernetes 1.32 API server (resource.k8s.io/v1beta1 only, its shapes) with a
monitoring pod's admin-access claim beside the workload and a dynamic MIG device published
without a uuid."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpuscope.agent.k8s.podresources.v1 import api_pb2
from tests.doubles.kube_apiserver import (
    claim_container,
    dra_dynamic_mig,
    dra_gpu,
    pod_claim,
    resource_claim,
    resource_slice,
)
from tests.doubles.kubelet_server import nvidia_claim
from tests.doubles.simnode import GIB, ContainerSpec, SimNode
from tests.support import AgentProcess, sim_node_args, wait_for
from tests.support.promtext import Exposition

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.kernel,
    pytest.mark.root(reason="the simulated node makes cgroups"),
]

NAMESPACE, POD, CLAIM = "ml-team", "infer-7f9c-x2m4q", "infer-7f9c-x2m4q-gpu-q8wzt"
GPU = 2


def kubelet_answers_dra(node: SimNode, claims: dict[tuple[str, str], Any]) -> None:
    """Make the kubelet double report `claims` ((namespace, pod) -> DynamicResource) on the
    pods' first containers, whatever the simulated node publishes (device-plugin devices
    only): the kubelet of a DRA node."""
    publish = node.kubelet.set_pods

    def set_pods(*pods: api_pb2.PodResources) -> None:
        for p in pods:
            claim = claims.get((p.namespace, p.name))
            if claim is not None and p.containers:
                p.containers[0].dynamic_resources.append(claim)
        publish(*pods)

    node.kubelet.set_pods = set_pods  # type: ignore[method-assign]


def test_a_pod_with_a_dra_gpu_gets_its_allocation_and_per_pod_series(
    agent_process: Callable[..., AgentProcess], sim_node: Callable[..., SimNode]
) -> None:
    node = sim_node()
    agent = agent_process(
        "--collectors", "gpu,kubelet,pods,dra", *sim_node_args(node), env=node.fake.env()
    )  # fmt: skip
    uuids = [node.fake.gpu_uuid(g) for g in range(node.fake.gpu_count())]
    node.api.create(resource_slice(node.node_name, [dra_gpu(g, u) for g, u in enumerate(uuids)]))
    kubelet_answers_dra(
        node,
        {(NAMESPACE, POD): nvidia_claim(CLAIM, f"gpu-{GPU}", pool=node.node_name,
                                        namespace=NAMESPACE, claim_uid="c1a1m")},
    )  # fmt: skip
    sim = node.add_pod(
        NAMESPACE, POD, serve=False,
        # No device-plugin GPU: the process uses the GPU its claim was allocated.
        containers=[ContainerSpec("server", use_gpus=[GPU], gpu_memory_bytes=20 * GIB, sm_util=60)],
    )  # fmt: skip

    def claims_of(pod: dict[str, Any]) -> None:
        pod["spec"]["resourceClaims"] = [pod_claim("gpu", template="one-h100")]
        pod["spec"]["containers"][0]["resources"] = claim_container("server", "gpu")["resources"]
        pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": CLAIM}]

    node.api.modify("pods", NAMESPACE, POD, claims_of)
    node.api.create(
        resource_claim(NAMESPACE, CLAIM, results=[("gpu", node.node_name, f"gpu-{GPU}")],
                       reserved_for=[(POD, sim.uid)], node_name=node.node_name)
    )  # fmt: skip

    seen: list[Exposition] = []

    def attributed() -> bool:
        seen.append(agent.scrape())
        return bool(seen[-1].series("gpuscope_pod_gpu_memory_bytes", pod=POD)) and bool(
            seen[-1].series("gpuscope_gpu_allocation_info", pod=POD)
        )

    wait_for(attributed, timeout=20, what="the DRA pod attributed")
    m = seen[-1]
    (info,) = [labels for labels, _ in m.rows("gpuscope_gpu_allocation_info")]
    assert (info["gpu"], info["uuid"], info["namespace"], info["pod"], info["container"]) == (
        str(GPU), uuids[GPU], NAMESPACE, POD, "server",
    )  # fmt: skip
    (memory,) = m.rows("gpuscope_pod_gpu_memory_bytes", pod=POD)
    assert memory[0]["namespace"] == NAMESPACE and memory[0]["container"] == "server"
    assert memory == (memory[0], 20.0 * GIB)
    assert memory[0]["gpu"] == str(GPU)
    assert m.value("gpuscope_gpu_allocated", gpu=str(GPU)) == 1
    # The pod uses the GPU it was given: none of its memory counts as unallocated.
    assert m.value("gpuscope_gpu_unallocated_memory_bytes", gpu=str(GPU)) == 0
    assert m.value("gpuscope_collector_success", collector="dra") == 1


def claims_of(claim: str) -> Callable[[dict[str, Any]], None]:
    """Make a pod's first container use claim `claim` (made from a template) as `gpu`."""

    def change(pod: dict[str, Any]) -> None:
        container = pod["spec"]["containers"][0]
        pod["spec"]["resourceClaims"] = [pod_claim("gpu", template="one-gpu")]
        container["resources"] = claim_container(container["name"], "gpu")["resources"]
        pod["status"]["resourceClaimStatuses"] = [{"name": "gpu", "resourceClaimName": claim}]

    return change


def test_a_1_32_api_server_admin_access_and_a_device_without_uuid(
    agent_process: Callable[..., AgentProcess], sim_node: Callable[..., SimNode]
) -> None:
    node = sim_node(dra_versions=("v1beta1",))
    agent = agent_process(
        "--collectors", "gpu,kubelet,pods,dra", *sim_node_args(node), env=node.fake.env()
    )  # fmt: skip
    uuids = [node.fake.gpu_uuid(g) for g in range(node.fake.gpu_count())]
    mig = dra_dynamic_mig(5, None)  # no uuid, no parentUUID: placed on gpu-5 by its name
    devices = [*(dra_gpu(g, u) for g, u in enumerate(uuids)), mig]
    node.api.create(resource_slice(node.node_name, devices, version="v1beta1"))
    pool = node.node_name
    specs = {  # pod -> (claim, device, admin access, its process's GPU)
        POD: (CLAIM, f"gpu-{GPU}", False, GPU),
        "dcgm-probe-4kq8z": ("dcgm-probe-4kq8z-gpu-m2x9c", f"gpu-{GPU}", True, None),
        "mig-job-0": ("mig-job-0-gpu-7hq2w", mig["name"], False, 5),
    }
    kubelet_answers_dra(
        node,
        {(NAMESPACE, p): nvidia_claim(c, d, pool=pool, namespace=NAMESPACE)
         for p, (c, d, _, _) in specs.items()},
    )  # fmt: skip
    for name, (claim, device, admin, gpu) in specs.items():
        used = [gpu] if gpu is not None else []
        sim = node.add_pod(
            NAMESPACE, name, serve=False,
            containers=[ContainerSpec("main", use_gpus=used, gpu_memory_bytes=8 * GIB,
                                      sm_util=40)],
        )  # fmt: skip
        node.api.modify("pods", NAMESPACE, name, claims_of(claim))
        node.api.create(
            resource_claim(NAMESPACE, claim, results=[("gpu", pool, device)],
                           reserved_for=[(name, sim.uid)], node_name=pool, admin_access=admin,
                           version="v1beta1")
        )  # fmt: skip

    seen: list[Exposition] = []

    def attributed() -> bool:
        seen.append(agent.scrape())
        pods = {k["pod"] for k, _ in seen[-1].rows("gpuscope_gpu_allocation_info")}
        return {POD, "mig-job-0"} <= pods

    wait_for(attributed, timeout=20, what="the DRA pods attributed")
    m = seen[-1]
    holders = {(k["gpu"], k["pod"]) for k, _ in m.rows("gpuscope_gpu_allocation_info")}
    # The monitor's admin access is no allocation: one holder of GPU 2, not two.
    assert holders == {(str(GPU), POD), ("5", "mig-job-0")}
    # The device without a uuid counts for its GPU: allocated, its memory the pod's.
    assert m.value("gpuscope_gpu_allocated", gpu="5") == 1
    assert m.value("gpuscope_gpu_unallocated_memory_bytes", gpu="5") == 0
    (memory,) = m.rows("gpuscope_pod_gpu_memory_bytes", pod="mig-job-0")
    assert memory[0]["gpu"] == "5" and memory[1] == 8.0 * GIB
    assert m.value("gpuscope_collector_success", collector="dra") == 1
    assert (
        "in resource.k8s.io/v1beta1 (the API server serves no resource.k8s.io/v1," in agent.logs()
    )
