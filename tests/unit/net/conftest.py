"""Fixtures of the nic, rdma and PCI tests: the generated DGX H100-like sysfs tree
(tests/doubles/make_sysfs.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.doubles.make_sysfs import write_tree


@pytest.fixture(scope="module")
def shared_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tree per test module, read-only: tests that change the tree use `tree`."""
    return write_tree(tmp_path_factory.mktemp("sysfs"))


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A tree of this test's own, to change."""
    return write_tree(tmp_path / "sys")
