"""Builders of shard states in the agreed export format, made with numpy only (no bank needed), and the
snapshots of a store written from them."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np

from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot, write_shard

_M64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def splitmix64(keys: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer on int64 keys (as uint64)."""
    with np.errstate(over="ignore"):
        z = keys.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def bucket_of(keys: np.ndarray, buckets: int) -> np.ndarray:
    return (splitmix64(keys) % np.uint64(buckets)).astype(np.int32)


TABLE_SPEC: dict[str, Any] = {
    "name": "nodes",
    "columns": [
        {"name": "embedding", "dtype": "float32", "shape": [8], "dims": ["dim"]},
        {"name": "logits", "dtype": "float32", "shape": [3], "dims": ["class"]},
        {"name": "pseudo_label", "dtype": "int64", "shape": [], "dims": []},
        {"name": "neighbours", "dtype": "int64", "shape": [4], "dims": ["neighbour"]},
    ],
    "optimizer": "adagrad",
    "learning_rate": 0.1,
}


def table_rows(keys: np.ndarray, buckets: int, seed: int, dim: int = 8, makers: int = 2) -> dict[str, np.ndarray]:
    """Rows of a "nodes" table for ``keys`` with values that depend on ``seed``."""
    rng = np.random.default_rng(seed)
    n = keys.shape[0]
    return {
        "keys": keys.astype(np.int64),
        "bucket": bucket_of(keys, buckets),
        "frequency": rng.integers(0, 100, n).astype(np.int64),
        "prov/version": rng.integers(1, 10, n).astype(np.int64),
        "prov/model_step": rng.integers(0, 1000, n).astype(np.int64),
        "prov/maker": rng.integers(0, makers, n).astype(np.int32),
        "prov/wall_time": 1.7e9 + rng.random(n),
        "col/embedding": rng.standard_normal((n, dim)).astype(np.float32),
        "col/logits": rng.standard_normal((n, 3)).astype(np.float32),
        "col/pseudo_label": rng.integers(0, 3, n).astype(np.int64),
        "col/neighbours": rng.integers(0, 1 << 40, (n, 4)).astype(np.int64),
        "slot/embedding/accum": rng.random((n, dim)).astype(np.float32),
    }


def make_states(
    n_rows: int, n_shards: int = 2, buckets: int = 64, seed: int = 0, dim: int = 8, maker_names=None
) -> list[dict[str, Any]]:
    """Shard states of one bank: ``n_rows`` distinct keys split by ``bucket % n_shards``."""
    rng = np.random.default_rng(seed)
    keys = rng.choice(np.int64(1) << 50, size=n_rows, replace=False).astype(np.int64)
    b = bucket_of(keys, buckets)
    states = []
    for s in range(n_shards):
        sk = keys[b % n_shards == s]
        names = maker_names[s] if maker_names else [f"maker-{s}-a", "common"]
        spec = dict(TABLE_SPEC, columns=[dict(c, shape=[dim] if c["name"] == "embedding" else c["shape"]) for c in TABLE_SPEC["columns"]])
        states.append(
            {
                "meta": {
                    "format": 1,
                    "shard": s,
                    "n_shards": n_shards,
                    "buckets": buckets,
                    "owned_buckets": [x for x in range(buckets) if x % n_shards == s],
                    "tables": {"nodes": spec},
                    "makers": list(names),
                    "version": 7,
                    "optimizer": {"nodes": {"embedding": {"step": 11 + s}}},
                },
                "tables": {"nodes": table_rows(sk, buckets, seed * 100 + s, dim, makers=len(names))},
            }
        )
    return states


def merged(states: list[dict[str, Any]], table: str = "nodes") -> dict[str, np.ndarray]:
    """All shards' rows of ``table``, maker codes mapped to the union list, sorted by key."""
    makers: list[str] = []
    for st in states:
        for m in st["meta"]["makers"]:
            if m not in makers:
                makers.append(m)
    parts: dict[str, list[np.ndarray]] = {}
    for st in states:
        cmap = np.array([makers.index(m) for m in st["meta"]["makers"]], dtype=np.int32)
        for k, v in st["tables"][table].items():
            parts.setdefault(k, []).append(cmap[v] if k == "prov/maker" else v)
    out = {k: np.concatenate(v) for k, v in parts.items()}
    return sort_by_key(out)


def sort_by_key(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    order = np.argsort(arrays["keys"], kind="stable")
    return {k: v[order] for k, v in arrays.items()}


def assert_same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    """Bit-for-bit equality of two row sets (same names, dtypes, shapes and bytes)."""
    assert sorted(a) == sorted(b)
    for k in a:
        assert a[k].dtype == b[k].dtype, k
        assert a[k].shape == b[k].shape, k
        assert a[k].tobytes() == b[k].tobytes(), k


def snapshot(root: pathlib.Path, states: list, step: int = 0, meta: dict[str, Any] | None = None,
             **kw: Any) -> dict:
    """Commit ``states`` (one per shard) as a snapshot of the store at ``root``; returns its manifest entry."""
    h = begin_snapshot(root, step, **kw)
    for st in states:
        write_shard(h, st, delta_seq=0)
    return commit_snapshot(h, meta if meta is not None else {"name": "bank", "n_shards": len(states)})


def nodes_store(root: pathlib.Path, versions: int = 1) -> None:
    """A store of ``versions`` snapshots (steps 10, 20, ...) of 300 "nodes" rows on 2 shards, as the CLI reads them."""
    for v in range(versions):
        snapshot(root, make_states(300, n_shards=2, seed=v), 10 * (v + 1),
                 {"n_shards": 2, "tables": {"nodes": TABLE_SPEC}})
