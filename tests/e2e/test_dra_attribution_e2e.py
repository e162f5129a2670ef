"""End to end on a simulated node whose GPUs are allocated through DRA: the real `gpuscope`
process (fake NVML) with the `dra` collector, the API server double serving the pod's
ResourceClaim (made from a template) and NVIDIA's driver's ResourceSlice, the kubelet double
answering the claim as DynamicResources with the driver's CDI names (no GPU UUID in them),
and the pod a real process in a kubelet-style cgroup, registered with NVML on its GPU."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from gpuscope.agent.k8s.podresources.v1 import api_pb2
from tests.doubles.kube_apiserver import (
    claim_container,
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
