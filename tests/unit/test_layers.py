"""The house's layers hold: on a copy of the checkout with the gpuscope/agent and
gpuscope/exporters links resolved into real folders, no module imports from a layer above
its own and no import circle exists (docs/architecture.md, "Layers"). The table is
`LAYERS` in scripts/import-graph.py; a new room must be placed in it."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import REPO
from tests.unit.test_import_graph import load, tree


@pytest.fixture(scope="module")
def graph() -> ModuleType:
    return load()


def resolved_copy(root: Path) -> Path:
    """The package as an installed wheel has it: the links followed into real folders."""
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    for folder in ("agent", "exporters"):
        shutil.copytree(REPO / "gpuscope" / folder, root / folder, symlinks=False, ignore=skip)
        assert not (root / folder).is_symlink()
    (root / "gpuscope").mkdir()
    for path in (REPO / "gpuscope").glob("*.py"):
        shutil.copy(path, root / "gpuscope" / path.name)
    return root


def test_no_module_imports_from_a_layer_above_it(graph: ModuleType, tmp_path: Path) -> None:
    report = graph.check_layers(resolved_copy(tmp_path))
    assert report["unplaced"] == [], "place these modules in LAYERS (scripts/import-graph.py)"
    assert report["upward"] == []
    figures = graph.measure(tmp_path)
    assert figures["modules"] > 100 and figures["imports"] > 300  # the copy is the real tree


def test_the_checkout_has_no_import_circle(graph: ModuleType, tmp_path: Path) -> None:
    figures = graph.measure(resolved_copy(tmp_path))
    assert figures["circles"] == []


def test_the_top_of_agent_is_at_most_eight_modules() -> None:
    """Everything else lives in a room named for its role (docs/architecture.md)."""
    top = sorted(p.name for p in (REPO / "agent").glob("*.py"))
    assert len(top) <= 8, top


def test_an_upward_import_and_an_unplaced_module_are_reported(
    graph: ModuleType, tmp_path: Path
) -> None:
    root = tree(
        tmp_path,
        {
            "gpuscope/__init__.py": "",
            "agent/__init__.py": "",
            "agent/clock.py": "from gpuscope.agent.runtime.sources import Source\n",
            "agent/runtime/__init__.py": "",
            "agent/runtime/sources.py": "def f():\n    from gpuscope.agent.app import config\n",
            "agent/app/__init__.py": "",
            "agent/app/config.py": "from gpuscope.exporters.prometheus import render\n",
            "agent/attic/__init__.py": "",
            "exporters/__init__.py": "",
            "exporters/prometheus/__init__.py": "",
            "exporters/prometheus/render.py": "from gpuscope.agent.clock import Clock\n",
        },
    )
    report = graph.check_layers(root)
    assert report["upward"] == [
        "gpuscope.agent.clock (base) -> gpuscope.agent.runtime.sources (runtime)",
        "gpuscope.agent.runtime.sources (runtime) -> gpuscope.agent.app.config (app)",
    ]
    assert report["unplaced"] == ["gpuscope.agent.attic"]
