"""The import graph of ``carls_dask``, read from the source: no cycle, and the layers of DESIGN.md.

Every ``import`` and ``from ... import`` of a ``carls_dask`` module counts, at module level and inside
functions alike (a function-level import is still a dependency, and a cycle through one only waits for
the first call). Modules are found through ``[tool.setuptools] package-dir`` in pyproject.toml, as the
installed package maps them. The layers:

- ``carls_dask.storage`` (persistence) imports nothing of carls_dask but ``carls_dask.errors`` and
  ``carls_dask.config``;
- ``carls_dask.dashboards`` reads what runs write: it imports storage, errors, config, the package root
  and, for a live connection, the public ``carls_dask.bank`` and ``carls_dask.runtime`` packages, never
  their modules, and no paradigm;
- the system (``carls_dask`` outside storage, paradigms and dashboards) imports no paradigm.
"""

from __future__ import annotations

import ast
import dataclasses
import pathlib
from collections.abc import Iterable, Mapping

from tests.sources import ROOT, package_modules

STORAGE, PARADIGMS, DASHBOARDS = "carls_dask.storage", "carls_dask.paradigms", "carls_dask.dashboards"


@dataclasses.dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``where`` (``path:line``)."""

    source: str
    target: str
    where: str


def import_edges(modules: Mapping[str, pathlib.Path], root: pathlib.Path = ROOT, prefix: str = "carls_dask") -> list[Edge]:
    """Every import of a module under ``prefix`` in ``modules``, module-level and inside functions.

    ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``; a name that is
    no module is traced to the nearest package that is.
    """

    def known(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    edges = []
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([node.module] if node.module else [])])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
            else:
                continue
            for target in targets:
                if target == prefix or target.startswith(prefix + "."):
                    resolved = known(target)
                    if resolved is not None and resolved != name:
                        edges.append(Edge(name, resolved, f"{path.relative_to(root)}:{node.lineno}"))
    return edges


def cycles(edges: Iterable[tuple[str, str]]) -> list[list[str]]:
    """The import cycles of a graph: each strongly connected component of more than one module, sorted."""
    graph: dict[str, set[str]] = {}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        # Tarjan's algorithm without recursion: (node, iterator over its successors)
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, successors = work[-1]
            for nxt in successors:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
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
                    if len(component) > 1:
                        found.append(sorted(component))
    return sorted(found)


def _layer(module: str) -> str:
    for layer in (STORAGE, PARADIGMS, DASHBOARDS):
        if module == layer or module.startswith(layer + "."):
            return layer
    return "system"


def _refused(edge: Edge) -> str | None:
    """Why ``edge`` crosses a layer it must not, or ``None``."""
    source, target = _layer(edge.source), _layer(edge.target)
    if source == target:
        return None
    if source == STORAGE and edge.target not in ("carls_dask.errors", "carls_dask.config"):
        return "storage imports nothing of carls_dask but carls_dask.errors and carls_dask.config"
    if source == DASHBOARDS:
        allowed = ("carls_dask", "carls_dask.errors", "carls_dask.config", "carls_dask.bank", "carls_dask.runtime")
        if target == PARADIGMS:
            return "the dashboards import no paradigm"
        if target == "system" and edge.target not in allowed:
            return ("the dashboards read storage; of the system they import only the package root, errors, config "
                    "and the public carls_dask.bank and carls_dask.runtime packages")
    if source == "system" and target == PARADIGMS:
        return "the system imports no paradigm (paradigms register through entry points)"
    return None


def test_the_package_has_no_import_cycle() -> None:
    modules = package_modules()
    assert "carls_dask.storage.snapshots" in modules and "carls_dask.paradigms.multimodal.loops" in modules
    edges = import_edges(modules)
    assert len(edges) > 300, f"only {len(edges)} import edges found; is the source walk broken?"
    found = cycles((e.source, e.target) for e in edges)
    where = {(e.source, e.target): e.where for e in edges}
    described = [" -> ".join(c) + ": " + ", ".join(f"{a} imports {b} at {where[(a, b)]}" for a in c for b in c
                                                   if (a, b) in where) for c in found]
    assert not found, "import cycles:\n" + "\n".join(described)


def test_each_layer_imports_only_what_design_md_allows() -> None:
    refused = [f"{e.where}: {e.source} imports {e.target} ({why})" for e in import_edges(package_modules())
               if (why := _refused(e)) is not None]
    assert not refused, "imports across layers:\n" + "\n".join(refused)


def test_the_checks_see_function_level_imports_cycles_and_crossings(tmp_path: pathlib.Path) -> None:
    """The walk and the checks find what they are meant to find, on a package made for the purpose."""
    pkg = tmp_path / "carls_dask"
    (pkg / "storage").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "storage" / "__init__.py").write_text("from carls_dask.storage.a import f\n")
    (pkg / "storage" / "a.py").write_text("def f():\n    from carls_dask.storage import b\n")
    (pkg / "storage" / "b.py").write_text("from . import a\nfrom carls_dask.errors import X\nimport carls_dask.bank\n")
    modules = {"carls_dask": pkg / "__init__.py", "carls_dask.errors": pkg / "errors.py",
               "carls_dask.storage": pkg / "storage" / "__init__.py", "carls_dask.storage.a": pkg / "storage" / "a.py",
               "carls_dask.storage.b": pkg / "storage" / "b.py"}
    edges = import_edges(modules, tmp_path)
    pairs = {(e.source, e.target) for e in edges}
    assert pairs == {("carls_dask.storage", "carls_dask.storage.a"), ("carls_dask.storage.a", "carls_dask.storage.b"),
                     ("carls_dask.storage.b", "carls_dask.storage.a"), ("carls_dask.storage.b", "carls_dask.errors"),
                     ("carls_dask.storage.b", "carls_dask")}
    assert cycles(pairs) == [["carls_dask.storage.a", "carls_dask.storage.b"]]
    assert cycles([("a", "b"), ("b", "c"), ("c", "d")]) == []
    assert [_refused(e) is not None for e in edges if e.source == "carls_dask.storage.b"] == [False, False, True]
    assert _refused(Edge("carls_dask.dashboards.x", "carls_dask.bank.core", "")) is not None
    assert _refused(Edge("carls_dask.dashboards.x", "carls_dask.paradigms.curriculum", "")) is not None
    assert _refused(Edge("carls_dask.runtime.runner", "carls_dask.paradigms.data.graphs", "")) is not None
    assert _refused(Edge("carls_dask.dashboards.x", "carls_dask.storage.metrics", "")) is None
