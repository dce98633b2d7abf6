"""The notebooks in ``notebooks/``: committed without outputs, sized in their first cell, and run top to bottom.

Each notebook is executed in a real Jupyter kernel of this interpreter (nbclient, kernel ``python3``,
which jupyter_client starts with ``sys.executable``) in a temporary folder; any cell that raises fails
the test. The last cell prints one JSON line ``{"carls_result": {...}}`` with the figures the notebook
computed, and the test checks them.
"""

from __future__ import annotations

import ast
import json
import pathlib
import sys
from collections.abc import Callable
from typing import Any

import nbformat
import pytest

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
EXPECTED = ("quickstart", "semi_supervised", "curriculum", "multimodal")
CELL_TIMEOUT = 300  # seconds one cell may run
MARKER = "carls_result"


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


def _execute(path: pathlib.Path, workdir: pathlib.Path) -> tuple[dict[str, Any], str]:
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.prefix)"))
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError naming the cell when any cell raises

    def text(cell: Any) -> str:
        return "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")

    cells = _code_cells(nb)
    lines = [ln for ln in text(cells[-2]).splitlines() if ln.startswith("{") and MARKER in ln]
    assert len(lines) == 1, f"{path.name}: the last cell printed no {MARKER} line: {text(cells[-2])[-2000:]!r}"
    return json.loads(lines[0])[MARKER], text(cells[-1]).strip()


def _check_quickstart(r: dict[str, Any]) -> None:
    assert r["trainer_steps"] == 150
    assert r["test_accuracy"] > 0.8  # 10 classes: chance is 0.1
    assert r["maker_rounds"] >= 1
    assert r["bank_rows"] == 1797  # every digit image
    assert (r["count_then"], r["count_now"]) == (3, 42)  # snapshot at step 100, then the delta log


def _check_semi_supervised(r: dict[str, Any]) -> None:
    assert r["base_test_acc"] > 0.4  # 7 classes; the largest is 0.3 of the test nodes
    assert r["bank_test_acc"] >= r["base_test_acc"] + 0.05  # the bank's neighbours and pseudo labels help
    assert r["bank_rows"] == 2708  # every Cora node
    assert min(r["curve_points"].values()) >= 3


def _check_curriculum(r: dict[str, Any]) -> None:
    assert set(r["test_accuracy"]) == {"uniform", "curriculum", "curriculum + cleaning"}
    assert min(r["test_accuracy"].values()) > 0.5  # 10 classes, 30 % noisy labels
    assert r["flag_precision"] > 0.5  # most flagged labels were flipped ones
    assert min(r["curve_points"].values()) >= 3
    assert r["bank_rows"] == 2000  # every training image scored


def _check_multimodal(r: dict[str, Any]) -> None:
    chance = 1 / r["n_test"]
    for arm, recall in r["recall"].items():
        assert recall["i2t_r@5"] > 5 * chance and recall["t2i_r@5"] > 5 * chance, arm
    assert set(r["steps"].values()) == {100}
    assert min(r["maker_rounds"].values()) >= 1
    assert r["text_rows"] > 3000


CHECKS: dict[str, Callable[[dict[str, Any]], None]] = {
    "quickstart": _check_quickstart,
    "semi_supervised": _check_semi_supervised,
    "curriculum": _check_curriculum,
    "multimodal": _check_multimodal,
}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_runs_top_to_bottom(name: str, tmp_path: pathlib.Path) -> None:
    result, prefix = _execute(NOTEBOOKS / f"{name}.ipynb", tmp_path)
    assert prefix == sys.prefix  # the kernel ran in this environment
    assert result["notebook"] == name
    CHECKS[name](result)
    assert any((tmp_path / "runs").iterdir())  # the run folders went to the notebook's folder
