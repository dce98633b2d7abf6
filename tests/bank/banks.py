"""Tables and state helpers shared by the bank tests."""

from __future__ import annotations

from typing import Any

import numpy as np

from carls_dask.bank import Column, KnowledgeBank, TableSpec, nodes_table


def nodes() -> TableSpec:
    return nodes_table(dim=8, classes=3, neighbours=4, optimizer="adagrad", learning_rate=0.1,
                       initializer="normal", init_scale=0.1)


def items() -> TableSpec:
    return TableSpec("items", columns=(Column("embedding", shape=(4,)),), optimizer="adam", learning_rate=0.01,
                     initializer="uniform", init_scale=0.5)


def bank_state(bank: KnowledgeBank) -> dict[str, dict[str, np.ndarray]]:
    """Every shard's rows merged per table and sorted by key; maker codes turned into names."""
    states = bank.export_state()
    out: dict[str, dict[str, Any]] = {}
    for st in states:
        makers = np.array(st["meta"]["makers"], dtype=object)
        for t, arrays in st["tables"].items():
            cur = out.setdefault(t, {})
            for name, a in arrays.items():
                if name == "prov/maker":
                    a = makers[a]
                cur.setdefault(name, []).append(a)
    merged = {}
    for t, arrays in out.items():
        cat = {n: np.concatenate(v) for n, v in arrays.items()}
        order = np.argsort(cat["keys"])
        merged[t] = {n: a[order] for n, a in cat.items() if n != "bucket"}
    return merged


def assert_same_state(a: dict[str, dict[str, np.ndarray]], b: dict[str, dict[str, np.ndarray]]) -> None:
    assert a.keys() == b.keys()
    for t in a:
        assert a[t].keys() == b[t].keys(), t
        for name in a[t]:
            np.testing.assert_array_equal(a[t][name], b[t][name], err_msg=f"{t}/{name}")


def states_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    if a["meta"] != b["meta"]:
        return False
    for t in a["tables"]:
        if a["tables"][t].keys() != b["tables"][t].keys():
            return False
        for name, arr in a["tables"][t].items():
            if not np.array_equal(arr, b["tables"][t][name], equal_nan=True):
                return False
    return True
