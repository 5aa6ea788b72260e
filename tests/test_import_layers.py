"""Imports go one way, and no module imports itself back (DESIGN.md "Layers").

Every ``.py`` file of the five packages is parsed with ``ast``; every import counts, the ones
inside functions (lazy) and under ``if TYPE_CHECKING`` included. Layers, lowest first:
``neuraldbg`` <- ``causal_models`` <- ``experiments`` <- ``benchmarks`` <- ``papers``; a
module may import its own layer and those below. Tests may import anything.
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Packages from the lowest layer up.
LAYERS: tuple[str, ...] = ("neuraldbg", "causal_models", "experiments", "benchmarks", "papers")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    """In-repo module name -> file, for every ``.py`` of the layered packages."""
    out = {}
    for pkg in LAYERS:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = path
    return out


def _imported(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """In-repo modules that the file at ``path`` (module ``name``) imports, anywhere in it.

    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``. The
    parent packages Python initialises on the way are not counted: they are what every
    submodule import passes through, not a dependency the code chose.
    """
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".")
                base_parts = base_parts[:len(base_parts) - (node.level - 1)]
                base = ".".join(base_parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base
                       for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a non-module name
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> nx.DiGraph:
    modules = _modules()
    graph = nx.DiGraph()
    for name, path in modules.items():
        graph.add_node(name)
        for target in _imported(path, name, modules):
            graph.add_edge(name, target)
    return graph


def _layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def test_the_walk_sees_every_package() -> None:
    """The checker itself: it finds modules of every layer, top-level and lazy imports."""
    graph = _graph()
    assert {n.split(".")[0] for n in graph} == set(LAYERS)
    assert graph.number_of_edges() > 100
    assert graph.has_edge("benchmarks.baselines.autotrainer", "neuraldbg.methods")
    assert graph.has_edge("experiments.families", "neuraldbg.registry_base")


def test_lazy_and_relative_imports_are_edges(tmp_path: Path) -> None:
    """An import inside a function body or under TYPE_CHECKING is an edge like any other."""
    src = tmp_path / "mod.py"
    src.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                   "    from . import trace\n"
                   "def f():\n    from causal_models import network\n    return network\n")
    assert _imported(src, "neuraldbg.mod", _modules()) == {"causal_models.network",
                                                             "neuraldbg.trace"}


def test_no_upward_import() -> None:
    upward = sorted(f"{a} imports {b}" for a, b in _graph().edges if _layer(b) > _layer(a))
    assert not upward, ("Imports must go neuraldbg <- causal_models <- experiments <- "
                        "benchmarks <- papers; upward:\n" + "\n".join(upward))


def _cycles(graph: nx.DiGraph) -> list[list[str]]:
    return sorted(sorted(c) for c in nx.strongly_connected_components(graph) if len(c) > 1)


def test_no_import_cycle_between_packages() -> None:
    graph = nx.DiGraph((a.split(".")[0], b.split(".")[0]) for a, b in _graph().edges
                       if a.split(".")[0] != b.split(".")[0])
    assert not _cycles(graph), f"Import cycles between packages: {_cycles(graph)}"


@pytest.mark.parametrize("package", LAYERS)
def test_no_import_cycle_between_files(package: str) -> None:
    cycles = [c for c in _cycles(_graph()) if c[0].split(".")[0] == package]
    assert not cycles, f"Import cycles between files of {package}: {cycles}"
