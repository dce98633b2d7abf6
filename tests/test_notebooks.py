"""The notebooks in ``notebooks/``: committed without outputs and sized in their first cell.

They are run top to bottom, and the figures their last cells print are checked, by
``tests/ui/test_notebooks_ui.py`` (Run All in JupyterLab, at ``SUITE_SIZES``) and by ``benchmarks/notebooks.py``
(nbclient, at their committed sizes).
"""

from __future__ import annotations

import ast
import pathlib
from typing import Any

import nbformat
import pytest

from benchmarks.notebooks import NAMES, NOTEBOOKS

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

