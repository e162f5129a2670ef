"""`gpuscope check` runs where no checkout is (the agent's image, a lent GPU machine), so what it
knows of the deployment and of the agent is its own: these keep it true."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from gpuscope.agent.check.process_path import DAEMONSET_CAPABILITIES
from tests.support import REPO
from tests.support.manifests import capabilities, render

CHECK = REPO / "agent" / "check"


def test_the_check_drops_to_the_capabilities_the_daemonset_adds() -> None:
    manifest = [c.removeprefix("CAP_").lower() for c in capabilities(render("base"))]
    assert sorted(DAEMONSET_CAPABILITIES) == sorted(manifest)


def test_the_check_reads_the_agent_through_public_names_only() -> None:
    """No `obj._private` of another object: what the check needs, the agent exposes. ctypes'
    own `_fields_` is the one underscore name a structure's layout is read by."""
    found = []
    for path in sorted(CHECK.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_"):
                continue
            if node.attr.startswith("__") or node.attr == "_fields_":
                continue
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            found.append(f"{path.relative_to(REPO)}:{node.lineno}: .{node.attr}")
    assert not found, "\n".join(found)


def test_the_check_package_imports_only_what_a_gpu_machine_has() -> None:
    """nvidia-ml-py and prometheus-client besides the standard library and gpuscope: no
    module of agent/check imports anything else at its top level."""
    allowed = {"gpuscope", "pynvml", "prometheus_client", "__future__"}
    found = []
    for path in sorted(CHECK.glob("*.py")):
        for node in ast.parse(path.read_text()).body:
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names = [node.module]
            for name in names:
                top = name.split(".")[0]
                if top not in allowed and top not in sys.stdlib_module_names:
                    found.append(f"{Path(path).name}: {name}")
    assert not found, found
