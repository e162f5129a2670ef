#!/usr/bin/env python3
"""The import graph of gpuscope's own modules: how many, on how many levels, and every
import circle, as issue #22 measures the shape of the house.

`gpuscope.agent` and `gpuscope.exporters` are symbolic links to the top-level `agent/` and
`exporters/` folders, which a generic import-graph tool cannot follow (it sees 2 of the
~400 imports). This reads those folders under their import names instead. Every import
counts, also one inside a function or under `if TYPE_CHECKING:` (a lazy import that closes
a circle is still a circle: the modules cannot be understood apart); `from X import name`
counts as an import of the module `X.name` where that is a module, else of `X`.

    python3 scripts/import-graph.py            # figures, circles, upward imports
    python3 scripts/import-graph.py --json     # the same, for a script
    python3 scripts/import-graph.py --root DIR # another checkout

Layers: `LAYERS` below is the house's layer table; tests/unit/test_layers.py fails on any
import from a lower layer to a higher one and on any circle.

Levels: a module that imports none of the others is on level 1; any other is one level
above the highest module it imports (a circle counts as one module). Exit status 0,
whatever the graph; 2 when a file does not parse.
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

PACKAGES = {"agent": "gpuscope.agent", "exporters": "gpuscope.exporters"}

# The layers of the house, lowest first (docs/architecture.md, "Layers"). A module may import
# its own layer and those below. The base layer lists single modules; every other layer
# lists rooms (a package and everything in it), so a new room is in no layer until placed. Data
# flows up: sources read the world into records, stages enrich them, exporters render them,
# the server serves the rendering, the app wires it all and is imported by nothing.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",  # pure helpers with no knowledge of any part
        (
            "gpuscope",
            "gpuscope.agent",
            "gpuscope.agent.bounded",
            "gpuscope.agent.clock",
            "gpuscope.agent.codecache",
            "gpuscope.agent.hostfs",
            "gpuscope.agent.logs",
            "gpuscope.agent.name_patterns",
            "gpuscope.agent.pci",
        ),
    ),
    ("runtime", ("gpuscope.agent.runtime",)),  # source contract, guarded runs, declarations
    (
        "sources",
        (
            "gpuscope.agent.accelerators",
            "gpuscope.agent.bpf",
            "gpuscope.agent.gpu",
            "gpuscope.agent.amd",
            "gpuscope.agent.net",
            "gpuscope.agent.k8s",
        ),
    ),
    ("stages", ("gpuscope.agent.attribution",)),
    ("exporters", ("gpuscope.exporters",)),
    ("serve", ("gpuscope.agent.serve",)),
    (
        "app",  # entry points, configuration, the registry, wiring
        (
            "gpuscope.agent.app",
            "gpuscope.agent.labels",
            "gpuscope.agent.check",
            "gpuscope.__main__",
        ),
    ),
)


def layer_of(module: str) -> tuple[int, str] | None:
    """(rank, layer name) of a module: the base module it is, else the room it is in."""
    best: tuple[int, int, str] | None = None
    for rank, (layer, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            named = module == prefix or (rank > 0 and module.startswith(prefix + "."))
            if named and (best is None or len(prefix) > best[1]):
                best = (rank, len(prefix), layer)
    return None if best is None else (best[0], best[2])


def modules_of(root: Path) -> dict[str, Path]:
    """Import name -> file, for every module under the linked folders and gpuscope/."""
    found: dict[str, Path] = {}
    for folder, package in PACKAGES.items():
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join([package, *parts])] = path
    for path in sorted((root / "gpuscope").glob("*.py")):
        found["gpuscope" if path.stem == "__init__" else f"gpuscope.{path.stem}"] = path
    return found


def imports_of(name: str, path: Path, known: Mapping[str, Path]) -> set[str]:
    """The known modules `name` (at `path`) imports, itself and gpuscope/__init__ left out
    (every module imports the latter by being in the package)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    wanted: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            wanted += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            wanted += [f"{base}.{alias.name}" for alias in node.names]
    targets = set()
    for target in wanted:
        while target and target not in known:
            target = target.rpartition(".")[0]
        if target and target not in (name, "gpuscope"):
            targets.add(target)
    return targets


def circles_of(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """Strongly connected components (Tarjan, iterative), each sorted; singletons too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                found.append(sorted(component))
    return found


def levels_of(graph: Mapping[str, set[str]], components: Iterable[list[str]]) -> dict[str, int]:
    """Each module's level (see the module docstring); Tarjan yields components in reverse
    topological order, so each one's imports are levelled before it."""
    component_of: dict[str, int] = {}
    level: dict[int, int] = {}
    for number, component in enumerate(components):
        for member in component:
            component_of[member] = number
        below = [
            level[component_of[target]]
            for member in component
            for target in graph[member]
            if component_of.get(target, number) != number
        ]
        level[number] = 1 + max(below, default=0)
    return {module: level[number] for module, number in component_of.items()}


def measure(root: Path) -> dict[str, object]:
    known = modules_of(root)
    graph = {name: imports_of(name, path, known) for name, path in known.items()}
    components = circles_of(graph)
    levels = levels_of(graph, components)
    circles = [
        {
            "modules": component,
            "imports": sorted(
                f"{member} -> {target}"
                for member in component
                for target in graph[member]
                if target in component
            ),
        }
        for component in components
        if len(component) > 1
    ]
    return {
        "modules": len(graph),
        "imports": sum(len(targets) for targets in graph.values()),
        "levels": max(levels.values(), default=0),
        "circles": circles,
    }


def check_layers(root: Path) -> dict[str, list[str]]:
    """Imports that point from a lower layer to a higher one, and modules in no layer."""
    known = modules_of(root)
    upward, unplaced = [], []
    for name, path in sorted(known.items()):
        mine = layer_of(name)
        if mine is None:
            unplaced.append(name)
            continue
        for target in sorted(imports_of(name, path, known)):
            theirs = layer_of(target)
            if theirs is not None and theirs[0] > mine[0]:
                upward.append(f"{name} ({mine[1]}) -> {target} ({theirs[1]})")
    return {"upward": upward, "unplaced": unplaced}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    try:
        figures = measure(args.root)
        figures.update(check_layers(args.root))
    except (SyntaxError, OSError) as exc:
        print(f"import-graph: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(figures, indent=2))
        return 0
    circles = figures["circles"]
    assert isinstance(circles, list)
    print(
        f"{figures['modules']} modules, {figures['imports']} imports, "
        f"{figures['levels']} levels, {len(circles)} import circles"
    )
    for circle in circles:
        print(f"circle of {len(circle['modules'])}:")
        for edge in circle["imports"]:
            print(f"  {edge.replace('gpuscope.', '')}")
    for key, title in (("upward", "upward imports"), ("unplaced", "modules in no layer")):
        found = figures[key]
        assert isinstance(found, list)
        print(f"{len(found)} {title}")
        for line in found:
            print(f"  {line.replace('gpuscope.', '')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
