"""Fail when modules import each other in a loop; print each loop on one line.

    python scripts/check_import_cycles.py [--type-checking] [PACKAGE ...]
    # `make lint` runs it with --type-checking

The packages default to import-linter's ``root_packages`` in ``pyproject.toml``; run it
from the repository root (the current directory comes first on ``sys.path``).

A run-time import is a module-level or a function-level one: a function-level import
runs the first time its function is called, so a loop it closes is a loop all the same,
only hidden, and which name exists yet depends on the order modules happen to load in.
An import under ``if TYPE_CHECKING:`` never runs (the project's ``from __future__ import
annotations`` keeps every annotation a string), so a loop closed only by one ties two
modules' types, not their loading; the layering contracts of import-linter still count it.
A loop through a package's ``__init__`` counts too.

With ``--type-checking`` those imports count as well: two modules whose types name each
other are one concept split in two, or a pair that wants a small module both can import
(a reader cannot understand either alone). ``make lint`` runs it so.
"""

from __future__ import annotations

import itertools
import os
import sys
import tomllib
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import grimp

Graph = Mapping[str, Sequence[str]]


def module_imports(
    packages: Sequence[str], *, type_checking: bool = False
) -> tuple[grimp.ImportGraph, dict[str, list[str]]]:
    """The import graph of ``packages`` (theirs only) and each module's imports.

    Imports under ``if TYPE_CHECKING:`` are left out unless ``type_checking``.
    """
    graph = grimp.build_graph(*packages, exclude_type_checking_imports=not type_checking, cache_dir=None)
    imports = {module: sorted(graph.find_modules_directly_imported_by(module)) for module in sorted(graph.modules)}
    return graph, imports


def tangles(imports: Graph) -> Iterator[list[str]]:
    """Each set of two or more modules that all reach each other (Tarjan's strongly connected components)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(module: str) -> Iterator[list[str]]:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in imports[module]:
            if imported not in index:
                yield from visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            tangle: list[str] = []
            while not tangle or tangle[-1] != module:
                tangle.append(stack.pop())
                on_stack.discard(tangle[-1])
            if len(tangle) > 1:
                yield sorted(tangle)

    for module in imports:
        if module not in index:
            yield from visit(module)


def shortest_loop(imports: Graph, start: str, within: set[str]) -> list[str]:
    """The shortest chain of imports from ``start`` back to itself, through ``within`` only."""
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        module = queue.popleft()
        for imported in imports[module]:
            if imported == start:
                chain = [module]
                while chain[-1] != start:
                    chain.append(came_from[chain[-1]])
                return [start, *reversed(chain[:-1]), start]
            if imported in within and imported not in came_from:
                came_from[imported] = module
                queue.append(imported)
    raise ValueError(f"{start} is in no loop")


def describe_loop(graph: grimp.ImportGraph, loop: Sequence[str], tangle: Sequence[str]) -> str:
    """One line: the loop, each import with the line that makes it, and the other modules tied in."""
    steps = []
    for importer, imported in itertools.pairwise(loop):
        line = min(detail["line_number"] for detail in graph.get_import_details(importer=importer, imported=imported))
        steps.append(f"{importer} -> {imported} ({source_of(importer)}:{line})")
    others = sorted(set(tangle) - set(loop))
    also = f"; also in this loop: {', '.join(others)}" if others else ""
    return f"import cycle: {', '.join(steps)}{also}"


def source_of(module: str) -> Path:
    """The file of ``module``, relative to the current directory."""
    path = Path(*module.split("."))
    return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")


def root_packages() -> list[str]:
    """import-linter's ``root_packages``, read from ``pyproject.toml`` in the current directory."""
    with open("pyproject.toml", "rb") as file:
        return list(tomllib.load(file)["tool"]["importlinter"]["root_packages"])


def main(argv: Sequence[str]) -> int:
    """Print each import cycle of the packages on one line; 1 if there is any, else 0."""
    sys.path.insert(0, os.getcwd())
    type_checking = "--type-checking" in argv
    packages = [arg for arg in argv if arg != "--type-checking"] or root_packages()
    graph, imports = module_imports(packages, type_checking=type_checking)
    kind = "import cycle" if type_checking else "run-time import cycle"
    scope = " (type-checking imports included)" if type_checking else ""
    found = 0
    for tangle in tangles(imports):
        found += 1
        print(describe_loop(graph, shortest_loop(imports, tangle[0], set(tangle)), tangle))
    if found:
        print(f"{found} {kind}(s){scope} in {', '.join(packages)}: move what both sides share into a module")
        print("of its own, or pass the dependency in.")
        return 1
    print(f"No {kind}{scope} in {', '.join(packages)}.")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
