"""The notebooks in ``notebooks/``: committed without outputs, sized in their first cell, and run top to bottom.

Each notebook is executed in a real Jupyter kernel of this interpreter (nbclient, kernel ``python3``,
which jupyter_client starts with ``sys.executable``) in a temporary folder; any cell that raises fails
the test. The last cell prints one JSON line ``{"carls_result": {...}}`` with the figures the notebook
computed, and the test checks them. The checks live in ``benchmarks/notebooks.py``, which also runs the
notebooks at their committed sizes; the suite runs two of them smaller (``SUITE_SIZES`` there).
"""

from __future__ import annotations

import ast
import pathlib
import sys
from typing import Any

import nbformat
import pytest

from benchmarks.notebooks import CHECKS, NAMES, NOTEBOOKS, SUITE_SIZES, execute

EXPECTED = NAMES


def _notebooks() -> list[pathlib.Path]:
    return sorted(NOTEBOOKS.glob("*.ipynb"))


def _code_cells(nb: Any) -> list[Any]:
    return [c for c in nb.cells if c.cell_type == "code"]


def test_the_expected_notebooks_exist() -> None:
    assert sorted(p.stem for p in _notebooks()) == sorted(EXPECTED)


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.stem)
def test_committed_notebook_has_no_outputs(path: pathlib.Path) -> None:
    nb = nbformat.read(path, as_version=4)
    nbformat.validate(nb)
    dirty = [i for i, c in enumerate(nb.cells)
             if c.cell_type == "code" and (c.get("outputs") or c.get("execution_count") is not None)]
    assert not dirty, f"{path.name}: code cells {dirty} carry outputs or execution counts; strip them before committing"


@pytest.mark.parametrize("path", _notebooks(), ids=lambda p: p.stem)
def test_first_code_cell_holds_only_size_parameters(path: pathlib.Path) -> None:
    first = _code_cells(nbformat.read(path, as_version=4))[0]
    tree = ast.parse(first.source)
    assert tree.body, f"{path.name}: the first code cell is empty"
    for node in tree.body:
        assert isinstance(node, ast.Assign) and len(node.targets) == 1, (
            f"{path.name}: the first code cell must only assign parameters, found {ast.dump(node)[:80]}")
        target = node.targets[0]
        assert isinstance(target, ast.Name) and target.id.isupper(), (
            f"{path.name}: parameters are UPPER_CASE names, found {ast.unparse(target)}")
        ast.literal_eval(node.value)  # a plain value a user can edit


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_runs_top_to_bottom(name: str, tmp_path: pathlib.Path) -> None:
    """At the suite's sizes (``SUITE_SIZES``; the committed sizes: ``python benchmarks/notebooks.py``)."""
    result, prefix, params = execute(NOTEBOOKS / f"{name}.ipynb", tmp_path, SUITE_SIZES.get(name))
    assert prefix == sys.prefix  # the kernel ran in this environment
    assert result["notebook"] == name
    failed = [what for what, ok in CHECKS[name](result, params) if not ok]
    assert not failed, f"{name} at {params}: {failed}; figures {result}"
    assert any((tmp_path / "runs").iterdir())  # the run folders went to the notebook's folder
