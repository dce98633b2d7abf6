"""Tables and bank-state helpers shared by the layer tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from carls_dask.bank import Column, KnowledgeBank, TableSpec

DIM = 8


def table(name: str = "words", optimizer: str | None = "sgd", *, dim: int = DIM, lr: float = 0.05,
          initializer: str = "normal", scale: float = 0.5, **kwargs: Any) -> TableSpec:
    """A one-column embedding table."""
    return TableSpec(name, columns=(Column("embedding", shape=(dim,)),), optimizer=optimizer, learning_rate=lr,
                     initializer=initializer, init_scale=scale, **kwargs)


def rows_by_key(bank: KnowledgeBank, name: str, keys: np.ndarray, what: str = "col/embedding") -> np.ndarray:
    """``what`` (a column or ``slot/<column>/<slot>``) of ``keys`` read from every shard's exported state."""
    keys = np.asarray(keys, dtype=np.int64)
    parts = [st["tables"][name] for st in bank.export_state()]
    have = np.concatenate([p["keys"] for p in parts])
    vals = np.concatenate([np.asarray(p[what]) for p in parts])
    order = np.argsort(have)
    pos = np.searchsorted(have[order], keys)
    assert np.array_equal(have[order][pos], keys), "a key is missing from the bank"
    return vals[order][pos]
