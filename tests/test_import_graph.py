"""The import graph of ``carls_dask``, read from the source: no cycle, and the layers of docs/architecture.md.

Every ``import`` and ``from ... import`` of a ``carls_dask`` module counts, at module level and inside
functions alike (a function-level import is still a dependency, and a cycle through one only waits for
the first call). Modules are found through ``[tool.setuptools] package-dir`` in pyproject.toml, as the
installed package maps them. The layers and what each may import are the table under "## Layers" in
docs/architecture.md, read here: the page is the rule, this test its enforcement.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import pathlib
import re
from collections.abc import Iterable, Mapping

from tests.sources import ROOT, package_modules

ARCHITECTURE = ROOT / "docs" / "architecture.md"


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


@dataclasses.dataclass(frozen=True)
class Layer:
    """A row of the page's layer table: its modules and what it may import besides its own modules.

    ``modules`` and the module entries of ``allowed`` are exact module names or ``package.*`` (the
    package and every module below it); the other entries of ``allowed`` name whole layers.
    """

    name: str
    modules: tuple[str, ...]
    allowed: tuple[str, ...]


def layers_of(page: str) -> list[Layer]:
    """The rows of the table under ``## Layers`` in ``page`` (columns: layer, modules, may import)."""
    section = page.split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # after the header and its rule
    out = []
    for row in rows:
        name, modules, allowed = (cell.strip() for cell in row.strip().strip("|").split("|"))
        out.append(Layer(name, tuple(re.findall(r"`([^`]+)`", modules)),
                         tuple(item.strip().strip("`") for item in allowed.split(","))))
    return out


@functools.cache
def _layers() -> tuple[Layer, ...]:
    return tuple(layers_of(ARCHITECTURE.read_text()))


def _matches(module: str, pattern: str) -> bool:
    if pattern.endswith(".*"):
        package = pattern[:-2]
        return module == package or module.startswith(package + ".")
    return module == pattern


def _layer(module: str, layers: Iterable[Layer] | None = None) -> Layer:
    """The layer of ``module``: the row naming it exactly, else the one whose package holds it most closely."""
    rows = list(_layers() if layers is None else layers)
    for layer in rows:
        if module in layer.modules:
            return layer
    best = max(((len(p), layer) for layer in rows for p in layer.modules if p.endswith(".*") and _matches(module, p)),
               key=lambda t: t[0], default=None)
    assert best is not None, f"{module} is in no layer of {ARCHITECTURE.name}"
    return best[1]


def _refused(edge: Edge, layers: Iterable[Layer] | None = None) -> str | None:
    """Why ``edge`` crosses a layer it must not, or ``None``."""
    rows = list(_layers() if layers is None else layers)
    names = {layer.name for layer in rows}
    source, target = _layer(edge.source, rows), _layer(edge.target, rows)
    if source == target:
        return None
    for item in source.allowed:
        if (item == target.name) if item in names else _matches(edge.target, item):
            return None
    return f"the {source.name} layer may import only {', '.join(source.allowed)} ({ARCHITECTURE.name})"


def test_the_architecture_page_names_the_layers() -> None:
    layers = _layers()
    assert [layer.name for layer in layers] == ["storage", "system", "paradigms", "dashboards", "entry points"]
    names = {layer.name for layer in layers}
    for layer in layers:
        for item in layer.allowed:  # every entry names a layer or a module of the package
            assert item in names or any(_matches(m, item) for m in package_modules()), (layer.name, item)
    by_layer = {layer.name: [m for m in package_modules() if _layer(m) == layer] for layer in layers}
    assert "carls_dask.bank.core" in by_layer["system"] and "carls_dask.errors" in by_layer["system"]
    assert "carls_dask.storage.snapshots" in by_layer["storage"]
    assert by_layer["entry points"] == ["carls_dask", "carls_dask.cli", "carls_dask.dashboard_cli"]


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


def test_each_layer_imports_only_what_the_architecture_page_allows() -> None:
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
    assert _refused(Edge("carls_dask.runtime.runner", "carls_dask.dashboards.runs", "")) is not None
    assert _refused(Edge("carls_dask.dashboard_cli", "carls_dask.dashboards.runs", "")) is None
    assert _refused(Edge("carls_dask.paradigms.curriculum.loops", "carls_dask.dashboards.views", "")) is not None
    assert _refused(Edge("carls_dask.paradigms.curriculum.loops", "carls_dask.nn.embedding", "")) is None


def test_test_modules_share_helpers_through_helper_modules() -> None:
    """No test module imports another test module or a conftest: what tests share lives in a helper module
    (``tests/processes.py``, ``tests/bank/banks.py``, ``tests/ui/browser.py``, ...) and fixtures in conftest files."""
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or "", *(f"{node.module}.{a.name}" for a in node.names)]
                     if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                last = name.rpartition(".")[2]
                if name.startswith("tests.") and (last.startswith("test_") or last == "conftest"):
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} imports {name}")
    assert not found, "test modules importing test modules or conftest files:\n" + "\n".join(found)
