"""Folders named by job: no two product folders import each other, and no two modules share a name.

A folder is a package directory of the product (``transforms/io``, ``loaders``, ``tools`` ...); an
edge A -> B is an import in a module of A of a module of B. Cycles of two are what make a folder
impossible to read or move on its own; a shared file name hides which of two jobs a traceback means.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

from tests.helpers import PACKAGES, REPO


def _modules() -> dict[str, Path]:
    """{dotted name under lidarshard: file} of every product module."""
    found = {}
    for top in PACKAGES:
        for path in sorted((REPO / top).rglob("*.py")):
            rel = path.relative_to(REPO / top).with_suffix("")
            parts = [] if top == "lidarshard" else [top]
            parts += [p for p in rel.parts if p != "__init__"]
            found[".".join(["lidarshard", *parts])] = path
    return found


def _folder(module: str, modules: dict[str, Path]) -> str:
    path = modules[module]
    return str(path.parent.relative_to(REPO))


def _edges() -> dict[tuple[str, str], list[str]]:
    """{(folder A, folder B): [A's module -> imported module, ...]} for A != B."""
    modules = _modules()
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    for name, path in modules.items():
        here = _folder(name, modules)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
            for target in targets:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != "lidarshard" and _folder(target, modules) != here:
                    edges[(here, _folder(target, modules))].append(f"{name} -> {target}")
    return edges


def test_no_two_product_folders_import_each_other() -> None:
    edges = _edges()
    cycles = {
        tuple(sorted((a, b))): edges[(a, b)][:2] + edges[(b, a)][:2] for a, b in edges if (b, a) in edges
    }
    assert not cycles, f"folders importing each other: {cycles}"


def test_the_walk_sees_the_folders() -> None:
    edges = _edges()
    assert ("loaders", "transforms/io") in edges and ("tools", "loaders") in edges


def test_no_two_modules_share_a_file_name() -> None:
    names: dict[str, list[str]] = defaultdict(list)
    for path in _modules().values():
        if path.name != "__init__.py":
            names[path.name].append(str(path.relative_to(REPO)))
    assert not {n: p for n, p in names.items() if len(p) > 1}


def test_no_product_module_is_over_400_lines() -> None:
    """Small surfaces (STYLE.md 8): a module past 400 lines holds more than one job; split it by job."""
    long = {
        str(p.relative_to(REPO)): n
        for p in _modules().values()
        if (n := len(p.read_text().splitlines())) > 400
    }
    assert not long, f"modules over 400 lines: {long}"
