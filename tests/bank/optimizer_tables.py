"""A table per optimizer and float dtype, the bank that holds them, their gradient batches and the exact
comparison of two banks' full state (shared by the exact-restore and incremental-snapshot tests)."""

from __future__ import annotations

import numpy as np
import pytest

from carls_dask.bank import Column, KnowledgeBank, TableSpec

OPTIMIZERS = ("sgd", "adagrad", "adam")
DTYPES = ("float32", "float64")
TABLES = [f"{opt}_{dt}" for opt in OPTIMIZERS for dt in DTYPES]
DIM = 4
BUCKETS = 32


def specs() -> list[TableSpec]:
    return [
        TableSpec(
            f"{opt}_{dt}",
            columns=(
                Column("embedding", dt, (DIM,)),
                Column("bias", dt, (), ()),
                Column("label", "int64", (), ()),
            ),
            optimizer=opt,
            learning_rate=0.05,
            initializer="normal",
            init_scale=0.1,
            seed=3,
        )
        for opt in OPTIMIZERS
        for dt in DTYPES
    ]


def full_state(bank: KnowledgeBank) -> dict[str, dict[str, np.ndarray]]:
    """Every shard's rows per table, sorted by key, with maker codes turned into maker names."""
    parts: dict[str, dict[str, list[np.ndarray]]] = {}
    for st in bank.export_state():
        makers = np.array(st["meta"]["makers"], dtype=object)
        for t, arrays in st["tables"].items():
            for name, a in arrays.items():
                parts.setdefault(t, {}).setdefault(name, []).append(makers[a] if name == "prov/maker" else a)
    out = {}
    for t, arrays in parts.items():
        cat = {n: np.concatenate(v) for n, v in arrays.items()}
        order = np.argsort(cat["keys"], kind="stable")
        out[t] = {n: a[order] for n, a in cat.items()}
    return out


def assert_bit_identical(a: dict[str, dict[str, np.ndarray]], b: dict[str, dict[str, np.ndarray]],
                         skip: tuple[str, ...] = ()) -> None:
    assert sorted(a) == sorted(b)
    for t in a:
        assert sorted(a[t]) == sorted(b[t]), t
        for name in a[t]:
            if name in skip:
                continue
            x, y = a[t][name], b[t][name]
            assert x.dtype == y.dtype and x.shape == y.shape, f"{t}/{name}: {x.dtype}{x.shape} vs {y.dtype}{y.shape}"
            if x.dtype == object:  # maker names
                assert x.tolist() == y.tolist(), f"{t}/{name}"
            else:
                assert x.tobytes() == y.tobytes(), f"{t}/{name} differs"


def grads(rng: np.random.Generator, table: str, n: int) -> dict[str, np.ndarray]:
    dt = np.dtype(table.split("_")[1])
    return {"embedding": rng.normal(size=(n, DIM)).astype(dt), "bias": rng.normal(size=n).astype(dt)}


def apply_all(bank: KnowledgeBank, rng: np.random.Generator, keys: np.ndarray) -> dict[str, np.ndarray]:
    return {t: bank.apply_gradients(t, keys, grads(rng, t, keys.shape[0])) for t in TABLES}


def start(transport: str, request: pytest.FixtureRequest, n_shards: int, root: str) -> KnowledgeBank:
    if transport == "local":
        return KnowledgeBank.local(specs(), n_shards=n_shards, buckets=BUCKETS, log_root=root, log_sync=False)
    client = request.getfixturevalue("client")
    return KnowledgeBank.create(client, specs(), n_shards=n_shards, buckets=BUCKETS, log_root=root, log_sync=False)
