"""Layering: only the Beam layer imports ``apache_beam``; the rest of the package works without it.

The Beam layer is ``lidarshard.transforms.beam`` and the Beam commands: the direct modules of
``lidarshard.pipelines`` other than ``cli`` (the tools under ``lidarshard.tools`` run no pipeline).
"""

from __future__ import annotations

import ast
import pkgutil
import subprocess
import sys

from tests.helpers import REPO


def _modules() -> dict[str, str]:
    """{dotted name: file} of every module of the installed ``lidarshard`` package."""
    import lidarshard.loaders
    import lidarshard.pipelines
    import lidarshard.schemas
    import lidarshard.tools
    import lidarshard.transforms

    found = {"lidarshard": lidarshard.__file__}
    for pkg in (
        lidarshard.loaders,
        lidarshard.pipelines,
        lidarshard.schemas,
        lidarshard.tools,
        lidarshard.transforms,
    ):
        found[pkg.__name__] = pkg.__file__
        for info in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + "."):
            spec = info.module_finder.find_spec(info.name)  # type: ignore[union-attr]
            found[info.name] = spec.origin
    return found


def _beam_layer(name: str) -> bool:
    if name == "lidarshard.transforms.beam" or name.startswith("lidarshard.transforms.beam."):
        return True
    parts = name.split(".")
    return parts[:2] == ["lidarshard", "pipelines"] and len(parts) == 3 and parts[2] != "cli"


def _imports(path: str) -> set[str]:
    """Every module an ``import`` statement in the file names, at any depth (lazy imports too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
            names.update(f"{node.module}.{a.name}" for a in node.names)
    return names


def test_the_module_walk_sees_both_layers() -> None:
    mods = _modules()
    assert "lidarshard.transforms.io.storage" in mods and "lidarshard.loaders.reader" in mods
    assert "lidarshard.transforms.beam.scan_transform" in mods and "lidarshard.tools.validate" in mods
    assert _beam_layer("lidarshard.pipelines.build") and not _beam_layer("lidarshard.tools.report")


def test_no_module_outside_the_beam_layer_imports_beam() -> None:
    """Statically: no import of apache_beam, nor of a Beam-layer module, anywhere in the file."""
    offenders = {}
    modules = _modules()
    for name, path in sorted(modules.items()):
        if _beam_layer(name):
            continue
        bad = sorted(
            m for m in _imports(path) if m.split(".")[0] == "apache_beam" or (m in modules and _beam_layer(m))
        )
        if bad:
            offenders[name] = bad
    assert not offenders, f"outside the Beam layer, these modules import Beam: {offenders}"


def test_importing_every_module_outside_the_beam_layer_loads_no_beam() -> None:
    """Dynamically, in a fresh interpreter: the whole pure side together pulls in no apache_beam."""
    pure = sorted(n for n in _modules() if not _beam_layer(n))
    code = (
        "import importlib, sys\n"
        f"for name in {pure!r}:\n"
        "    importlib.import_module(name)\n"
        "assert 'apache_beam' not in sys.modules, sorted(m for m in sys.modules if 'beam' in m)[:5]\n"
        "print(len(sys.modules))\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_the_contract_imports_only_itself() -> None:
    """``lidarshard.schemas`` is the contract every other folder reads: it imports nothing else of lidarshard."""
    mods = _modules()
    contract = {
        n: p for n, p in mods.items() if n == "lidarshard.schemas" or n.startswith("lidarshard.schemas.")
    }
    assert len(contract) >= 2
    offenders = {
        name: sorted(
            m
            for m in _imports(path)
            if m.split(".")[0] == "lidarshard" and not m.startswith("lidarshard.schemas")
        )
        for name, path in contract.items()
    }
    assert not any(offenders.values()), f"schemas imports beyond itself: {offenders}"


def test_the_planner_and_the_contract_agree_on_variable_count_strategies() -> None:
    from lidarshard import schemas
    from lidarshard.transforms.plan import STRATEGIES, VARIABLE_COUNT

    assert VARIABLE_COUNT is schemas.VARIABLE_COUNT and VARIABLE_COUNT <= set(STRATEGIES)


def _edges(path: str, modules: dict[str, str]) -> set[str]:
    """The modules of lidarshard a file imports, at any depth (function-level imports too, ``if
    TYPE_CHECKING:`` blocks not): ``from pkg import name`` is an edge to ``pkg.name`` when that is a
    module, else to ``pkg``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and getattr(child.test, "id", None) == "TYPE_CHECKING":
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names if a.name in modules)
            elif isinstance(child, ast.ImportFrom) and child.module and not child.level:
                for a in child.names:
                    sub = f"{child.module}.{a.name}"
                    found.add(sub if sub in modules else child.module)
            visit(child)

    visit(ast.parse(open(path, encoding="utf-8").read()))
    return {m for m in found if m in modules}


def test_no_module_cycle_not_even_behind_a_function_level_import() -> None:
    """The modules' import graph, function-level imports included, has no cycle: a lazy import may keep
    an optional or heavy dependency off the import path (Beam, torch, matplotlib), never hide a cycle."""
    modules = _modules()
    graph = {name: _edges(path, modules) - {name} for name, path in modules.items()}
    cycles, index, low, stack, on = [], {}, {}, [], set()

    def strong(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            part = []
            while (w := stack.pop()) != v:
                on.discard(w)
                part.append(w)
            on.discard(v)
            if part:
                cycles.append(sorted([v, *part]))

    for name in sorted(graph):
        if name not in index:
            strong(name)
    assert not cycles, f"import cycles (function-level imports counted): {cycles}"
