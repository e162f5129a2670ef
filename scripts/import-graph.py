#!/usr/bin/env python3
"""The import graph of gpuscope's own modules: how many, on how many levels, and every
import circle, as issue #22 measures the shape of the house.

`gpuscope.agent` and `gpuscope.exporters` are symbolic links to the top-level `agent/` and
`exporters/` folders, which a generic import-graph tool cannot follow (it sees 2 of the
~400 imports). This reads those folders under their import names instead. Every import
counts, also one inside a function or under `if TYPE_CHECKING:` (a lazy import that closes
a circle is still a circle: the modules cannot be understood apart); `from X import name`
counts as an import of the module `X.name` where that is a module, else of `X`.

    python3 scripts/import-graph.py            # figures and circles
    python3 scripts/import-graph.py --json     # the same, for a script
    python3 scripts/import-graph.py --root DIR # another checkout

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    parser.add_argument("--json", action="store_true", help="one JSON object")
    args = parser.parse_args(argv)
    try:
        figures = measure(args.root)
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
