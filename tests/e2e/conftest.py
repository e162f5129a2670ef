"""Fixtures of the end-to-end tier: the simulated GPU node the agent runs on."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.doubles.fakenvml.control import FakeNvml
from tests.doubles.simnode import SimNode


@pytest.fixture
def sim_node(fake_lib: Path, tmp_path: Path) -> Iterator[Callable[..., SimNode]]:
    """`sim_node(node_name="sim-node-1", *, now=None, dra_versions=("v1",))`: a SimNode
    (tests/doubles/simnode.py) on a fresh `dgx-h100` fake NVML (`node.fake`; frozen at `now`,
    else on real time), its API server serving `dra_versions` of resource.k8s.io, closed
    at teardown. Needs root (cgroups): mark the test `root`. Request it after
    `agent_process`, so that the node goes before the agents are stopped."""
    with contextlib.ExitStack() as nodes:

        def start(
            node_name: str = "sim-node-1",
            *,
            now: float | None = None,
            dra_versions: tuple[str, ...] = ("v1",),
        ) -> SimNode:
            fake = FakeNvml("dgx-h100", tmp_path / f"{node_name}.state", now=now)
            node = SimNode(fake, tmp_path / node_name, node_name, dra_versions=dra_versions)
            return nodes.enter_context(node)

        yield start
