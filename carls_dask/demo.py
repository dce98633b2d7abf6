"""The end-to-end demo behind ``carls-dask demo`` (and ``./dev demo``).

It runs the semi-supervised paradigm on Cora on the embedded default cluster (a LocalCluster): a
graph-regularized trainer, a neighbour-embedding maker and a pseudo-label maker working through a
sharded knowledge bank, with a progress bar. It writes a run folder (bank snapshots, delta log, metric
store) and says how to open it in the dashboard and in xarray. The paradigm is looked up through the
paradigm registry, so this module knows no paradigm's code.
"""

from __future__ import annotations

import logging
import pathlib
import sys
import time

__all__ = ["DEMO_PARADIGM", "run_demo"]

logger = logging.getLogger(__name__)

#: The registered paradigm the demo runs.
DEMO_PARADIGM = "semi-supervised"


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
    from carls_dask.runtime.registry import RunRequest, get_paradigm

    run_dir = run_dir or pathlib.Path("runs") / f"demo-{time.strftime('%Y%m%d-%H%M%S')}"
    runner = get_paradigm(DEMO_PARADIGM)
    out = sys.stdout
    out.write(f"demo: {DEMO_PARADIGM} learning on {dataset} on a LocalCluster, writing {run_dir}\n")
    t0 = time.perf_counter()
    status = runner(RunRequest(DEMO_PARADIGM, run_dir, steps, {"dataset": dataset}))
    elapsed = time.perf_counter() - t0
    out.write(
        f"demo: finished in {elapsed:.0f} s\n"
        f"  dashboard:  carls-dask dashboard {run_dir}\n"
        f"  bank:       carls-dask bank inspect {run_dir / 'bank'}\n"
        f"  in Python:  storage.open_bank('{run_dir / 'bank'}', table='nodes')  /  storage.open_metrics('{run_dir / 'metrics.zarr'}')\n"
    )
    return 0 if status is None else int(status)
