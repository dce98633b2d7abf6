"""Optimizer slots of every kind a bank keeps round-trip bit for bit: float64 slots and Adam's int64 per-row step."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from carls_dask.storage import open_bank
from carls_dask.storage.deltalog import DeltaLog, replay
from carls_dask.storage.snapshots import (
    begin_snapshot,
    commit_snapshot,
    read_manifest,
    read_snapshot,
    write_shard,
)
from tests.storage.states import assert_same, make_states, merged, sort_by_key


def adam_float64_states(n_rows: int, n_shards: int, seed: int) -> list[dict[str, Any]]:
    """States of an Adam table whose embedding is float64: float64 ``m``/``v`` and an int64 ``step`` per row."""
    states = make_states(n_rows, n_shards=n_shards, buckets=64, seed=seed)
    rng = np.random.default_rng(seed)
    for st in states:
        spec = st["meta"]["tables"]["nodes"]
        spec["optimizer"] = "adam"
        spec["columns"] = [dict(c, dtype="float64") if c["name"] == "embedding" else c for c in spec["columns"]]
        rows = st["tables"]["nodes"]
        n = rows["keys"].shape[0]
        del rows["slot/embedding/accum"]
        rows["col/embedding"] = rng.standard_normal((n, 8))  # float64
        rows["slot/embedding/m"] = rng.standard_normal((n, 8)) * 1e-9
        rows["slot/embedding/v"] = rng.random((n, 8)) * 1e-12
        rows["slot/embedding/step"] = rng.integers(0, 1 << 40, n).astype(np.int64)
        rows["slot/logits/step"] = rng.integers(0, 5, n).astype(np.int64)
    return states


def test_snapshot_round_trips_float64_and_int64_step_slots(tmp_path: pathlib.Path) -> None:
    states = adam_float64_states(900, n_shards=2, seed=3)
    h = begin_snapshot(tmp_path, 4, chunk_rows=128)
    for st in states:
        write_shard(h, st, delta_seq=0)
    commit_snapshot(h, {"name": "bank", "n_shards": 2, "tables": {"nodes": states[0]["meta"]["tables"]["nodes"]}})
    want = merged(states)
    assert_same(sort_by_key(read_snapshot(tmp_path)["nodes"]), want)
    expect = {"nodes": {"slot/embedding/step": ("int64", ()), "slot/embedding/m": ("float64", (8,))}}
    # a restore onto another shard count reads the rows of some buckets: the same bytes
    part = read_snapshot(tmp_path, buckets=range(0, 64, 3), expect=expect)["nodes"]
    mine = np.isin(want["bucket"], np.arange(0, 64, 3))
    assert_same(sort_by_key(part), {k: v[mine] for k, v in want.items()})
    assert part["slot/embedding/step"].dtype == np.int64 and part["slot/embedding/step"].ndim == 1
    arrays = read_manifest(tmp_path)["tables"]["nodes"]["arrays"]
    assert arrays["slot/embedding/step"] == {"dtype": "<i8", "shape": []}
    assert arrays["slot/embedding/m"] == {"dtype": "<f8", "shape": [8]}
    ds = open_bank(tmp_path).sortby("key").load()
    assert ds["slot_embedding_step"].dims == ("key",) and ds["slot_embedding_m"].dims == ("key", "dim")
    assert ds["slot_embedding_step"].values.tobytes() == want["slot/embedding/step"].tobytes()
    assert ds["slot_embedding_v"].values.tobytes() == want["slot/embedding/v"].tobytes()
    # rows logged after the snapshot carry their step too, and the view merges them
    later = {k: v[:10].copy() for k, v in want.items()}
    later["slot/embedding/step"] += 1
    later["slot/embedding/m"] *= 2
    later["prov/maker"][:] = 0
    with DeltaLog(tmp_path, 0) as log:
        log.append(5, "nodes", "upsert", later)
    ds = open_bank(tmp_path).sortby("key").load()
    assert ds.attrs["delta"] == 1
    assert ds["slot_embedding_step"].values[:10].tobytes() == later["slot/embedding/step"].tobytes()
    assert ds["slot_embedding_m"].values[:10].tobytes() == later["slot/embedding/m"].tobytes()
    assert ds["slot_embedding_step"].values[10:].tobytes() == want["slot/embedding/step"][10:].tobytes()


def test_delta_log_round_trips_float64_and_int64_step_slots(tmp_path: pathlib.Path) -> None:
    rows = adam_float64_states(40, n_shards=1, seed=4)[0]["tables"]["nodes"]
    with DeltaLog(tmp_path, 0) as log:
        log.append(1, "nodes", "upsert", rows)
    (rec,) = list(replay(tmp_path))
    assert_same(rec.arrays, rows)
