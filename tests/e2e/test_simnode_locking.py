"""The simulated node's lock order: the node's lock before the fake NVML's, never the other way.

The demo's workload script once held the fake's lock (`fake.batch()`) while calling
`SimNode.set_usage`, and `SimNode.remove_pod` takes the node's lock, then the fake's: the two
deadlocked. Now a node call from inside `fake.batch()` is refused, and `node.batch()` groups
node and fake changes taking the locks in order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest

from tests.doubles.simnode import GIB, ContainerSpec, SimNode

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.kernel,
    pytest.mark.root(reason="the simulated node makes cgroups"),
]

ROUNDS = 25  # pods added and removed while usage changes
JOIN_S = 180.0  # generous: a deadlock never ends, a slow machine does


class Loop(threading.Thread):
    """Runs `step(i)` until `stop` is set or `rounds` are done; keeps the first error."""

    def __init__(
        self, step: Callable[[int], None], stop: threading.Event, rounds: int | None = None
    ) -> None:
        super().__init__(daemon=True)
        self._step, self._halt, self._rounds = step, stop, rounds
        self.done = 0
        self.error: BaseException | None = None
        self.start()

    def run(self) -> None:
        try:
            while not self._halt.is_set() and (self._rounds is None or self.done < self._rounds):
                self._step(self.done)
                self.done += 1
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e


def test_set_usage_and_remove_pod_run_concurrently_and_finish(
    sim_node: Callable[..., SimNode],
) -> None:
    node = sim_node()
    node.add_pod("serve", "inference", containers=[ContainerSpec("main", gpus=[4], sm_util=10)])
    stop = threading.Event()

    def workload(i: int) -> None:  # the demo's loop: node and fake changes in one write
        with node.batch():
            node.set_usage("serve", "inference", sm_util=i % 100, mem_util=i % 30)
            node.fake.set_utilization(7, (i * 7) % 100)

    def plain_usage(i: int) -> None:
        node.set_usage("serve", "inference", gpu_memory_bytes=(1 + i % 4) * GIB)

    def churn(i: int) -> None:
        node.add_pod("batch", f"job-{i}", containers=[ContainerSpec("main", gpus=[i % 4])])
        node.remove_pod("batch", f"job-{i}")

    loops = [Loop(workload, stop), Loop(plain_usage, stop)]
    churner = Loop(churn, stop, rounds=ROUNDS)
    churner.join(JOIN_S)
    stop.set()
    for t in loops:
        t.join(JOIN_S)
    assert not any(t.is_alive() for t in [churner, *loops]), "deadlocked"
    for t in [churner, *loops]:
        assert t.error is None, repr(t.error)
    assert churner.done == ROUNDS
    assert all(t.done > 0 for t in loops)
    assert list(node.pods) == ["serve/inference"]


def test_a_node_call_inside_the_fakes_batch_is_refused_and_holds_nothing(
    sim_node: Callable[..., SimNode],
) -> None:
    node = sim_node()
    node.add_pod("serve", "inference", containers=[ContainerSpec("main", gpus=[4], sm_util=10)])
    node.add_pod("batch", "job", containers=[ContainerSpec("main", gpus=[0])])
    with pytest.raises(RuntimeError, match="lock"), node.fake.batch():
        node.set_usage("serve", "inference", sm_util=50)
    # Nothing is left held: another thread removes a pod, this one changes usage.
    remover = Loop(lambda _i: node.remove_pod("batch", "job"), threading.Event(), rounds=1)
    remover.join(JOIN_S)
    assert not remover.is_alive() and remover.error is None
    node.set_usage("serve", "inference", sm_util=50)
    assert node.pods["serve/inference"].containers["main"].sm_util == 50
    # Nested the right way round (the node's batch, then the fake's), calls are fine.
    with node.batch(), node.fake.batch():
        node.set_usage("serve", "inference", sm_util=60)
    assert node.pods["serve/inference"].containers["main"].sm_util == 60
