"""Shard re-homing: the worker holding a bank shard is killed (SIGKILL) and the shard comes back.

A real two-worker LocalCluster of its own (the tests kill its workers); the nannies restart the
killed processes. Every acknowledged write is recorded and read back after the recovery.
"""

from __future__ import annotations

import pathlib
import time
from collections.abc import Iterator
from typing import Any

import dask
import numpy as np
import pytest

from carls_dask.bank import Column, KnowledgeBank, TableSpec
from carls_dask.bank.calls import ShardCall
from carls_dask.bank.operations import APPLY_GRADIENTS
from carls_dask.errors import ShardLostError
from tests.bank.rehome import keys_of_shard, kill_worker, lifetime_handover, table, wait_gone, workers
from tests.processes import wait_for

REHOME_TIMEOUT = 60.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    from distributed import LocalCluster

    with dask.config.set({"carls.bank.rehome-timeout": f"{REHOME_TIMEOUT:g}s"}):
        with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                          dashboard_address=":0") as c:
            yield c


@pytest.fixture
def client(cluster: Any) -> Iterator[Any]:
    from distributed import Client

    with dask.config.set({"carls.bank.rehome-timeout": f"{REHOME_TIMEOUT:g}s"}):
        with Client(cluster, direct_to_workers=True) as c:
            c.wait_for_workers(2, timeout=60)
            yield c



def test_killed_shard_comes_back_with_every_acknowledged_write(client: Any, tmp_path: pathlib.Path) -> None:
    a, b = workers(client)
    bank = KnowledgeBank.create(client, [table()], n_shards=2, buckets=64, workers=[a, b], name="kill-main",
                                log_root=str(tmp_path / "bank"))
    try:
        k0, k1 = keys_of_shard(bank, 0, 20), keys_of_shard(bank, 1, 20)
        keys = np.concatenate([k0, k1])
        acked: dict[int, np.ndarray] = {}
        for i in range(5):  # updates on both shards, recorded once acknowledged
            vals = np.full((keys.size, 4), float(i), np.float32) + keys[:, None]
            assert bank.update("nodes", keys, {"embedding": vals}) == keys.size
            acked.update({int(k): v for k, v in zip(keys, vals, strict=True)})
        bank.snapshot(str(tmp_path / "bank"), step=5)
        grads = np.ones((keys.size, 4), np.float32)
        for _ in range(3):  # gradient steps after the snapshot: only in the delta log
            assert bank.apply_gradients("nodes", keys, grads).all()
            acked = {k: v - 0.5 for k, v in acked.items()}
        kill_worker(client, a)
        wait_gone(client, a)
        # the next call finds shard 0 lost, re-homes it on a live worker and is retried there
        assert bank.apply_gradients("nodes", keys, grads).all()
        acked = {k: v - 0.5 for k, v in acked.items()}
        got = bank.lookup("nodes", keys)
        assert got.found.all()
        np.testing.assert_array_equal(got.values["embedding"], np.stack([acked[int(k)] for k in keys]))
        stats = bank.stats()["rehoming"]
        assert stats["count"] == 1 and stats["generation"] == [1, 0]
        event = stats["events"][0]
        assert event["shard"] == 0 and event["from"] == a and event["to"] != a
        assert event["rows"] == k0.size and event["records"] >= 3  # snapshot rows, then the 3 logged steps
        assert event["rehome_s"] < REHOME_TIMEOUT
    finally:
        bank.close()


def _writer(bank: KnowledgeBank, keys: np.ndarray, batches: int, progress: str) -> dict[str, Any]:
    """A task: write batch i (value i) to every key, record what was acknowledged, and when.

    Like the runtime's loops it leaves the worker's thread pool, so the worker can start a shard.
    """
    from distributed import Variable, secede

    secede()
    var = Variable(progress)
    acked, times = [], []
    for i in range(batches):
        bank.update("nodes", keys, {"embedding": np.full((keys.size, 4), float(i), np.float32)}, model_step=i)
        acked.append(i)
        times.append(time.monotonic())
        var.set(i)
        time.sleep(0.02)
    gaps = np.diff(times) if len(times) > 1 else np.zeros(1)
    return {"acked": acked, "max_gap": float(gaps.max()), "rehoming": bank.stats()["rehoming"]}


@pytest.mark.slow
def test_a_task_copy_rehomes_while_writing_and_the_creator_adopts(client: Any, tmp_path: pathlib.Path) -> None:
    from distributed import Variable

    a, b = workers(client)
    bank = KnowledgeBank.create(client, [table()], n_shards=2, buckets=64, workers=[a, b], name="kill-task",
                                log_root=str(tmp_path / "bank"))
    try:
        keys = np.concatenate([keys_of_shard(bank, 0, 8), keys_of_shard(bank, 1, 8)])
        progress = "rehoming-test-progress"
        fut = client.submit(_writer, bank, keys, 150, progress, workers=[b], pure=False)
        var = Variable(progress, client=client)
        def written_20() -> bool:
            assert not fut.done(), f"the writer ended early: {fut}"
            try:
                return int(var.get(timeout=1)) >= 20
            except TimeoutError:
                return False

        wait_for(written_20, "the writer's 20th write", 60, interval=0)  # kill shard 0's worker while it runs
        killed_at = int(var.get(timeout=5))
        kill_worker(client, a)
        out = fut.result(timeout=REHOME_TIMEOUT + 60)
        assert out["acked"] == list(range(150))
        assert out["acked"][-1] > killed_at  # the writer carried on after the kill
        assert out["max_gap"] < REHOME_TIMEOUT  # the pause was bounded by the configured deadline
        assert out["rehoming"]["count"] == 1
        # the creator's copy still holds the dead handle: it adopts the re-homed shard
        got = bank.lookup("nodes", keys)
        assert got.found.all()
        np.testing.assert_array_equal(got.values["embedding"], np.full((keys.size, 4), 149.0, np.float32))
        np.testing.assert_array_equal(got.model_step, np.full(keys.size, 149))
        assert bank.stats()["rehoming"]["count"] == 1
    finally:
        bank.close()


def test_a_retried_batch_is_not_applied_twice(client: Any, tmp_path: pathlib.Path) -> None:
    """A batch logged by the old shard whose answer was lost is recognised on the new shard."""
    a, _ = workers(client)
    bank = KnowledgeBank.create(client, [table()], n_shards=1, buckets=16, workers=[a], name="kill-retry",
                                log_root=str(tmp_path / "bank"))
    try:
        keys = np.arange(1, 9, dtype=np.int64)
        bank.update("nodes", keys, {"embedding": np.zeros((8, 4), np.float32)})
        grads = {"embedding": np.ones((8, 4), np.float32)}
        op = 12345
        call = [ShardCall(0, APPLY_GRADIENTS, ("nodes", keys, grads, "embedding", None), op_id=op)]
        assert bank._call(call)[0].all()
        assert bank._call(call)[0].all()  # same shard, same op id: answered, not applied again
        kill_worker(client, a)
        wait_gone(client, a)
        # the same batch again, as a client retries it after the re-homing: the log knows the op id
        assert bank._call(call)[0].all()
        np.testing.assert_array_equal(bank.lookup("nodes", keys).values["embedding"],
                                      np.full((8, 4), -0.5, np.float32))
        # a new batch is applied
        assert bank.apply_gradients("nodes", keys, grads).all()
        np.testing.assert_array_equal(bank.lookup("nodes", keys).values["embedding"],
                                      np.full((8, 4), -1.0, np.float32))
        assert bank.stats()["rehoming"]["count"] == 1
    finally:
        bank.close()


def _retire_here() -> list[dict[str, Any]]:
    from distributed import get_worker

    from carls_dask.bank.rehoming import retire_worker_shards

    return retire_worker_shards(get_worker(), "closing for the test")


def _write_colocated(bank: KnowledgeBank, keys: np.ndarray) -> tuple[bool, int]:
    """A task on the retired shard's worker: its copy still finds the old (retired) shard in process."""
    local = bank.transport.local_shard(0) is not None
    return local, bank.update("nodes", keys, {"embedding": np.full((keys.size, 4), 7.0, np.float32)})


def test_a_retired_shard_is_handed_over_and_a_colocated_task_is_rerouted(client: Any,
                                                                          tmp_path: pathlib.Path) -> None:
    a, b = workers(client)
    bank = KnowledgeBank.create(client, [table()], n_shards=1, buckets=16, workers=[a], name="retire",
                                log_root=str(tmp_path / "bank"))
    try:
        keys = np.arange(1, 9, dtype=np.int64)
        bank.update("nodes", keys, {"embedding": np.full((8, 4), 2.0, np.float32)})
        (event,) = client.submit(_retire_here, workers=[a], pure=False).result(timeout=REHOME_TIMEOUT)
        assert event["from"] == a and event["to"] == b and event["reason"] == "closing for the test"
        local, written = client.submit(_write_colocated, bank, keys, workers=[a], pure=False).result(timeout=60)
        assert local and written == 8  # the co-located copy was re-routed to the new shard, not failed
        got = bank.lookup("nodes", keys)  # the creator's copy adopts the new shard
        np.testing.assert_array_equal(got.values["embedding"], np.full((8, 4), 7.0, np.float32))
        assert bank.stats()["rehoming"]["count"] == 1
    finally:
        bank.close()


def test_a_call_waits_at_most_the_rehome_timeout_then_a_later_call_recovers(client: Any,
                                                                           tmp_path: pathlib.Path) -> None:
    a, _ = workers(client)
    bank = KnowledgeBank.create(client, [table()], n_shards=1, buckets=16, workers=[a], name="kill-deadline",
                                log_root=str(tmp_path / "bank"))
    try:
        keys = np.arange(1, 9, dtype=np.int64)
        bank.update("nodes", keys, {"embedding": np.full((8, 4), 3.0, np.float32)})
        kill_worker(client, a)
        wait_gone(client, a)
        from distributed import Lock

        other = Lock("carls-bank-kill-deadline-rehome")  # another client is re-homing the shard, and stalls
        assert other.acquire(timeout=10)
        try:
            bank.rehome_timeout = 1.0
            with pytest.raises(ShardLostError, match=r"not back within carls\.bank\.rehome-timeout \(1s\)"):
                bank.lookup("nodes", keys)
        finally:
            other.release()
        bank.rehome_timeout = REHOME_TIMEOUT
        got = bank.lookup("nodes", keys)  # once the lock is free the call re-homes the shard itself
        np.testing.assert_array_equal(got.values["embedding"], np.full((8, 4), 3.0, np.float32))
        assert bank.stats()["rehoming"]["count"] == 1
    finally:
        bank.close()


def test_a_bank_without_a_store_cannot_rehome_and_says_why(client: Any) -> None:
    a, _ = workers(client)
    bank = KnowledgeBank.create(client, [table()], n_shards=1, buckets=16, workers=[a], name="kill-nostore")
    keys = np.arange(1, 5, dtype=np.int64)
    bank.update("nodes", keys, {"embedding": np.zeros((4, 4), np.float32)})
    kill_worker(client, a)
    wait_gone(client, a)
    with pytest.raises(ShardLostError, match="log_root"):
        bank.lookup("nodes", keys)
    bank._closed = True  # its only shard is gone: nothing to close
    bank.transport.release()



@pytest.mark.slow
def test_a_worker_at_its_lifetime_hands_its_shard_over_before_it_goes(tmp_path: pathlib.Path) -> None:
    """A worker started like dask-jobqueue starts one (``--lifetime``) re-homes its shard while still up."""
    import subprocess
    import sys

    from distributed import Client, LocalCluster

    conf = {"carls.bank.rehome-timeout": f"{REHOME_TIMEOUT:g}s", "carls.bank.walltime-margin": "10s"}
    with dask.config.set(conf), LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                                             dashboard_address=":0") as cluster, Client(cluster) as client:
        proc = subprocess.Popen(
            [sys.executable, "-m", "distributed.cli.dask_worker", cluster.scheduler_address, "--nthreads", "1",
             "--no-dashboard", "--host", "127.0.0.1", "--lifetime", "20s", "--name", "walltime"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            client.wait_for_workers(2, timeout=60)
            # pick both by name, after both have registered: an address read earlier can be stale if the
            # cluster's own worker re-registers while it starts
            names = {a: w["name"] for a, w in client.scheduler_info(n_workers=-1)["workers"].items()}
            (leaves,) = [a for a, name in names.items() if name == "walltime"]
            others = [a for a in names if a != leaves]
            assert len(others) == 1, f"expected the cluster's one worker beside 'walltime', got {names}"
            (stays,) = others
            lifetime_handover(client, leaves, stays, tmp_path / "bank", timeout=90)
            assert proc.wait(timeout=60) == 0  # the worker closed gracefully
        finally:
            if proc.poll() is None:
                proc.kill()


def test_a_change_feed_cursor_survives_the_rehoming_of_a_shard(client: Any, tmp_path: pathlib.Path) -> None:
    from carls_dask.bank import ChangeWatch

    a, b = workers(client)
    spec = TableSpec("nodes", columns=(Column("embedding", shape=(4,)),), optimizer=None, initializer="zeros",
                     watch=(ChangeWatch("embedding", "l2", 0.5),))
    bank = KnowledgeBank.create(client, [spec], n_shards=2, buckets=64, workers=[a, b], name="kill-feed",
                                log_root=str(tmp_path / "bank"))
    try:
        k0, k1 = keys_of_shard(bank, 0, 10), keys_of_shard(bank, 1, 10)
        keys = np.concatenate([k0, k1])
        bank.update("nodes", keys, {"embedding": np.zeros((keys.size, 4), np.float32)})
        bank.snapshot(str(tmp_path / "bank"), step=1)
        cursor = bank.changes("nodes").cursor
        bank.update("nodes", k1[:2], {"embedding": np.ones((2, 4), np.float32)})  # moved on the shard that stays
        kill_worker(client, a)
        wait_gone(client, a)
        got = bank.changes("nodes", cursor)  # shard 0 is re-homed: its rebuilt feed answers all its keys once
        assert sorted(int(k) for k in got.keys) == sorted(int(k) for k in [*k0, *k1[:2]])
        assert bank.stats()["rehoming"]["count"] == 1
        assert bank.changes("nodes", got.cursor).keys.size == 0
    finally:
        bank.close()
