"""The end-to-end demo behind ``carls-dask demo`` (and ``./dev demo``).

It starts the embedded default cluster (a LocalCluster), runs a small job on it and reports what it
measured. Later parts of the system extend it into the full semi-supervised run.
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

__all__ = ["run_demo"]

logger = logging.getLogger(__name__)


def _fit_linear(seed: int, steps: int) -> dict[str, Any]:
    """Fit a linear model with PyTorch on a worker; return the final loss."""
    import torch

    torch.manual_seed(seed)
    x = torch.randn(512, 8)
    w_true = torch.randn(8, 1)
    y = x @ w_true
    model = torch.nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    loss = torch.tensor(0.0)
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
    return {"seed": seed, "loss": float(loss.detach())}


def run_demo(n_workers: int = 2, steps: int = 200) -> dict[str, Any]:
    """Start a LocalCluster, fit two small models as Dask futures and report their losses."""
    from distributed import Client, LocalCluster

    t0 = time.perf_counter()
    with (
        LocalCluster(n_workers=n_workers, threads_per_worker=1, host="127.0.0.1", dashboard_address=":0") as cluster,
        Client(cluster) as client,
    ):
        futures = [client.submit(_fit_linear, seed, steps, pure=False) for seed in range(n_workers)]
        results = client.gather(futures)
    elapsed = time.perf_counter() - t0
    sys.stdout.write(f"demo: {len(results)} models fitted on a LocalCluster in {elapsed:.1f}s\n")
    for r in results:
        sys.stdout.write(f"  seed {r['seed']}: final mse {r['loss']:.2e}\n")
    return {"results": results, "seconds": elapsed}
