"""Fixtures of the end-to-end tier: the simulated GPU node the agent runs on."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.doubles.fakeamdsmi.control import FakeAmdSmi
from tests.doubles.fakeamdsmi.control import ensure_built as ensure_amd_built
from tests.doubles.fakenvml.control import FakeNvml
from tests.doubles.simnode import SimNode


@pytest.fixture
def sim_node(fake_lib: Path, tmp_path: Path) -> Iterator[Callable[..., SimNode]]:
    """`sim_node(node_name="sim-node-1", *, now=None, dra_versions=("v1",), amd=None,
    sysfs=None)`: a SimNode (tests/doubles/simnode.py) on a fresh `dgx-h100` fake NVML
    (`node.fake`; frozen at `now`, else on real time), its API server serving `dra_versions`
    of resource.k8s.io, closed at teardown. With `amd` a fakeamdsmi profile (`mi300x`,
    `mi300x-cpx`, `mi250x`...), an AMD node on the fake AMD SMI instead (its clock following
    real time; `sysfs`: where its partitions' devices go, default an overlay of the host's).
    Needs root (cgroups): mark the test `root`. Request it after `agent_process`, so that the
    node goes before the agents are stopped."""
    with contextlib.ExitStack() as nodes:

        def start(
            node_name: str = "sim-node-1",
            *,
            now: float | None = None,
            dra_versions: tuple[str, ...] = ("v1",),
            amd: str | None = None,
            sysfs: Path | None = None,
        ) -> SimNode:
            fake: FakeNvml | FakeAmdSmi
            if amd is not None:
                ensure_amd_built()
                fake = FakeAmdSmi(amd, tmp_path / f"{node_name}.amd-state", now=time.time())
            else:
                fake = FakeNvml("dgx-h100", tmp_path / f"{node_name}.state", now=now)
            node = SimNode(
                fake, tmp_path / node_name, node_name, dra_versions=dra_versions, sysfs=sysfs
            )
            return nodes.enter_context(node)

        yield start
