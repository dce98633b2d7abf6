"""The notebooks of ``notebooks/`` at their committed sizes, top to bottom, with a PASS/FAIL line per check.

Each notebook runs in a real Jupyter kernel of this interpreter (nbclient, kernel ``python3``) in a temporary
folder; its last cell prints one JSON line ``{"carls_result": {...}}`` with the figures it computed, which the
checks below judge. The suite (``tests/ui/test_notebooks_ui.py``) runs the same notebooks with Run All in
JupyterLab and judges them by the same checks, with smaller sizes where the effect shows at a smaller size
(:data:`SUITE_SIZES`); this script runs them as a user opens them.

    python benchmarks/notebooks.py                     # all four
    python benchmarks/notebooks.py semi_supervised
"""

from __future__ import annotations

import argparse
import ast
import json
import pathlib
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from typing import Any

NOTEBOOKS = pathlib.Path(__file__).resolve().parent.parent / "notebooks"
NAMES = ("quickstart", "semi_supervised", "curriculum", "multimodal")
CELL_TIMEOUT = 300  # seconds one cell may run
MARKER = "carls_result"

#: The sizes the test suite runs a notebook at, where they differ from the committed ones: semi_supervised at 40
#: steps (bank + pseudo labels 17-18 points above the base MLP on seeds 0-1, against 5 asked), multimodal at 50
#: (recall@5 of both arms 0.08-0.13, against 5 x chance = 0.017).
SUITE_SIZES: dict[str, dict[str, Any]] = {"semi_supervised": {"STEPS": 40}, "multimodal": {"STEPS": 50}}


def sizes(nb: Any) -> dict[str, Any]:
    """The parameters the first code cell assigns (UPPER_CASE names to plain values)."""
    first = next(c for c in nb.cells if c.cell_type == "code")
    return {node.targets[0].id: ast.literal_eval(node.value)  # type: ignore[attr-defined]
            for node in ast.parse(first.source).body if isinstance(node, ast.Assign)}


def prepared(path: pathlib.Path, overrides: Mapping[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """The notebook at ``path`` with its first cell's parameters updated by ``overrides`` and a last cell that
    prints the kernel's ``sys.prefix``; returns it and the parameters it will run with."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    params = {**sizes(nb), **(overrides or {})}
    if overrides:
        first = next(c for c in nb.cells if c.cell_type == "code")
        first.source += "\n# the suite's sizes\n" + "\n".join(f"{k} = {v!r}" for k, v in overrides.items())
    nb.cells.append(nbformat.v4.new_code_cell("import sys; print(sys.prefix)"))
    return nb, params


def figures(name: str, outputs: list[list[dict[str, Any]]]) -> tuple[dict[str, Any], str]:
    """The figures a :func:`prepared` notebook's last cell printed and the kernel's ``sys.prefix``, from the
    outputs of its code cells (nbformat's output dicts, one list per code cell)."""
    def text(cell: list[dict[str, Any]]) -> str:
        parts = [o.get("text", "") for o in cell if o.get("output_type") == "stream"]
        return "".join("".join(t) if isinstance(t, list) else t for t in parts)  # a multiline string, or its lines

    lines = [ln for ln in text(outputs[-2]).splitlines() if ln.startswith("{") and MARKER in ln]
    assert len(lines) == 1, f"{name}: the last cell printed no {MARKER} line: {text(outputs[-2])[-2000:]!r}"
    return json.loads(lines[0])[MARKER], text(outputs[-1]).strip()


def execute(path: pathlib.Path, workdir: pathlib.Path, overrides: Mapping[str, Any] | None = None
            ) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """Run the notebook at ``path`` in ``workdir`` with its first cell's parameters updated by ``overrides``.

    Returns the figures its last cell printed, the kernel's ``sys.prefix`` and the parameters it ran with.
    """
    from nbclient import NotebookClient

    nb, params = prepared(path, overrides)
    client = NotebookClient(nb, timeout=CELL_TIMEOUT, kernel_name="python3", allow_errors=False,
                            resources={"metadata": {"path": str(workdir)}})
    client.execute()  # raises CellExecutionError naming the cell when any cell raises
    result, prefix = figures(path.name, [c.get("outputs", []) for c in nb.cells if c.cell_type == "code"])
    return result, prefix, params


Check = tuple[str, bool]


def check_quickstart(r: Mapping[str, Any], p: Mapping[str, Any]) -> list[Check]:
    return [
        (f"trainer ran {p['TRAINER_STEPS']} steps", r["trainer_steps"] == p["TRAINER_STEPS"]),
        ("test accuracy > 0.8 (10 classes: chance is 0.1)", r["test_accuracy"] > 0.8),
        ("maker rounds >= 1", r["maker_rounds"] >= 1),
        ("the bank holds every digit image (1,797 rows)", r["bank_rows"] == 1797),
        ("count at the step-100 snapshot 3, then 42 through the delta log", (r["count_then"], r["count_now"]) == (3, 42)),
    ]


def check_semi_supervised(r: Mapping[str, Any], p: Mapping[str, Any]) -> list[Check]:
    return [
        ("base MLP test accuracy > 0.4 (the largest of 7 classes: 0.3)", r["base_test_acc"] > 0.4),
        ("bank + pseudo labels >= base MLP + 5 points", r["bank_test_acc"] >= r["base_test_acc"] + 0.05),
        ("the bank holds every Cora node (2,708 rows)", r["bank_rows"] == 2708),
        ("every learning curve has >= 3 points", min(r["curve_points"].values()) >= 3),
    ]


def check_curriculum(r: Mapping[str, Any], p: Mapping[str, Any]) -> list[Check]:
    return [
        ("three arms", set(r["test_accuracy"]) == {"uniform", "curriculum", "curriculum + cleaning"}),
        ("every arm's test accuracy > 0.5 (10 classes, 30 % noisy labels)", min(r["test_accuracy"].values()) > 0.5),
        ("most flagged labels were flipped ones (precision > 0.5)", r["flag_precision"] > 0.5),
        ("every learning curve has >= 3 points", min(r["curve_points"].values()) >= 3),
        (f"every training image scored ({p['N_TRAIN']} rows)", r["bank_rows"] == p["N_TRAIN"]),
    ]


def check_multimodal(r: Mapping[str, Any], p: Mapping[str, Any]) -> list[Check]:
    chance = 1 / r["n_test"]
    out = [(f"{arm}: recall@5 both ways > 5 x chance", recall["i2t_r@5"] > 5 * chance and recall["t2i_r@5"] > 5 * chance)
           for arm, recall in r["recall"].items()]
    return [*out,
            (f"every arm ran {p['STEPS']} steps", set(r["steps"].values()) == {p["STEPS"]}),
            ("every arm's maker ran >= 1 round", min(r["maker_rounds"].values()) >= 1),
            ("the text table holds > 3,000 rows", r["text_rows"] > 3000)]


CHECKS: dict[str, Callable[[Mapping[str, Any], Mapping[str, Any]], list[Check]]] = {
    "quickstart": check_quickstart,
    "semi_supervised": check_semi_supervised,
    "curriculum": check_curriculum,
    "multimodal": check_multimodal,
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("names", nargs="*", metavar="NOTEBOOK", help=f"notebooks to run (default: all of {', '.join(NAMES)})")
    args = ap.parse_args(argv)
    unknown = sorted(set(args.names) - set(NAMES))
    if unknown:
        ap.error(f"unknown notebooks {unknown}; expected some of {list(NAMES)}")
    failed = 0
    for name in args.names or NAMES:
        with tempfile.TemporaryDirectory(prefix=f"carls-nb-{name}-") as tmp:
            t0 = time.perf_counter()
            result, _prefix, params = execute(NOTEBOOKS / f"{name}.ipynb", pathlib.Path(tmp))
            print(f"{name} ({time.perf_counter() - t0:.0f} s, {params}):")
            for what, ok in CHECKS[name](result, params):
                print(f"  {'PASS' if ok else 'FAIL'}  {what}", flush=True)
                failed += not ok
            print(f"  figures: {json.dumps(result)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
