"""The bank's modules import one another without a cycle, counting imports inside functions too."""

from __future__ import annotations

import ast
import pathlib

import carls_dask.bank

BANK = pathlib.Path(carls_dask.bank.__file__).parent


def _imports() -> dict[str, set[str]]:
    """``carls_dask.bank`` module -> the bank modules it imports anywhere in its source."""
    names = {f"carls_dask.bank.{p.stem}" for p in BANK.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for path in BANK.glob("*.py"):
        if path.stem == "__init__":
            continue
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                deps |= {m for m in (node.module, *(f"{node.module}.{a.name}" for a in node.names)) if m in names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names if a.name in names}
        graph[f"carls_dask.bank.{path.stem}"] = deps - {f"carls_dask.bank.{path.stem}"}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (a depth-first search), or None."""
    state: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if state.get(d) == 1:
                return [*path[path.index(d):], d]
            if d not in state and (found := visit(d)):
                return found
        state[m] = 2
        path.pop()
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)):
            return found
    return None


def test_the_bank_modules_import_one_another_without_a_cycle() -> None:
    graph = _imports()
    assert "carls_dask.bank.actor_internals" in graph["carls_dask.bank.rehoming"]  # the check sees imports
    assert _cycle(graph) is None, f"import cycle: {' -> '.join(_cycle(graph) or [])}"


def test_the_check_finds_a_cycle_through_an_import_inside_a_function() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None
