"""Closing a bank gives its memory back: the workers drop the shards' rows, slots, indexes and buffers."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from carls_dask.bank import Column, KnowledgeBank, TableSpec
from tests.processes import wait_for

ROWS = 400_000
D = 64
PAYLOAD = ROWS * D * 4 * 2  # values and the Adagrad accumulator: 195 MiB


def _rss() -> int:
    import psutil

    return int(psutil.Process(os.getpid()).memory_info().rss)


def _actors(dask_worker: Any) -> int:
    return len(dask_worker.state.actors)


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    """Two single-threaded worker processes (each RSS is one process's)."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1", dashboard_address=":0",
                      memory_limit=0) as cluster, Client(cluster) as c:
        yield c


def _fill_and_close(client: Any, rows: int) -> int:
    """Create a bank, fill it with ``rows`` keys, train some, close it; the workers' RSS while it was full."""
    spec = TableSpec("e", columns=(Column("embedding", shape=(D,)),), optimizer="adagrad", learning_rate=0.05,
                     initializer="normal", init_scale=0.1)
    bank = KnowledgeBank.create(client, [spec], n_shards=2)
    keys = np.arange(rows, dtype=np.int64)
    for i in range(0, rows, 65_536):
        bank.lookup("e", keys[i:i + 65_536], insert=True)
    bank.apply_gradients("e", keys[: min(rows, 65_536)], np.full((min(rows, 65_536), D), 0.01, np.float32))
    assert bank.size("e") == rows
    full = sum(client.run(_rss).values())
    bank.close()
    wait_for(lambda: sum(client.run(_actors).values()) == 0, "the workers dropping the closed bank's shards", 30)
    return full


def test_a_bank_filled_and_closed_five_times_leaves_the_workers_as_they_were(client: Any) -> None:
    _fill_and_close(client, 5_000)  # imports and compiled code: paid once per worker, not per bank
    time.sleep(0.5)
    base = sum(client.run(_rss).values())
    for i in range(5):
        full = _fill_and_close(client, ROWS)
        assert full - base > 0.9 * PAYLOAD, f"bank {i} did not hold its rows ({(full - base) / 2**20:.0f} MiB)"
        grown = sum(client.run(_rss).values()) - base
        assert grown <= 0.1 * PAYLOAD, (f"after closing bank {i} the workers hold {grown / 2**20:.0f} MiB more than "
                                        f"before the first; expected at most {0.1 * PAYLOAD / 2**20:.0f} MiB")
