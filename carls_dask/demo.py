"""The end-to-end demo behind ``carls-dask demo`` (and ``./dev demo``).

It runs the semi-supervised paradigm on Cora on the embedded default cluster (a LocalCluster): a
graph-regularized trainer, a neighbour-embedding maker and a pseudo-label maker working through a
sharded knowledge bank, with a progress bar. It goes through the same runner as ``carls-dask run``, so
it writes a durable run folder (bank snapshots every ``carls.run.snapshot-every`` steps, the delta
log, trainer states, the metric store, ``result.json``) and says how to open it in the dashboard and
in xarray. The paradigm is looked up through the paradigm registry, so this module knows no
paradigm's code.
"""

from __future__ import annotations

import logging
import pathlib
import sys
import time
from typing import Any

from carls_dask.storage.runfolder import PL_COVERAGE, PL_PRECISION, RunFolder

__all__ = ["DEMO_PARADIGM", "FIGURE_SUFFIXES", "run_demo", "run_figures"]

logger = logging.getLogger(__name__)

#: The registered paradigm the demo runs.
DEMO_PARADIGM = "semi-supervised"

#: Endings of the metric-store series the demo prints (accuracy and pseudo-label quality figures).
FIGURE_SUFFIXES = ("acc", "accuracy", PL_PRECISION, PL_COVERAGE)


def run_figures(run_dir: pathlib.Path) -> list[str]:
    """Lines describing a finished run folder: its accuracy figures and its bank snapshots.

    The figures are the last and the highest reported value of every series of ``RUN/metrics.zarr`` whose name ends
    in one of :data:`FIGURE_SUFFIXES`; the snapshots are those committed in ``RUN/bank``. Parts the
    folder lacks are left out, so this never fails on a run that wrote less.
    """
    import numpy as np

    from carls_dask import storage
    from carls_dask.errors import CarlsError

    run = RunFolder(run_dir)
    lines: list[str] = []
    try:
        metrics = storage.open_metrics(run.metrics)
    except CarlsError:
        metrics = None
    if metrics is not None:
        names = sorted(str(n) for n in metrics.data_vars)
        # a series also written without its loop's name (for the dashboards) is listed once, under the loop
        looped = {n.split(".", 1)[1] for n in names if "." in n}
        for name in names:
            values = np.asarray(metrics[name].values, dtype=np.float64)
            if values.ndim != 1 or not name.endswith(FIGURE_SUFFIXES) or name in looped:
                continue
            seen = np.flatnonzero(np.isfinite(values))
            if seen.size:
                steps = np.asarray(metrics["step"].values)
                best = seen[int(np.argmax(values[seen]))]
                lines.append(f"  {name:<32} last {values[seen[-1]]:.4f} (step {int(steps[seen[-1]])}), "
                             f"highest {values[best]:.4f} (step {int(steps[best])})")
    try:
        snaps = storage.list_snapshots(run.bank)
    except CarlsError:
        snaps = []
    if snaps:
        lines.append(f"  bank snapshots: {len(snaps)}, newest v{snaps[-1]['version']} at step {snaps[-1]['step']}")
    return lines


def run_demo(run_dir: pathlib.Path | None = None, dataset: str = "cora", steps: int | None = None) -> int:
    """Run the demo paradigm into ``run_dir`` and print how to look at the result.

    Parameters
    ----------
    run_dir
        Run folder to write; default ``runs/demo-<time>``.
    dataset
        Data set of the semi-supervised paradigm (``cora`` or ``citeseer``).
    steps
        Trainer steps; ``None`` keeps the paradigm's default.

    Returns
    -------
    int
        The paradigm's exit status.
    """
    from carls_dask.runtime.registry import get_paradigm
    from carls_dask.runtime.runner import run_paradigm

    run_dir = run_dir or pathlib.Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    paradigm = get_paradigm(DEMO_PARADIGM)
    overrides: dict[str, Any] = {"dataset": dataset} | ({"steps": int(steps)} if steps is not None else {})
    settings = paradigm.settings(None, **overrides)
    out = sys.stdout
    out.write(f"demo: {DEMO_PARADIGM} ({paradigm.variant_name(None)}) learning on {dataset} on a LocalCluster, "
              f"writing {run_dir}\n")
    t0 = time.perf_counter()
    result = run_paradigm(paradigm, settings, run_dir=run_dir)
    elapsed = time.perf_counter() - t0
    out.write(f"demo: {result.headline(paradigm.headline)}\n")
    figures = run_figures(run_dir)
    if figures:
        out.write("demo: figures in the run's metric store\n" + "\n".join(figures) + "\n")
    run = RunFolder(run_dir)
    last = next((lp.get("step") for lp in result.loops.values() if lp.get("kind") == "trainer"), None)
    out.write(
        f"demo: finished in {elapsed:.0f} s\n"
        f"  dashboard:  carls-dask dashboard {run_dir}\n"
        f"  report:     carls-dask report {run_dir} -o {run.report}\n"
        f"  bank:       carls-dask bank inspect {run.bank}\n"
        f"  in Python:  carls_dask.open_bank('{run.bank}', table='nodes')  /  carls_dask.open_metrics('{run.metrics}')\n"
        f"  continue:   carls-dask run --resume {run_dir} --steps N (N above {last})\n"
    )
    return 0
