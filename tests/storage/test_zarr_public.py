"""Every Zarr array the project writes reads back bit for bit through zarr-python's public ``zarr.open``.

Snapshot chunks of uncompressed arrays are written by :mod:`carls_dask.storage.chunkio`, not by Zarr; these
tests hold them to Zarr's own reading: snapshot arrays (with and without checksums, compressed, with a
padded last chunk, before and after a restore onto another shard count) and the metric store.
"""

from __future__ import annotations

import json
import pathlib
from typing import Any

import numpy as np
import pytest
import zarr

from carls_dask.storage.bankstore import BankReplay
from carls_dask.storage.manifest import read_manifest
from carls_dask.storage.metrics import MetricWriter
from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot, write_shard
from tests.storage.states import assert_same, make_states, merged, sort_by_key

BUCKETS = 64


def _with_step_slot(states: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add a per-row int64 ``slot/embedding/step`` (Adam's step count) to every shard's rows."""
    for st in states:
        rows = st["tables"]["nodes"]
        rows["slot/embedding/step"] = np.arange(rows["keys"].shape[0], dtype=np.int64) * 3 + 1
    return states


def _snapshot(root: pathlib.Path, states: list[dict[str, Any]], step: int, **kw: Any) -> int:
    h = begin_snapshot(root, step, **kw)
    for st in states:
        write_shard(h, st, delta_seq=0)
    return int(commit_snapshot(h, {"n_shards": len(states)})["version"])


def _stored(state: dict[str, Any], table: str) -> dict[str, np.ndarray]:
    """A shard's arrays as the snapshot stores them: rows in bucket order, plus ``bucket_offsets``."""
    rows = state["tables"][table]
    order = np.argsort(rows["bucket"], kind="stable")
    out = {k: np.asarray(v)[order] for k, v in rows.items()}
    b = out["bucket"].astype(np.int64)
    out["bucket_offsets"] = np.searchsorted(b, np.arange(int(state["meta"]["buckets"]) + 1)).astype(np.int64)
    return out


def _check_with_zarr_open(root: pathlib.Path, version: int, states: list[dict[str, Any]]) -> int:
    """Open every array of every shard with ``zarr.open``; compare with what was written. Returns arrays checked."""
    man = read_manifest(root, version)
    checked = 0
    for st in states:
        shard = int(st["meta"]["shard"])
        zroot = root / man["path"] / f"shard-{shard:04d}.zarr"
        for table in st["tables"]:
            want = _stored(st, table)
            assert set(man["shards"][str(shard)]["tables"][table]["arrays"]) | {"bucket_offsets"} == set(want)
            for name, expected in want.items():
                z = zarr.open(str(zroot / table / name), mode="r")
                assert isinstance(z, zarr.Array)
                got = np.asarray(z[...])
                assert got.dtype == expected.dtype and got.shape == expected.shape, name
                assert got.tobytes() == expected.tobytes(), f"shard {shard}, {table}/{name}"
                checked += 1
    return checked


@pytest.mark.parametrize(("compressor", "checksum"), [("none", True), ("none", False), ("zstd", True)])
def test_zarr_open_reads_snapshot_arrays_before_and_after_a_restore_onto_other_shards(
    tmp_path: pathlib.Path, compressor: str, checksum: bool
) -> None:
    root = tmp_path / "bank"
    states = _with_step_slot(make_states(1030, n_shards=2, buckets=BUCKETS, seed=11))
    kw = {"chunk_rows": 100, "compressor": compressor, "checksum": checksum}  # 1030 rows: a padded last chunk
    v1 = _snapshot(root, states, step=1, **kw)
    assert _check_with_zarr_open(root, v1, states) == 2 * (len(states[0]["tables"]["nodes"]) + 1)
    # restore onto three shards through the store's own replay, snapshot those, and read them with zarr again
    restored = []
    for s in range(3):
        owned = [b for b in range(BUCKETS) if b % 3 == s]
        replay = BankReplay(root, v1, buckets=owned)
        parts = [batch.arrays for batch in replay]
        rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
        assert set(np.unique(rows["bucket"]).tolist()) <= set(owned)
        restored.append({
            "meta": {**states[0]["meta"], "shard": s, "n_shards": 3, "owned_buckets": owned,
                     "makers": list(replay.makers)},
            "tables": {"nodes": rows},
        })
    v2 = _snapshot(root, restored, step=2, **kw)
    assert _check_with_zarr_open(root, v2, restored) == 3 * (len(states[0]["tables"]["nodes"]) + 1)
    union = {k: np.concatenate([r["tables"]["nodes"][k] for r in restored]) for k in restored[0]["tables"]["nodes"]}
    assert_same(sort_by_key(union), merged(states))  # the per-row step slot included


def test_zarr_open_reads_the_metric_store(tmp_path: pathlib.Path) -> None:
    path = tmp_path / "metrics.zarr"
    steps = np.arange(10, 10 + 37 * 5, 5, dtype=np.int64)
    loss = np.linspace(2.0, 0.1, steps.size)
    hist = np.arange(steps.size * 3, dtype=np.float64).reshape(steps.size, 3) / 7.0
    with MetricWriter(path, run="zarr-open", flush_rows=8, chunk_steps=16) as writer:
        for i, step in enumerate(steps):
            values: dict[str, Any] = {"loss": loss[i]}
            if i >= 5:  # a series that first appears mid-run reads as NaN before
                values["hist"] = hist[i]
            writer.append(int(step), **values)
    index = json.loads((path / "metrics.json").read_text())
    n = int(index["rows"])
    assert n == steps.size
    step_arr = zarr.open(str(path / "step"), mode="r")
    assert isinstance(step_arr, zarr.Array)
    assert np.asarray(step_arr[:n]).tobytes() == steps.tobytes()
    wall = np.asarray(zarr.open(str(path / "wall_time"), mode="r")[:n])  # type: ignore[index]
    assert wall.dtype == np.float64 and np.all(np.diff(wall) >= 0)
    series = index["series"]
    got_loss = np.asarray(zarr.open(str(path / series["loss"]["path"]), mode="r")[:n])  # type: ignore[index]
    assert got_loss.tobytes() == loss.tobytes()
    got_hist = np.asarray(zarr.open(str(path / series["hist"]["path"]), mode="r")[:n])  # type: ignore[index]
    want_hist = hist.copy()
    want_hist[:5] = np.nan
    assert got_hist.tobytes() == want_hist.tobytes()
