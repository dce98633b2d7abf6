"""The Gaussian memory held in a bank table: same answers as in-process, exact restore with its counters."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

from carls_dask.bank import KnowledgeBank, nodes_table
from carls_dask.errors import ConfigError, InvalidBatchError
from carls_dask.memory import BankGaussianMemory, GaussianMemory, LookupMode, MemoryConfig, memory_table

CFG = MemoryConfig(dim=3, per_cluster_buffer_size=4, max_num_clusters=5, distance_to_cluster_threshold=0.3,
                   bootstrap_steps=2, min_variance=0.1)


def _batches(seed: int, n: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(4, 3)) * 6
    return [centres[rng.integers(0, 4, size=5)] + rng.normal(size=(5, 3)) * 0.3 for _ in range(n)]


def _same(a: object, b: object) -> None:
    for f in ("mean", "variance", "distance", "cluster_index"):
        np.testing.assert_array_equal(getattr(a, f), getattr(b, f), err_msg=f)


def test_bank_memory_answers_like_the_in_process_one_and_restores_exactly(tmp_path: pathlib.Path) -> None:
    root = str(tmp_path / "bank")
    local = GaussianMemory(CFG)
    batches = _batches(0, 8)
    with KnowledgeBank.local([memory_table("dm", CFG), nodes_table(dim=4, classes=2)], n_shards=2,
                             log_root=root, log_sync=False) as bank:
        mem = BankGaussianMemory(bank, "dm", CFG)
        for i, x in enumerate(batches[:4]):
            _same(mem.lookup(x, LookupMode.GROW, model_step=i), local.lookup(x, LookupMode.GROW))
        bank.snapshot(root, step=4)
        for x in batches[4:6]:          # after the snapshot: only in the delta log
            _same(mem.lookup(x, LookupMode.GROW), local.lookup(x, LookupMode.GROW))
        live = mem.state().to_arrays()
    assert live["steps"] == 6 and live["n_clusters"] >= 2
    for n_shards in (1, 3):
        with KnowledgeBank.restore_local(root, n_shards=n_shards) as back:
            again = BankGaussianMemory.open(back, "dm")
            assert again.config == CFG
            state = again.state().to_arrays()
            assert state["steps"] == live["steps"] and state["n_clusters"] == live["n_clusters"]
            np.testing.assert_array_equal(state["buffers"], live["buffers"])
            # the counters came back: the next grow calls go on exactly as in the live memory
            twin = GaussianMemory(CFG, local.state)
            for x in batches[6:]:
                _same(again.lookup(x, LookupMode.GROW), twin.lookup(x, LookupMode.GROW))


def test_bank_memory_on_actor_shards(client: object) -> None:
    local = GaussianMemory(CFG)
    with KnowledgeBank.create(client, [memory_table("dm", CFG)], n_shards=2) as bank:
        mem = BankGaussianMemory(bank, "dm", CFG)
        for x in _batches(1, 4):
            _same(mem.lookup(x, LookupMode.GROW), local.lookup(x, LookupMode.GROW))
        _same(mem.lookup(_batches(2, 1)[0], LookupMode.LOOKUP), local.lookup(_batches(2, 1)[0], 1))


def test_other_settings_or_a_foreign_table_are_refused_and_bad_input_writes_nothing() -> None:
    other = MemoryConfig(dim=3, per_cluster_buffer_size=4, max_num_clusters=5, min_variance=0.5)
    with KnowledgeBank.local([memory_table("dm", CFG), nodes_table(dim=4, classes=2)]) as bank:
        with pytest.raises(ConfigError, match="holds no memory yet"):
            BankGaussianMemory.open(bank, "dm")
        mem = BankGaussianMemory(bank, "dm", CFG)
        with pytest.raises(ConfigError, match="holds a memory made with"):
            BankGaussianMemory(bank, "dm", other)
        with pytest.raises(ConfigError, match="table 'nodes' has columns"):
            BankGaussianMemory(bank, "nodes", CFG)
        mem.lookup([[0.0, 0.0, 0.0]], LookupMode.UPDATE)
        before = mem.state().to_arrays()
        for bad, mode in (([[1.0, 2.0]], 2), ([[np.nan, 0.0, 0.0]], 3), ([[1.0, 2.0, 3.0]], 7)):
            with pytest.raises((ConfigError, InvalidBatchError)):
                mem.lookup(bad, mode)
        after = mem.state().to_arrays()
        assert after["steps"] == before["steps"] == 1
        np.testing.assert_array_equal(after["buffers"], before["buffers"])
