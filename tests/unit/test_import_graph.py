"""scripts/import-graph.py, the measure of #22: it reads the linked folders under their
import names, counts lazy and TYPE_CHECKING imports, finds every circle and the levels."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import ModuleType

from tests.support import REPO

SCRIPT = REPO / "scripts" / "import-graph.py"


def load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("import_graph", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_lazy_and_type_checking_imports_close_circles(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "gpuscope/__init__.py": "",
            "agent/__init__.py": "",
            "agent/base.py": "import os\n",
            "agent/a.py": "from gpuscope.agent.base import x\nfrom . import b\n",
            "agent/b.py": "def f():\n    from gpuscope.agent import a\n",
            "agent/sub/__init__.py": "",
            "agent/sub/c.py": (
                "from typing import TYPE_CHECKING\n"
                "if TYPE_CHECKING:\n    from ..a import A\n"
                "from gpuscope.exporters import view\n"
            ),
            "exporters/__init__.py": "",
            "exporters/view.py": "import gpuscope.agent.sub.c\nimport gpuscope\n",
        },
    )
    figures = load().measure(root)
    assert figures["modules"] == 9
    # a->base, a->b, b->a, c->a, c->view, view->c
    assert figures["imports"] == 6
    assert figures["circles"] == [
        {
            "modules": ["gpuscope.agent.a", "gpuscope.agent.b"],
            "imports": [
                "gpuscope.agent.a -> gpuscope.agent.b",
                "gpuscope.agent.b -> gpuscope.agent.a",
            ],
        },
        {
            "modules": ["gpuscope.agent.sub.c", "gpuscope.exporters.view"],
            "imports": [
                "gpuscope.agent.sub.c -> gpuscope.exporters.view",
                "gpuscope.exporters.view -> gpuscope.agent.sub.c",
            ],
        },
    ]
    assert figures["levels"] == 3  # base; the a-b circle; the c-view circle


def test_levels_of_a_chain_without_circles(tmp_path: Path) -> None:
    root = tree(
        tmp_path,
        {
            "agent/one.py": "",
            "agent/two.py": "from gpuscope.agent import one\n",
            "agent/three.py": "from gpuscope.agent import two, one\n",
            "exporters/four.py": "from gpuscope.agent.three import name\n",
        },
    )
    figures = load().measure(root)
    assert (figures["modules"], figures["imports"], figures["levels"]) == (4, 4, 4)
    assert figures["circles"] == []


def test_the_script_measures_this_checkout() -> None:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), "--json"], capture_output=True, text=True, check=True
    ).stdout
    figures = json.loads(out)
    assert figures["modules"] > 100 and figures["imports"] > 300, figures
    text = subprocess.run(
        [sys.executable, str(SCRIPT)], capture_output=True, text=True, check=True
    ).stdout
    assert text.startswith(f"{figures['modules']} modules, {figures['imports']} imports, ")


def test_a_file_that_does_not_parse_is_one_line_and_exit_2(tmp_path: Path) -> None:
    tree(tmp_path, {"agent/broken.py": "def (:\n"})
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--root", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("import-graph: ") and len(done.stderr.splitlines()) == 1
