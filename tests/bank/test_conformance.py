"""One behaviour, two transports: every test runs on a bank of Dask actors (``KnowledgeBank.create``
on the test LocalCluster) and on a bank of in-process shards (``KnowledgeBank.local``)."""

from __future__ import annotations

import pathlib
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pytest

from carls_dask.bank import Column, KnowledgeBank, ShardCore, TableSpec
from carls_dask.bank.hashing import to_int64_keys
from carls_dask.errors import (
    InvalidBatchError,
    InvalidDTypeError,
    InvalidShapeError,
    StoreLockedError,
    UnknownColumnError,
    UnknownTableError,
)
from tests.bank.banks import assert_same_state, bank_state, items, nodes

TRANSPORTS = ("dask", "local")


class Maker:
    """Creates and restores banks of one transport, and closes them at the end of the test."""

    def __init__(self, kind: str, request: pytest.FixtureRequest) -> None:
        self.kind = kind
        self.client = request.getfixturevalue("client") if kind == "dask" else None
        self.made: list[KnowledgeBank] = []

    def create(self, tables: list[TableSpec], **kwargs: Any) -> KnowledgeBank:
        if self.client is not None:
            bank = KnowledgeBank.create(self.client, tables, **kwargs)
        else:
            bank = KnowledgeBank.local(tables, **kwargs)
        self.made.append(bank)
        return bank

    def restore(self, root: str, **kwargs: Any) -> KnowledgeBank:
        if self.client is not None:
            bank = KnowledgeBank.restore(self.client, root, **kwargs)
        else:
            bank = KnowledgeBank.restore_local(root, **kwargs)
        self.made.append(bank)
        return bank

    def close(self) -> None:
        for bank in self.made:
            bank.close()


@pytest.fixture(params=TRANSPORTS)
def make(request: pytest.FixtureRequest) -> Iterator[Maker]:
    m = Maker(request.param, request)
    yield m
    m.close()


@pytest.fixture
def bank(make: Maker) -> KnowledgeBank:
    return make.create([nodes(), items()], n_shards=3, buckets=64)


def test_the_transport_is_the_one_asked_for(make: Maker, bank: KnowledgeBank) -> None:
    assert bank.transport.kind == make.kind and bank.n_shards == 3
    assert bank.stats()["transport"] == make.kind
    assert make.kind in repr(bank)


def test_sharded_bank_matches_a_single_core(bank: KnowledgeBank) -> None:
    ref = ShardCore([nodes(), items()], buckets=64)
    rng = np.random.default_rng(0)
    keys = rng.integers(-(10**9), 10**9, size=500)
    batch = np.r_[keys, keys[:50]]  # duplicates, spread over all shards
    r = bank.lookup("nodes", batch, insert=True)
    e = ref.lookup("nodes", batch, insert=True)
    assert bank.shard_of(batch).tolist().count(2) > 0
    for c in e.values:
        np.testing.assert_array_equal(r.values[c], e.values[c])
    np.testing.assert_array_equal(r.frequency, e.frequency)
    g = rng.normal(size=(550, 8)).astype(np.float32)
    np.testing.assert_array_equal(bank.apply_gradients("nodes", batch, g), ref.apply_gradients("nodes", batch, g))
    vals = {"confidence": rng.random(550).astype(np.float32), "pseudo_label": rng.integers(0, 3, 550)}
    assert bank.update("nodes", batch, vals, model_step=4, maker="labeler") == 500
    ref.update("nodes", batch, vals, model_step=4, maker="labeler")
    r, e = bank.lookup("nodes", batch), ref.lookup("nodes", batch)
    for c in e.values:
        np.testing.assert_array_equal(r.values[c], e.values[c])
    np.testing.assert_array_equal(r.version, e.version)
    assert (r.model_step == 4).all()
    assert bank.size("nodes") == 500 and bank.size() == 500
    assert sorted(bank.keys("nodes").tolist()) == sorted(set(keys.tolist()))
    assert bank.delete("nodes", keys[:10]).all() and bank.size("nodes") == 490
    assert bank.contains("nodes", keys[:12]).tolist() == [False] * 10 + [True] * 2
    missing = bank.lookup("nodes", keys[:12])
    assert missing.found.tolist() == [False] * 10 + [True] * 2
    st = bank.stats()
    assert st["tables"]["nodes"]["rows"] == 490 and len(st["shards"]) == 3
    assert st["rehoming"] == {"count": 0, "generation": [0, 0, 0], "events": []}
    bank.set_step(7)


def test_string_keys_route_and_read_back(bank: KnowledgeBank) -> None:
    names = [f"paper-{i}" for i in range(40)]
    bank.update("items", names, {"embedding": np.arange(160, dtype=np.float32).reshape(40, 4)})
    r = bank.lookup("items", list(reversed(names)))
    assert r.found.all()
    np.testing.assert_array_equal(r.values["embedding"], np.arange(160, dtype=np.float32).reshape(40, 4)[::-1])
    assert bank.contains("items", to_int64_keys(names[:3])).all()
    assert bank.delete("items", names[:2]).all() and bank.size("items") == 38


def test_top_k_and_sampling_merge_across_shards(bank: KnowledgeBank) -> None:
    rng = np.random.default_rng(5)
    keys = np.arange(1000, 1200)
    emb = rng.normal(size=(200, 4)).astype(np.float32)
    bank.update("items", keys, {"embedding": emb})
    ref = ShardCore([items()], buckets=64)
    ref.update("items", keys, {"embedding": emb})
    q = rng.normal(size=(3, 4)).astype(np.float32)
    for metric in ("dot", "cosine"):
        k_bank, s_bank = bank.top_k("items", q, 7, metric=metric)
        k_ref, s_ref = ref.top_k("items", q, 7, metric=metric)
        np.testing.assert_array_equal(k_bank, k_ref)
        np.testing.assert_allclose(s_bank, s_ref, rtol=1e-6)
    with pytest.raises(InvalidBatchError, match="k=500"):
        bank.top_k("items", q, 500)
    bank.lookup("items", np.repeat(keys[:3], [30, 20, 10]), insert=True)
    s = bank.sample_negatives("items", 20, sampler="log_uniform", unique=True, true_keys=keys[:2], seed=3)
    assert np.unique(s.keys).size == 20 and np.isin(s.keys, keys).all()
    assert s.true_expected_count[0] > s.true_expected_count[1] > 0


def plain() -> TableSpec:
    return TableSpec("plain", columns=(Column("embedding", shape=(4,)), Column("label", "int64", (), ())),
                     optimizer=None, initializer="zeros", init_scale=0.0)


#: (what, call, error type, part of the message): bad batches every transport rejects alike.
BAD: list[tuple[str, Callable[[KnowledgeBank, np.ndarray], Any], type, str]] = [
    ("NaN values", lambda b, k: b.update("nodes", k, {"embedding": np.full((k.size, 8), np.nan, np.float32)}),
     InvalidBatchError, "NaN"),
    ("values not a dict", lambda b, k: b.update("nodes", k, np.zeros((k.size, 8))), InvalidBatchError,
     "non-empty dict"),
    ("unknown column", lambda b, k: b.update("nodes", k, {"colour": np.zeros(k.size)}), UnknownColumnError,
     "'colour'"),
    ("model_step not an int", lambda b, k: b.update("nodes", k, {"confidence": np.zeros(k.size)}, model_step=1.5),
     InvalidDTypeError, "model_step"),
    ("maker not a str", lambda b, k: b.update("nodes", k, {"confidence": np.zeros(k.size)}, maker=3),
     InvalidDTypeError, "maker must be a str"),
    ("gradient shape", lambda b, k: b.apply_gradients("nodes", k, np.ones((k.size, 9))), InvalidShapeError,
     r"\(300, 9\)"),
    ("gradients of an int column", lambda b, k: b.apply_gradients("nodes", k, {"pseudo_label": np.ones(k.size)}),
     InvalidDTypeError, "float column"),
    ("no gradients", lambda b, k: b.apply_gradients("nodes", k, {}), InvalidBatchError, "gradients must be"),
    ("bad learning rate", lambda b, k: b.apply_gradients("nodes", k, np.ones((k.size, 8)), learning_rate=-1.0),
     InvalidBatchError, "learning_rate"),
    ("no optimizer", lambda b, k: b.apply_gradients("plain", k, np.ones((k.size, 4))), InvalidBatchError,
     "no optimizer"),
    ("unknown table", lambda b, k: b.lookup("edges", k), UnknownTableError, "'edges'"),
    ("empty batch", lambda b, k: b.lookup("nodes", [], insert=True), InvalidBatchError, "empty"),
    ("float keys", lambda b, k: b.lookup("nodes", k.astype(float), insert=True), InvalidDTypeError, "keys"),
    ("negative staleness", lambda b, k: b.lookup("nodes", k, max_staleness=-1), InvalidBatchError,
     "max_staleness"),
    ("sample size not an int", lambda b, k: b.sample_negatives("nodes", 2.5), InvalidDTypeError, "sample size"),
    ("query shape", lambda b, k: b.top_k("nodes", np.ones((2, 5)), 3), InvalidShapeError, "query has shape"),
    ("query with NaN", lambda b, k: b.top_k("nodes", np.full(8, np.nan), 3), InvalidBatchError, "NaN"),
    ("unknown metric", lambda b, k: b.top_k("nodes", np.ones(8), 3, metric="l1"), InvalidBatchError, "metric"),
    ("k not positive", lambda b, k: b.top_k("nodes", np.ones(8), 0), InvalidBatchError, "k must be"),
]


def _raised(make: Maker) -> dict[str, tuple[type, str]]:
    """Each bad batch's error on a fresh bank of ``make``'s transport, checking that nothing changed."""
    bank = make.create([nodes(), plain()], n_shards=2, buckets=32)
    keys = np.arange(300)
    bank.lookup("nodes", keys, insert=True)
    bank.lookup("plain", keys, insert=True)
    before = bank_state(bank)
    out = {}
    for what, call, error, needle in BAD:
        with pytest.raises(error, match=needle) as info:
            call(bank, keys)
        out[what] = (type(info.value), str(info.value))
    assert_same_state(before, bank_state(bank))
    return out


def test_bad_batches_are_rejected_and_change_nothing(make: Maker) -> None:
    _raised(make)


def test_both_transports_reject_bad_batches_with_the_same_error(request: pytest.FixtureRequest) -> None:
    dask, local = Maker("dask", request), Maker("local", request)
    try:
        assert _raised(dask) == _raised(local)
    finally:
        dask.close()
        local.close()


def test_snapshot_and_delta_log_restore_onto_another_shard_count(make: Maker, tmp_path: pathlib.Path) -> None:
    root = str(tmp_path / "bank")
    bank = make.create([nodes(), items()], n_shards=2, buckets=64, log_root=root, log_sync=False)
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 10**6, size=400)
    bank.lookup("nodes", keys, insert=True)
    bank.apply_gradients("nodes", keys[:200], rng.normal(size=(200, 8)))
    bank.update("nodes", keys[:50], {"logits": rng.normal(size=(50, 3))}, model_step=3, maker="teacher")
    bank.lookup("items", np.arange(30), insert=True)
    bank.apply_gradients("items", np.arange(30), rng.normal(size=(30, 4)))
    v1 = bank.snapshot(root, step=10)
    at_v1 = bank_state(bank)
    # after the snapshot: only the delta log has these
    bank.apply_gradients("nodes", keys[100:300], rng.normal(size=(200, 8)))
    bank.update("nodes", keys[300:320], {"difficulty": rng.random(20)}, model_step=11, maker="scorer")
    bank.delete("nodes", keys[:5])
    bank.lookup("nodes", np.arange(5), insert=True)
    bank.apply_gradients("items", np.arange(10), rng.normal(size=(10, 4)))
    final = bank_state(bank)
    with pytest.raises(StoreLockedError):  # one writer per shard's log
        make.restore(root, n_shards=2, log_root=root)
    bank.close()

    three = make.restore(root, n_shards=3)
    assert three.n_shards == 3 and three.transport.kind == make.kind
    assert_same_state(final, bank_state(three))
    r = three.lookup("nodes", keys[300:302])
    assert r.model_step.tolist() == [11, 11]
    one = make.restore(root, n_shards=1, version=v1, replay_log=False)
    assert_same_state(at_v1, bank_state(one))


def test_a_closed_bank_refuses_calls(bank: KnowledgeBank) -> None:
    bank.close()
    bank.close()  # idempotent
    with pytest.raises(Exception, match="is closed"):
        bank.size()
