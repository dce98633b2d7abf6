"""The pure shard core: CARLS parity numbers, provenance, initializers, bad input, export/import."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from carls_dask.bank.core import ShardCore, gather_rows
from carls_dask.bank.hashing import bucket_of, hash_string, to_int64_keys
from carls_dask.bank.schema import Column, TableSpec, nodes_table
from carls_dask.errors import (
    InvalidBatchError,
    InvalidDTypeError,
    InvalidShapeError,
    UnknownColumnError,
    UnknownTableError,
)
from tests.bank.banks import states_equal


class Clock:
    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def spec2(optimizer: str | None = "sgd", initializer: str = "zeros", scale: float = 0.0, **kw: Any) -> TableSpec:
    return TableSpec(
        "emb", columns=(Column("embedding", shape=(2,)),), optimizer=optimizer, learning_rate=0.1,
        initializer=initializer, init_scale=scale, **kw,
    )


def nodes(**kw: Any) -> TableSpec:
    return nodes_table(dim=8, classes=3, neighbours=4, optimizer="adagrad", learning_rate=0.1,
                       initializer="normal", init_scale=0.1, **kw)



# -- CARLS parity --------------------------------------------------------------------------------------
def test_lookup_with_insert_allocates_and_counts_every_occurrence() -> None:
    core = ShardCore([spec2()])
    r = core.lookup("emb", np.array([1]), insert=True)
    assert r.found.tolist() == [True] and r.frequency.tolist() == [1]
    assert np.array_equal(r.values["embedding"], np.zeros((1, 2), np.float32))
    r = core.lookup("emb", np.array([1, 2]), insert=True)
    assert r.frequency.tolist() == [2, 1]
    r = core.lookup("emb", np.array([2, 2, 7, 2]), insert=True)
    assert r.frequency.tolist() == [4, 4, 1, 4]
    assert core.size("emb") == 3
    # a read-only lookup neither allocates nor counts
    r = core.lookup("emb", np.array([1, 99]))
    assert r.found.tolist() == [True, False] and r.frequency.tolist() == [2, 0]
    assert core.size("emb") == 3
    assert core.contains("emb", np.array([99, 7])).tolist() == [False, True]


def test_missing_keys_are_reported_by_mask_with_zero_rows() -> None:
    core = ShardCore([spec2()])
    core.update("emb", np.array([5]), {"embedding": np.array([[1.0, 2.0]])})
    r = core.lookup("emb", np.array([4, 5, 6]))
    assert r.found.tolist() == [False, True, False]
    assert r.values["embedding"].tolist() == [[0, 0], [1, 2], [0, 0]]
    assert np.isnan(r.age[[0, 2]]).all() and r.age[1] >= 0
    assert r.model_step.tolist() == [-1, 0, -1]


def test_sgd_numbers_match_carls() -> None:
    core = ShardCore([spec2("sgd")])
    core.update("emb", np.array([1]), {"embedding": np.array([[1.0, 2.0]])})
    core.lookup("emb", np.array([1]), insert=True)  # frequency 1, kept by the gradient step
    found = core.apply_gradients("emb", np.array([1]), np.array([[1.0, 1.0]]))
    assert found.tolist() == [True]
    r = core.lookup("emb", np.array([1]))
    np.testing.assert_allclose(r.values["embedding"], [[0.9, 1.9]], rtol=1e-6)
    assert r.frequency.tolist() == [1]


def test_adagrad_numbers_match_carls_and_slots_persist() -> None:
    core = ShardCore([spec2("adagrad")])
    core.update("emb", np.array([1]), {"embedding": np.array([[1.0, 2.0]])})
    core.apply_gradients("emb", np.array([1]), np.array([[1.0, 1.0]]))
    v1 = core.lookup("emb", np.array([1])).values["embedding"]
    np.testing.assert_allclose(v1, [[0.9046537, 1.9046538]], rtol=1e-6)
    core.apply_gradients("emb", np.array([1]), np.array([[1.0, 1.0]]))
    v2 = core.lookup("emb", np.array([1])).values["embedding"]
    # accumulator 0.1 + 1 + 1 = 2.1 on the second step
    np.testing.assert_allclose(v2, v1 - 0.1 / np.sqrt(2.1), rtol=1e-6)
    acc = core.export_state()["tables"]["emb"]["slot/embedding/accumulator"]
    np.testing.assert_allclose(acc, [[2.1, 2.1]], rtol=1e-6)


def test_zero_init_sgd_matches_carls_ramp() -> None:
    spec = TableSpec("e1", columns=(Column("embedding", shape=(1,)),), optimizer="sgd", learning_rate=0.1,
                     initializer="zeros", init_scale=0.0)
    core = ShardCore([spec])
    keys = np.arange(6)
    core.lookup("e1", keys, insert=True)
    core.apply_gradients("e1", keys, np.arange(1, 7, dtype=np.float32)[:, None])
    np.testing.assert_allclose(core.lookup("e1", keys).values["embedding"][:, 0], -0.1 * np.arange(1, 7), rtol=1e-6)


def test_duplicate_gradients_are_summed() -> None:
    core = ShardCore([spec2("sgd")])
    core.lookup("emb", np.array([1, 2]), insert=True)
    g = np.array([[1.0, 0.0], [2.0, 0.0], [0.0, 4.0], [0.5, 0.5]])
    found = core.apply_gradients("emb", np.array([1, 2, 1, 3]), g)
    assert found.tolist() == [True, True, True, False]  # key 3 is absent: skipped, as in CARLS
    r = core.lookup("emb", np.array([1, 2]))
    np.testing.assert_allclose(r.values["embedding"], [[-0.1, -0.4], [-0.2, 0.0]], rtol=1e-6)
    assert r.version.tolist() == [2, 2]
    assert core.size("emb") == 2


def test_adam_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    spec = TableSpec("a", columns=(Column("embedding", shape=(3,)),), optimizer="adam", learning_rate=0.05,
                     initializer="zeros", init_scale=0.0)
    core = ShardCore([spec])
    w0 = np.array([[0.5, -1.0, 2.0]], np.float32)
    core.update("a", np.array([9]), {"embedding": w0})
    p = torch.nn.Parameter(torch.tensor(w0))
    opt = torch.optim.Adam([p], lr=0.05, betas=(0.9, 0.999), eps=1e-8)
    rng = np.random.default_rng(0)
    for _ in range(5):
        g = rng.normal(size=(1, 3)).astype(np.float32)
        core.apply_gradients("a", np.array([9]), g)
        p.grad = torch.tensor(g)
        opt.step()
    np.testing.assert_allclose(core.lookup("a", np.array([9])).values["embedding"], p.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_update_last_write_wins_and_keeps_frequency() -> None:
    core = ShardCore([spec2()])
    core.lookup("emb", np.array([1, 1, 1]), insert=True)
    core.update("emb", np.array([1, 2, 1]), {"embedding": np.array([[1.0, 1], [2, 2], [3, 3]])})
    r = core.lookup("emb", np.array([1, 2]))
    assert r.values["embedding"].tolist() == [[3, 3], [2, 2]]
    assert r.frequency.tolist() == [3, 0]  # update does not reset frequency (CARLS does)


def test_top_k_matches_carls_dot_and_cosine() -> None:
    spec = TableSpec("c", columns=(Column("embedding", shape=(2,)),), optimizer=None, learning_rate=0.1,
                     initializer="zeros", init_scale=0.0)
    core = ShardCore([spec])
    core.update("c", np.array([1, 2, 3, 4]), {"embedding": np.array([[1.0, 0], [2, 0], [4, 0], [0, 0]])})
    keys, scores = core.top_k("c", np.array([[10.0, 0.0], [-10.0, 0.0]]), 3)
    assert keys.tolist() == [[3, 2, 1], [4, 1, 2]]
    np.testing.assert_allclose(scores, [[40, 20, 10], [0, -10, -20]])
    keys, scores = core.top_k("c", np.array([[1.0, 0.0]]), 4, metric="cosine")
    assert keys.shape == (1, 3)  # the zero vector is not usable under cosine
    np.testing.assert_allclose(scores, [[1, 1, 1]])


# -- provenance, staleness, initializers --------------------------------------------------------------
def test_provenance_versions_steps_makers_and_age() -> None:
    clock = Clock(100.0)
    core = ShardCore([nodes()], clock=clock)
    keys = np.array([10, 11, 12])
    core.lookup("nodes", keys, insert=True)
    clock.t = 105.0
    core.update("nodes", keys[:2], {"pseudo_label": np.array([2, 1]), "confidence": np.array([0.9, 0.4])},
                model_step=7, maker="labeler")
    clock.t = 110.0
    r = core.lookup("nodes", keys, max_staleness=7.0)
    assert r.version.tolist() == [2, 2, 1]
    assert r.model_step.tolist() == [7, 7, 0]
    np.testing.assert_allclose(r.age, [5.0, 5.0, 10.0])
    assert r.stale.tolist() == [False, False, True]
    assert r.values["pseudo_label"].dtype == np.int64 and r.values["pseudo_label"].tolist() == [2, 1, 0]
    state = core.export_state()
    assert state["meta"]["makers"] == ["", "labeler"]
    t = state["tables"]["nodes"]
    order = np.argsort(t["keys"])
    assert t["prov/maker"][order].tolist() == [1, 1, 0]
    np.testing.assert_allclose(t["prov/wall_time"][order], [105, 105, 100])


@pytest.mark.parametrize("pooled", [0, 1 << 22], ids=["fresh", "pooled"])
def test_answers_of_two_shards_gathered_equal_one_shard(pooled: int) -> None:
    clock = Clock(50.0)
    whole = ShardCore([nodes()], clock=clock, buckets=16)
    halves = [ShardCore([nodes()], shard=s, n_shards=2, buckets=16, clock=clock, answer_buffers=pooled)
              for s in range(2)]
    keys = np.arange(300)
    owner = bucket_of(keys, 16) % 2
    for core, ks in [(whole, keys)] + [(halves[s], keys[owner == s]) for s in range(2)]:
        core.lookup("nodes", ks, insert=True)
        clock.t = 60.0
        upd = ks[ks % 3 == 0]
        core.update("nodes", upd, {"confidence": np.full(upd.size, 0.5)}, model_step=4)
        clock.t = 50.0
    clock.t = 70.0
    asked = np.r_[keys[::2], 1000, 1001, keys[:5]]  # absent keys and repeats among them
    own = bucket_of(asked, 16) % 2
    parts = [(np.flatnonzero(own == s), halves[s].lookup_rows("nodes", asked[own == s])) for s in range(2)]
    cols = {c.name: c for c in nodes().columns}
    got = gather_rows(parts, asked.size, cols, max_staleness=15.0)
    want = whole.lookup("nodes", asked, max_staleness=15.0)
    assert got.found.tolist() == want.found.tolist() and not got.found[-7:-5].any()
    for field in ("version", "model_step", "frequency", "stale"):
        assert getattr(got, field).tolist() == getattr(want, field).tolist(), field
    np.testing.assert_array_equal(got.age, want.age)
    assert np.isnan(got.age[~got.found]).all() and got.model_step[~got.found].tolist() == [-1, -1]
    for c in cols:
        np.testing.assert_array_equal(got.values[c], want.values[c])
    assert set(np.unique(got.age[got.found])) == {10.0, 20.0}  # written at 60 (every third key) or 50


def test_initializer_depends_only_on_key_not_on_batch_or_shards() -> None:
    keys = np.arange(-50, 50, dtype=np.int64) * 7919
    one = ShardCore([nodes()])
    a = one.lookup("nodes", keys, insert=True).values["embedding"]
    b_core = ShardCore([nodes()])
    b = np.concatenate([b_core.lookup("nodes", keys[i:i + 7], insert=True).values["embedding"] for i in range(0, 100, 7)])
    np.testing.assert_array_equal(a, b)
    # two shards of a 2-shard bank give the same values for their keys
    owner = bucket_of(keys, 64) % 2
    for s in (0, 1):
        part = ShardCore([nodes()], shard=s, n_shards=2, buckets=64)
        mine = keys[owner == s]
        np.testing.assert_array_equal(part.lookup("nodes", mine, insert=True).values["embedding"], a[owner == s])
    # a different seed gives other values; the normal initializer has the configured scale
    other = ShardCore([nodes(seed=1)]).lookup("nodes", keys, insert=True).values["embedding"]
    assert not np.allclose(other, a)
    big = ShardCore([nodes()]).lookup("nodes", np.arange(20000), insert=True).values["embedding"]
    assert abs(float(big.std()) - 0.1) < 0.002 and abs(float(big.mean())) < 0.002


@pytest.mark.parametrize(("kind", "check"), [
    ("zeros", lambda v: np.all(v == 0)),
    ("constant", lambda v: np.all(v == np.float32(0.25))),
    ("uniform", lambda v: v.min() >= -0.25 and v.max() <= 0.25 and abs(v.mean()) < 0.01 and v.max() > 0.24),
    ("normal", lambda v: abs(v.std() - 0.25) < 0.01),
])
def test_initializers(kind: str, check: Any) -> None:
    spec = TableSpec("i", columns=(Column("embedding", shape=(16,)),), optimizer=None, learning_rate=0.1,
                     initializer=kind, init_scale=0.25)
    v = ShardCore([spec]).lookup("i", np.arange(5000), insert=True).values["embedding"]
    assert check(v)


def test_string_keys_hash_stably() -> None:
    assert hash_string("cora/node/17") == hash_string("cora/node/17")
    assert to_int64_keys(["a", "b"]).tolist() == [hash_string("a"), hash_string("b")]
    # a fixed value: the hash never changes between processes or versions
    assert hash_string("carls") == int.from_bytes(__import__("hashlib").blake2b(b"carls", digest_size=8).digest(), "little", signed=True)


# -- growth and delete --------------------------------------------------------------------------------
def test_growth_and_delete_keep_every_row_intact() -> None:
    core = ShardCore([nodes()], initial_capacity=4)
    rng = np.random.default_rng(3)
    keys = rng.choice(10**12, size=5000, replace=False).astype(np.int64)
    for i in range(0, 5000, 333):
        core.lookup("nodes", keys[i:i + 333], insert=True)
    core.update("nodes", keys, {"confidence": np.arange(5000, dtype=np.float32)})
    gone = keys[rng.random(5000) < 0.4]
    present = core.delete("nodes", np.concatenate([gone, [123]]))
    assert present[:-1].all() and not present[-1]
    kept = np.setdiff1d(keys, gone)
    assert core.size("nodes") == kept.size
    r = core.lookup("nodes", keys)
    assert np.array_equal(r.found, ~np.isin(keys, gone))
    np.testing.assert_array_equal(r.values["confidence"][r.found], np.arange(5000, dtype=np.float32)[r.found])
    assert np.array_equal(np.sort(core.keys("nodes")), np.sort(kept))
    # re-inserting deleted keys gives their deterministic initial values again
    fresh = ShardCore([nodes()]).lookup("nodes", gone[:10], insert=True).values["embedding"]
    np.testing.assert_array_equal(core.lookup("nodes", gone[:10], insert=True).values["embedding"], fresh)


# -- bad input ----------------------------------------------------------------------------------------
BAD_CASES = [
    ("unknown table", lambda c: c.lookup("nope", np.array([1])), UnknownTableError, "nope"),
    ("unknown column", lambda c: c.lookup("nodes", np.array([1]), columns=["colour"]), UnknownColumnError, "colour"),
    ("unknown column in update", lambda c: c.update("nodes", np.array([1]), {"colour": np.zeros(1)}), UnknownColumnError, "colour"),
    ("empty batch", lambda c: c.lookup("nodes", np.array([], np.int64), insert=True), InvalidBatchError, "empty"),
    ("float keys", lambda c: c.lookup("nodes", np.array([1.5]), insert=True), InvalidDTypeError, "float64"),
    ("2-D keys", lambda c: c.lookup("nodes", np.ones((2, 2), np.int64), insert=True), InvalidShapeError, "(2, 2)"),
    ("key out of int64 range", lambda c: c.lookup("nodes", np.array([2**63], np.uint64), insert=True), InvalidBatchError, str(2**63)),
    ("wrong dim", lambda c: c.update("nodes", np.array([1, 2]), {"embedding": np.zeros((2, 5))}), InvalidShapeError, "(2, 8)"),
    ("wrong row count", lambda c: c.update("nodes", np.array([1, 2]), {"embedding": np.zeros((3, 8))}), InvalidShapeError, "(3, 8)"),
    ("float into int column", lambda c: c.update("nodes", np.array([1]), {"pseudo_label": np.array([1.5])}), InvalidDTypeError, "int64"),
    ("strings as values", lambda c: c.update("nodes", np.array([1]), {"confidence": np.array(["x"])}), InvalidDTypeError, "<U1"),
    ("NaN values", lambda c: c.update("nodes", np.array([1, 2]), {"embedding": np.r_[np.zeros((1, 8)), np.full((1, 8), np.nan)]}), InvalidBatchError, "NaN"),
    ("Inf values", lambda c: c.update("nodes", np.array([1]), {"confidence": np.array([np.inf])}), InvalidBatchError, "Inf"),
    ("float64 overflow", lambda c: c.update("nodes", np.array([1]), {"confidence": np.array([1e300])}), InvalidBatchError, "overflow"),
    ("NaN gradient", lambda c: c.apply_gradients("nodes", np.array([1, 2]), np.r_[np.zeros((1, 8)), np.full((1, 8), np.nan)]), InvalidBatchError, "gradients"),
    ("gradient wrong dim", lambda c: c.apply_gradients("nodes", np.array([1]), np.zeros((1, 9))), InvalidShapeError, "(1, 8)"),
    ("gradient for int column", lambda c: c.apply_gradients("nodes", np.array([1]), {"pseudo_label": np.zeros(1)}), InvalidDTypeError, "pseudo_label"),
    ("bad learning rate", lambda c: c.apply_gradients("nodes", np.array([1]), np.zeros((1, 8)), learning_rate=-1.0), InvalidBatchError, "learning_rate"),
    ("empty values", lambda c: c.update("nodes", np.array([1]), {}), InvalidBatchError, "non-empty"),
    ("bad max_staleness", lambda c: c.lookup("nodes", np.array([1]), max_staleness=-1.0), InvalidBatchError, "max_staleness"),
    ("top_k wrong dim", lambda c: c.top_k("nodes", np.zeros((1, 3)), 2), InvalidShapeError, "(1, 3)"),
    ("top_k bad metric", lambda c: c.top_k("nodes", np.zeros((1, 8)), 2, metric="l3"), InvalidBatchError, "l3"),
    ("sample too many", lambda c: c.sample_negatives("nodes", 10**6), InvalidBatchError, "unique"),
    ("bad sampler", lambda c: c.sample_negatives("nodes", 2, sampler="zipfish"), InvalidBatchError, "zipfish"),
]


@pytest.mark.parametrize(("what", "call", "error", "needle"), BAD_CASES, ids=[c[0] for c in BAD_CASES])
def test_bad_input_is_rejected_clearly_and_changes_nothing(what: str, call: Any, error: type, needle: str) -> None:
    core = ShardCore([nodes()], clock=Clock())
    core.lookup("nodes", np.arange(100), insert=True)
    core.apply_gradients("nodes", np.arange(10), np.ones((10, 8)))
    before = core.export_state()
    with pytest.raises(error) as info:
        call(core)
    msg = str(info.value)
    assert needle in msg
    if what not in ("unknown table",):
        assert "nodes" in msg  # names the table
    assert states_equal(before, core.export_state())


def test_keys_of_foreign_buckets_are_refused() -> None:
    core = ShardCore([nodes()], shard=0, n_shards=2, buckets=16)
    keys = np.arange(200)
    foreign = keys[bucket_of(keys, 16) % 2 == 1]
    before = core.export_state()
    with pytest.raises(InvalidBatchError, match="out of range for shard 0"):
        core.lookup("nodes", np.r_[keys[bucket_of(keys, 16) % 2 == 0][:5], foreign[:1]], insert=True)
    assert states_equal(before, core.export_state())


# -- export / import ----------------------------------------------------------------------------------
def test_export_state_format_and_round_trip() -> None:
    clock = Clock()
    core = ShardCore([nodes(), spec2("adam")], clock=clock, shard=1, n_shards=3, buckets=32)
    keys = np.arange(300)
    mine = keys[bucket_of(keys, 32) % 3 == 1]
    core.lookup("nodes", mine, insert=True)
    core.apply_gradients("nodes", mine[:20], np.ones((20, 8)))
    core.update("nodes", mine[:5], {"neighbours": np.tile(np.arange(4), (5, 1))}, model_step=3, maker="knn")
    core.lookup("emb", mine[:3], insert=True)
    core.apply_gradients("emb", mine[:3], np.ones((3, 2)))
    state = core.export_state()
    meta = state["meta"]
    assert meta["format"] == 1 and meta["shard"] == 1 and meta["n_shards"] == 3 and meta["buckets"] == 32
    assert meta["owned_buckets"] == [b for b in range(32) if b % 3 == 1]
    assert "optimizer" not in meta  # optimizer state is per row: the slots below
    assert TableSpec.from_json(meta["tables"]["nodes"]) == nodes()
    t = state["tables"]["nodes"]
    expected = {"keys", "bucket", "frequency", "prov/version", "prov/model_step", "prov/maker", "prov/wall_time",
                "col/embedding", "col/logits", "col/pseudo_label", "col/confidence", "col/difficulty", "col/neighbours",
                "slot/embedding/accumulator", "slot/logits/accumulator", "slot/confidence/accumulator",
                "slot/difficulty/accumulator"}
    assert set(t) == expected
    assert all(a.shape[0] == mine.size for a in t.values())
    assert t["keys"].dtype == np.int64 and t["bucket"].dtype == np.int32 and t["prov/maker"].dtype == np.int32
    assert t["col/neighbours"].shape == (mine.size, 4) and t["slot/embedding/accumulator"].dtype == np.float32
    assert set(state["tables"]["emb"]) >= {"slot/embedding/m", "slot/embedding/v", "slot/embedding/step"}
    step = state["tables"]["emb"]["slot/embedding/step"]
    assert step.dtype == np.int64 and step.shape == (3,) and step.tolist() == [1, 1, 1]
    again = ShardCore.from_state(state, clock=clock)
    assert states_equal(state, again.export_state())
    # the restored shard continues identically
    for c in (core, again):
        c.apply_gradients("emb", mine[:3], np.full((3, 2), 0.5))
    assert states_equal(core.export_state(), again.export_state())


def test_import_rows_initializes_only_the_columns_it_is_not_given() -> None:
    clock = Clock()
    ref = ShardCore([nodes()], clock=clock)
    keys = np.arange(50)
    ref.lookup("nodes", keys, insert=True)
    core = ShardCore([nodes()], clock=clock)
    core.lookup("nodes", keys[:10], insert=True)  # some rows exist already, the rest are new
    emb = np.full((50, 8), 0.25, np.float32)
    assert core.import_rows("nodes", {"keys": keys, "col/embedding": emb}) == 50
    got = core.lookup("nodes", keys)
    want = ref.lookup("nodes", keys)
    assert np.array_equal(got.values["embedding"], emb)
    for col in ("logits", "confidence", "neighbours"):  # not given: the deterministic initial values
        assert np.array_equal(got.values[col], want.values[col])
    fresh = ShardCore([nodes()], clock=clock)  # all new: written as one appended range
    fresh.import_rows("nodes", {"keys": keys[::-1], "col/embedding": emb[::-1] * np.arange(50)[::-1, None]})
    assert np.array_equal(fresh.lookup("nodes", keys).values["embedding"], emb * np.arange(50)[:, None])
    assert np.array_equal(fresh.lookup("nodes", keys).values["logits"], want.values["logits"])
