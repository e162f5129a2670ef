"""End to end on a simulated 8-GPU node: the real `gpuscope` process (fake NVML, real eBPF
probes), a kubelet PodResources double over gRPC, the Kubernetes API double through
lightkube, and pods that are real processes in kubelet-style cgroups, registered with NVML
as GPU processes and sending real TCP traffic to each other."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from tests.doubles.simnode import (
    EVAL_POD,
    GIB,
    NB_ALICE_POD,
    NB_BOB_POD,
    TRAINING_TRAFFIC,
    WORKER_POD,
    ContainerSpec,
    SimNode,
    SimPod,
    training_scenario,
)
from tests.support import AgentProcess, sim_node_args, wait_for
from tests.support.promtext import Exposition

pytestmark = [
    pytest.mark.slow,
    pytest.mark.e2e,
    pytest.mark.kernel,
    pytest.mark.root(reason="the simulated node makes cgroups, the agent loads BPF"),
]


@pytest.fixture
def cluster(
    agent_process: Callable[..., AgentProcess], sim_node: Callable[..., SimNode]
) -> Iterator[tuple[SimNode, AgentProcess]]:
    node = sim_node()
    agent = agent_process(
        "--collectors", "gpu,net,kubelet,pods", *sim_node_args(node), "--net-prune-grace", "1",
        env=node.fake.env(),
    )  # fmt: skip
    yield node, agent


def settled(agent: AgentProcess, check: Callable[[Exposition], bool], what: str) -> Exposition:
    """Scrape until `check` holds (the kubelet is polled every second, pods are watched)."""
    seen: list[Exposition] = []

    def ok() -> bool:
        seen.append(agent.scrape())
        return check(seen[-1])

    try:
        wait_for(ok, timeout=15, what=what)
    except AssertionError:
        last = seen[-1] if seen else None
        interesting = (
            "gpuscope_collector_success",
            "gpuscope_gpu_allocation_info",
            "gpuscope_pod_gpu_memory_bytes",
            "gpuscope_pod_network_transmit_bytes_total",
        )
        lines = [
            f"{name}{dict(labels)} {value}"
            for (name, labels), value in (last.samples.items() if last else ())
            if name in interesting
        ]
        raise AssertionError(
            f"timed out waiting for {what}; last scrape:\n" + "\n".join(lines) + agent.logs()
        ) from None
    return seen[-1]


def split(key: str) -> tuple[str, str]:
    namespace, pod = key.split("/")
    return namespace, pod


def test_every_series_names_its_pod_and_workload_with_exact_bytes(cluster) -> None:
    node, agent = cluster
    m = agent.scrape()
    assert m.value("gpuscope_collector_success", collector="net") == 1, agent.logs()
    pods = training_scenario(node)
    rogue = node.add_pod(
        "ml-team", "sneaky-0",
        containers=[ContainerSpec("main", gpus=(), use_gpus=[7], gpu_memory_bytes=3 * GIB)],
    )  # fmt: skip
    host_pid = node.host_process(7, 2 * GIB)
    node.wait_traffic()
    m = settled(agent, attributed, "allocations, GPU processes and traffic attributed")
    check_gpu_holders(m)
    check_pod_gpu_usage(m, pods)
    check_unallocated(m)
    check_network(m, node)
    info = {k["pod"]: k for k, _ in m.rows("gpuscope_pod_info")}
    assert info[split(WORKER_POD)[1]]["replica"] == "worker-0"
    assert set(info) == {split(p)[1] for p in (WORKER_POD, EVAL_POD, NB_ALICE_POD, NB_BOB_POD)} | {
        "sneaky-0"
    }
    node.remove_host_process(host_pid)
    del rogue


def attributed(m: Exposition) -> bool:
    """The training scenario fully attributed: 8 allocations, 10 GPU processes (the
    scenario's, the rogue pod's and the host's), every payload's exact bytes."""
    expected_tx = {src: n for (src, _dst), n in TRAINING_TRAFFIC.items()}
    tx = {
        f"{k['namespace']}/{k['pod']}": v
        for k, v in m.rows("gpuscope_pod_network_transmit_bytes_total", protocol="tcp")
    }
    return (
        len(m.series("gpuscope_gpu_allocation_info")) == 8
        and len(m.series("gpuscope_pod_gpu_memory_bytes")) == 10
        and all(tx.get(src) == n for src, n in expected_tx.items())
    )


def check_gpu_holders(m: Exposition) -> None:
    """Who holds each GPU, with the workload resolved from labels and owners."""
    holders = {
        (k["gpu"], k["namespace"], k["pod"], k["container"], k["workload_kind"], k["workload"])
        for k, _ in m.rows("gpuscope_gpu_allocation_info")
    }
    assert holders == {
        *((str(g), *split(WORKER_POD), "pytorch", "PyTorchJob", "llama-ft") for g in range(4)),
        *((str(g), *split(EVAL_POD), "evaluator", "Job", "eval-nightly") for g in (4, 5)),
        ("6", *split(NB_ALICE_POD), "notebook", "Deployment", "nb-alice"),
        ("6", *split(NB_BOB_POD), "notebook", "Deployment", "nb-bob"),
    }
    allocated = {k["gpu"]: v for k, v in m.rows("gpuscope_gpu_allocated")}
    assert allocated == {str(g): float(g != 7) for g in range(8)}


def check_pod_gpu_usage(m: Exposition, pods: dict[str, SimPod]) -> None:
    """Per-pod GPU memory and utilization, the time-sliced GPU 6 split between two pods."""
    memory = {(k["gpu"], k["pod"]): v for k, v in m.rows("gpuscope_pod_gpu_memory_bytes")}
    assert memory == {
        **{(str(g), split(WORKER_POD)[1]): 71.0 * GIB for g in range(4)},
        **{(str(g), split(EVAL_POD)[1]): 38.0 * GIB for g in (4, 5)},
        ("6", split(NB_ALICE_POD)[1]): 9.0 * GIB,
        ("6", split(NB_BOB_POD)[1]): 6.0 * GIB,
        ("7", "sneaky-0"): 3.0 * GIB,
        ("7", ""): 2.0 * GIB,
    }
    util = {(k["gpu"], k["pod"]): v for k, v in m.rows("gpuscope_pod_gpu_utilization_ratio")}
    assert util[("0", split(WORKER_POD)[1])] == pytest.approx(0.93)
    assert util[("6", split(NB_ALICE_POD)[1])] == pytest.approx(0.12)
    assert util[("6", split(NB_BOB_POD)[1])] == 0
    worker_labels = next(k for k, _ in m.rows("gpuscope_pod_gpu_memory_bytes", gpu="0"))
    assert worker_labels["pod_uid"] == pods["worker"].uid
    assert (worker_labels["namespace"], worker_labels["workload_kind"]) == ("ml-team", "PyTorchJob")


def check_unallocated(m: Exposition) -> None:
    """The rogue pod (no GPU requested) and the host process show as unallocated memory."""
    unallocated = {k["gpu"]: v for k, v in m.rows("gpuscope_gpu_unallocated_memory_bytes")}
    assert unallocated == {str(g): 0.0 for g in range(7)} | {"7": 5.0 * GIB}


def check_network(m: Exposition, node: SimNode) -> None:
    """Network series carry the names; bytes exact, both directions."""
    for (src, _dst), nbytes in TRAINING_TRAFFIC.items():
        ns, pod = split(src)
        sent = m.rows("gpuscope_pod_network_transmit_bytes_total", pod=pod, protocol="tcp")
        assert [(k["namespace"], v) for k, v in sent] == [(ns, nbytes)]
    received = {
        k["pod"]: v
        for k, v in m.rows("gpuscope_pod_network_receive_bytes_total", protocol="tcp")
        if k["pod"]
    }
    for dst in (EVAL_POD, NB_ALICE_POD):
        assert received[split(dst)[1]] == node.received(dst)
    ((eval_tx, _),) = m.rows("gpuscope_pod_network_transmit_bytes_total", pod=split(EVAL_POD)[1])
    assert (eval_tx["workload_kind"], eval_tx["workload"]) == ("Job", "eval-nightly")


def test_pod_deletion_and_kubelet_outage(cluster) -> None:
    node, agent = cluster
    training_scenario(node)
    node.wait_traffic()
    settled(
        agent,
        lambda m: (
            len(m.series("gpuscope_gpu_allocation_info")) == 8
            and bool(m.series("gpuscope_pod_network_transmit_bytes_total", pod=split(EVAL_POD)[1]))
        ),
        "scenario attributed",
    )

    node.remove_pod(*split(EVAL_POD))
    gone = settled(
        agent,
        lambda m: not any(split(EVAL_POD)[1] in dict(k).get("pod", "") for (_, k) in m.samples),
        "the deleted pod's series gone (one kubelet poll + the 1 s prune grace)",
    )
    assert gone.value("gpuscope_gpu_allocated", gpu="4") == 0
    assert len(gone.series("gpuscope_gpu_allocation_info")) == 6

    node.kubelet.stop()
    down = settled(
        agent,
        lambda m: m.value("gpuscope_collector_success", collector="kubelet") == 0,
        "kubelet outage reported",
    )
    assert down.series("gpuscope_gpu_allocation_info") == {}
    assert len(down.series("gpuscope_gpu_up")) == 8
    assert len(down.series("gpuscope_pod_gpu_memory_bytes", pod=split(WORKER_POD)[1])) == 4
    node.kubelet.start()
    settled(
        agent,
        lambda m: (
            len(m.series("gpuscope_gpu_allocation_info")) == 6
            and m.value("gpuscope_collector_success", collector="kubelet") == 1
        ),
        "kubelet recovered on the next poll",
    )
