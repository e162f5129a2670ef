"""The suite's own rules: the root requirement (skip, or fail with GPUSCOPE_REQUIRE_ROOT=1) and
which markers each tier's modules carry (tests/README.md)."""

from __future__ import annotations

import ast
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from tests import conftest
from tests.support import REPO, REQUIRE_ROOT_ENV, require_root

TESTS = REPO / "tests"
TIER_MARKERS = {
    "kernel": {"kernel"},
    "e2e": {"e2e"},
    "image": {"e2e"},
}  # at least these, module-wide
NOT_IN = ("unit", "integration", "deploy")  # no root, kernel or e2e marker, and no uid checks


def test_root_runs_root_only_tests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setenv(REQUIRE_ROOT_ENV, "1")
    require_root("cgroups")  # returns: the test runs


def test_without_root_they_skip_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv(REQUIRE_ROOT_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"^needs root: cgroups$"):
        require_root("cgroups")
    monkeypatch.setenv(REQUIRE_ROOT_ENV, "0")
    with pytest.raises(pytest.skip.Exception):
        require_root("cgroups")


def test_without_root_they_fail_when_root_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setenv(REQUIRE_ROOT_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=r"needs root: cgroups .*forbids skipping"):
        require_root("cgroups")


def _item(*marks: pytest.MarkDecorator) -> pytest.Item:
    by_name = {m.mark.name: m.mark for m in marks}
    return SimpleNamespace(get_closest_marker=by_name.get)  # type: ignore[return-value]


def test_the_root_marker_is_checked_at_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.delenv(REQUIRE_ROOT_ENV, raising=False)
    conftest.pytest_runtest_setup(_item(pytest.mark.slow))  # unmarked: runs
    with pytest.raises(pytest.skip.Exception, match=r"^needs root: BPF$"):
        conftest.pytest_runtest_setup(_item(pytest.mark.root(reason="BPF")))
    monkeypatch.setenv(REQUIRE_ROOT_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match="needs root: BPF"):
        conftest.pytest_runtest_setup(_item(pytest.mark.root(reason="BPF")))


def module_markers(path: Path) -> set[str]:
    """The names in a module's top-level `pytestmark = pytest.mark.x` or `[...]`."""
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets
        ):
            return {
                n.attr
                for n in ast.walk(node.value)
                if isinstance(n, ast.Attribute)
                and isinstance(n.value, ast.Attribute)
                and n.value.attr == "mark"
            }
    return set()


def test_tier_folders_carry_their_markers() -> None:
    for tier, required in TIER_MARKERS.items():
        modules = sorted((TESTS / tier).rglob("test_*.py"))
        assert modules, tier
        for path in modules:
            missing = required - module_markers(path)
            assert not missing, f"{path.relative_to(REPO)} lacks pytestmark {missing}"
    for tier in NOT_IN:
        for path in sorted((TESTS / tier).rglob("test_*.py")):
            if path == Path(__file__):
                continue
            text = path.read_text()
            found = module_markers(path) & {"root", "kernel", "e2e"}
            assert not found, f"{path.relative_to(REPO)} is marked {found}: not a {tier} test"
            for mark in ("mark.root", "mark.kernel", "mark.e2e", "geteuid"):
                assert mark not in text, f"{path.relative_to(REPO)} uses {mark}"


def test_root_is_checked_only_through_the_marker() -> None:
    for path in sorted(TESTS.rglob("test_*.py")):
        if path != Path(__file__):
            assert "geteuid" not in path.read_text(), f"{path.relative_to(REPO)}: use the marker"
