"""Helpers of the re-homing tests (tests/bank/test_rehoming.py), shared with the Slurm walltime test.

Their table, the workers of a client, killing one, the keys of a shard, and the check that a worker at its
lifetime hands its shard over with every acknowledged write.
"""

from __future__ import annotations

import os
import pathlib
import signal
import time
from typing import Any

import numpy as np

from carls_dask.bank import Column, KnowledgeBank, TableSpec
from tests.processes import wait_for


def table() -> TableSpec:
    return TableSpec("nodes", columns=(Column("embedding", shape=(4,)),), optimizer="sgd", learning_rate=0.5,
                     initializer="zeros", init_scale=0.0)


def workers(client: Any) -> list[str]:
    return sorted(client.scheduler_info(n_workers=-1)["workers"])


def kill_worker(client: Any, address: str) -> int:
    """SIGKILL the worker process at ``address``; returns its pid."""
    pid = client.run(os.getpid, workers=[address])[address]
    os.kill(pid, signal.SIGKILL)
    return int(pid)


def wait_gone(client: Any, address: str, timeout: float = 30) -> None:
    wait_for(lambda: address not in workers(client), lambda: f"worker {address} still registered {timeout}s after SIGKILL",
             timeout)


def keys_of_shard(bank: KnowledgeBank, shard: int, n: int) -> np.ndarray:
    cand = np.arange(1, 50 * n + 1, dtype=np.int64)
    return cand[bank.shard_of(cand) == shard][:n]


def lifetime_handover(client: Any, leaves: str, stays: str, root: pathlib.Path, timeout: float = 120) -> None:
    """Write to a bank with shard 0 on ``leaves`` (a worker with a lifetime) until that worker has gone;
    assert the shard was handed to ``stays`` by the walltime plugin and no acknowledged write was lost."""
    bank = KnowledgeBank.create(client, [table()], n_shards=2, buckets=64, workers=[leaves, stays],
                                name=f"walltime-{os.getpid()}", log_root=str(root))
    keys = np.concatenate([keys_of_shard(bank, 0, 8), keys_of_shard(bank, 1, 8)])
    acked: dict[int, float] = {}
    i = 0

    def write_once_more() -> bool:  # write until the worker has gone, and a little after
        nonlocal i
        bank.update("nodes", keys, {"embedding": np.full((keys.size, 4), float(i), np.float32)})
        acked.update({int(k): float(i) for k in keys})
        i += 1
        return leaves not in workers(client) and i >= 5

    wait_for(write_once_more, "the worker ending at its lifetime", timeout, interval=0.05)
    gone_at = time.time()
    stats = bank.stats()["rehoming"]
    assert stats["count"] == 1, f"{i} writes, {leaves} gone, workers now {workers(client)}, re-homing {stats}"
    event = stats["events"][0]
    assert event["from"] == leaves and event["to"] == stays and event["reason"] == "worker lifetime ends"
    assert event["time"] < gone_at  # handed over while the worker was still up
    got = bank.lookup("nodes", keys)
    assert got.found.all()
    np.testing.assert_array_equal(got.values["embedding"][:, 0], np.array([acked[int(k)] for k in keys]))
    bank.close()
