"""Exact top-k (carls_dask.bank.topk): NumPy against a brute-force reference, FAISS against NumPy, backends."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from carls_dask.bank import topk
from carls_dask.bank.core import ShardCore
from carls_dask.bank.schema import Column, TableSpec
from carls_dask.bank.topk import exact_top_k, faiss_available
from carls_dask.errors import ConfigError, InvalidBatchError, InvalidShapeError


def reference(vectors: np.ndarray, keys: np.ndarray, query: np.ndarray, k: int,
              metric: str) -> tuple[np.ndarray, np.ndarray]:
    """Brute force in float64 with Python sorting: every usable row scored, sorted by (-score, key)."""
    v = vectors.astype(np.float64)
    q = query.astype(np.float64)
    usable = np.ones(len(keys), bool)
    if metric == "cosine":
        norms = np.linalg.norm(v, axis=1)
        usable = norms >= 1e-6
        v = v / np.maximum(norms, 1e-300)[:, None]
        q = q / np.maximum(np.linalg.norm(q, axis=1, keepdims=True), 1e-12)
    out_k, out_s = [], []
    for row in q:
        ranked = sorted((-float(row @ v[i]), int(keys[i])) for i in np.flatnonzero(usable))[:k]
        out_k.append([key for _, key in ranked])
        out_s.append([-s for s, _ in ranked])
    kk = min(k, int(usable.sum()))
    return (np.array(out_k, dtype=np.int64).reshape(len(q), kk),
            np.array(out_s, dtype=np.float64).reshape(len(q), kk))


def random_table(n: int, d: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    keys = rng.choice(np.arange(-10 * n - 10, 10 * n + 10), size=n, replace=False).astype(np.int64)
    return rng.standard_normal((n, d)).astype(np.float32), keys


@pytest.fixture(params=[65536, 7], ids=["one-chunk", "chunks-of-7"])
def chunk(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> int:
    """The NumPy backend with its default chunk and with chunks of 7 rows (merges across many chunks)."""
    monkeypatch.setattr(topk, "CHUNK_ROWS", int(request.param))
    return int(request.param)


# -- the NumPy backend against brute force --------------------------------------------------------------------
@pytest.mark.parametrize("metric", ["dot", "cosine"])
@pytest.mark.parametrize(("n", "d", "q", "k"), [(50, 8, 1, 5), (50, 8, 4, 50), (40, 3, 3, 100), (200, 16, 5, 13)])
def test_numpy_matches_brute_force(chunk: int, metric: str, n: int, d: int, q: int, k: int) -> None:
    vectors, keys = random_table(n, d, seed=n + d)
    query = np.random.default_rng(1).standard_normal((q, d)).astype(np.float32)
    got_k, got_s = exact_top_k(vectors, keys, query, k, metric, backend="numpy")
    ref_k, ref_s = reference(vectors, keys, query, k, metric)
    assert got_k.shape == got_s.shape == (q, min(k, n))
    assert got_k.dtype == np.int64 and got_s.dtype == np.float32
    np.testing.assert_array_equal(got_k, ref_k)
    np.testing.assert_allclose(got_s, ref_s, rtol=1e-5, atol=1e-5)


def test_numpy_worked_numbers(chunk: int) -> None:
    vectors = np.array([[1.0, 0], [2, 0], [4, 0], [0, 0]], np.float32)
    keys = np.array([1, 2, 3, 4])
    got_k, got_s = exact_top_k(vectors, keys, np.array([[10.0, 0.0], [-10.0, 0.0]], np.float32), 3, "dot",
                               backend="numpy")
    assert got_k.tolist() == [[3, 2, 1], [4, 1, 2]]
    assert got_s.tolist() == [[40, 20, 10], [0, -10, -20]]
    got_k, got_s = exact_top_k(vectors, keys, np.array([[1.0, 0.0]], np.float32), 4, "cosine", backend="numpy")
    assert got_k.tolist() == [[1, 2, 3]]  # the zero row is not usable under cosine; equal scores: smaller key first
    np.testing.assert_allclose(got_s, [[1, 1, 1]], rtol=1e-6)


def test_cosine_leaves_out_zero_norm_rows(chunk: int) -> None:
    vectors, keys = random_table(30, 4, seed=3)
    vectors[::3] = 0.0
    vectors[1] = 1e-8  # norm 2e-8 < 1e-6: not usable either
    query = np.ones((2, 4), np.float32)
    got_k, got_s = exact_top_k(vectors, keys, query, 100, "cosine", backend="numpy")
    usable = set(keys.tolist()) - set(keys[::3].tolist()) - {int(keys[1])}
    assert got_k.shape == (2, len(usable)) == (2, 19)
    assert set(got_k[0].tolist()) == usable
    assert np.all(np.abs(got_s) <= 1.0 + 1e-6)
    np.testing.assert_array_equal(got_k, reference(vectors, keys, query, 100, "cosine")[0])
    # only zero rows: nothing usable, an empty answer per query row
    got_k, got_s = exact_top_k(np.zeros((5, 4), np.float32), keys[:5], query, 3, "cosine", backend="numpy")
    assert got_k.shape == got_s.shape == (2, 0)


def test_ties_go_to_the_smaller_key(chunk: int) -> None:
    rng = np.random.default_rng(5)
    keys = rng.permutation(np.arange(100, 140)).astype(np.int64)
    vectors = np.ones((40, 2), np.float32)  # every row scores the same
    vectors[keys == 120] = [3, 3]  # one clear winner
    got_k, got_s = exact_top_k(vectors, keys, np.array([[1.0, 1.0], [2.0, 2.0]], np.float32), 5, "dot",
                               backend="numpy")
    assert got_k.tolist() == [[120, 100, 101, 102, 103]] * 2
    assert got_s.tolist() == [[6, 2, 2, 2, 2], [12, 4, 4, 4, 4]]


def test_empty_table_and_dtypes(chunk: int) -> None:
    got_k, got_s = exact_top_k(np.zeros((0, 3), np.float32), np.zeros(0, np.int64), np.ones((2, 3)), 4, "dot",
                               backend="numpy")
    assert got_k.shape == got_s.shape == (2, 0)
    vectors, keys = random_table(20, 3)
    got_k, got_s = exact_top_k(vectors.astype(np.float64), keys, np.ones((1, 3)), 4, "dot", backend="numpy")
    ref_k, ref_s = reference(vectors, keys, np.ones((1, 3)), 4, "dot")
    np.testing.assert_array_equal(got_k, ref_k)
    np.testing.assert_allclose(got_s, ref_s, rtol=1e-5)


@pytest.mark.parametrize("metric", ["dot", "cosine"])
def test_numpy_backend_matches_shard_core(metric: str) -> None:
    """Same answers as ShardCore.top_k on a shard's own rows (random data: no ties)."""
    spec = TableSpec("c", columns=(Column("embedding", shape=(6,)),), optimizer=None, learning_rate=0.1,
                     initializer="zeros", init_scale=0.0)
    core = ShardCore([spec])
    vectors, keys = random_table(300, 6, seed=9)
    core.update("c", keys, {"embedding": vectors})
    t = core.table("c")
    query = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    core_k, core_s = core.top_k("c", query, 11, metric=metric)
    got_k, got_s = exact_top_k(t.cols["embedding"][: t.n], t.keys[: t.n], query, 11, metric, backend="numpy")
    np.testing.assert_array_equal(got_k, core_k)
    np.testing.assert_allclose(got_s, core_s, rtol=1e-6)


# -- FAISS against NumPy -----------------------------------------------------------------------------------------
def assert_same_answer(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> None:
    """Same shapes, scores to 1e-5 relative, and the same keys in the same order."""
    assert a[0].shape == b[0].shape and a[1].shape == b[1].shape
    assert a[0].dtype == b[0].dtype and a[1].dtype == b[1].dtype == np.float32
    np.testing.assert_allclose(a[1], b[1], rtol=1e-5, atol=1e-5)
    for row_a, row_b in zip(a[0], b[0], strict=True):
        assert set(row_a.tolist()) == set(row_b.tolist())
    np.testing.assert_array_equal(a[0], b[0])  # random data: no ties, so the order is the same too


@pytest.mark.parametrize("metric", ["dot", "cosine"])
@pytest.mark.parametrize(("n", "d", "q", "k"), [(1, 4, 1, 1), (100, 8, 1, 10), (1000, 32, 7, 25),
                                                (5000, 64, 64, 10), (3000, 17, 30, 200), (64, 5, 3, 500)])
def test_faiss_matches_numpy(metric: str, n: int, d: int, q: int, k: int) -> None:
    pytest.importorskip("faiss")
    vectors, keys = random_table(n, d, seed=n * d)
    if metric == "cosine":
        vectors[::10] = 0.0
    query = np.random.default_rng(q).standard_normal((q, d)).astype(np.float32) * 3
    by_faiss = exact_top_k(vectors, keys, query, k, metric, backend="faiss")
    by_numpy = exact_top_k(vectors, keys, query, k, metric, backend="numpy")
    usable = n - (len(range(0, n, 10)) if metric == "cosine" else 0)
    assert by_faiss[0].shape == (q, min(k, usable))
    assert_same_answer(by_faiss, by_numpy)
    assert np.isin(by_faiss[0], keys).all() and np.isfinite(by_faiss[1]).all()


def test_faiss_more_k_than_rows_and_nothing_usable() -> None:
    pytest.importorskip("faiss")
    vectors, keys = random_table(6, 3, seed=4)
    got_k, got_s = exact_top_k(vectors, keys, np.ones((2, 3), np.float32), 50, "dot", backend="faiss")
    assert got_k.shape == got_s.shape == (2, 6)  # not padded with FAISS's -1 ids / -inf scores
    assert sorted(got_k[0].tolist()) == sorted(keys.tolist())
    assert np.isfinite(got_s).all()
    got_k, got_s = exact_top_k(np.zeros((6, 3), np.float32), keys, np.ones((2, 3)), 5, "cosine", backend="faiss")
    assert got_k.shape == got_s.shape == (2, 0)
    got_k, _ = exact_top_k(np.zeros((0, 3), np.float32), np.zeros(0, np.int64), np.ones((1, 3)), 5, "dot",
                           backend="faiss")
    assert got_k.shape == (1, 0)


def test_faiss_ties_go_to_the_smaller_key() -> None:
    pytest.importorskip("faiss")
    rng = np.random.default_rng(6)
    keys = rng.permutation(np.arange(1000, 1300)).astype(np.int64)
    vectors = np.ones((300, 4), np.float32)
    vectors[keys == 1200] = 2.0
    query = np.array([[1, 1, 1, 1], [0, 0, 0, 1], [1, 0, 0, 0]], np.float32)
    got_k, got_s = exact_top_k(vectors, keys, query, 4, "dot", backend="faiss")
    assert got_k.tolist() == [[1200, 1000, 1001, 1002]] * 3
    assert got_s.tolist() == [[8, 4, 4, 4], [2, 1, 1, 1], [2, 1, 1, 1]]


# -- backend choice and errors -------------------------------------------------------------------------------------
def spy(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    calls: list[str] = []
    for name in ("numpy", "faiss"):
        real = getattr(topk, f"_{name}_top_k")

        def wrapped(*args: Any, _real: Any = real, _name: str = name) -> Any:
            calls.append(_name)
            return _real(*args)

        monkeypatch.setattr(topk, f"_{name}_top_k", wrapped)
    return calls


def test_auto_picks_faiss_from_the_threshold_when_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("faiss")
    calls = spy(monkeypatch)
    monkeypatch.setattr(topk, "FAISS_MIN_ROWS", 100)
    monkeypatch.setattr(topk, "FAISS_MIN_QUERIES", 4)
    vectors, keys = random_table(100, 4)
    few_rows = exact_top_k(vectors[:99], keys[:99], np.ones((4, 4)), 3, "dot")
    few_queries = exact_top_k(vectors, keys, np.ones((3, 4)), 3, "dot")
    both = exact_top_k(vectors, keys, np.ones((4, 4)), 3, "dot")
    assert calls == ["numpy", "numpy", "faiss"]
    assert few_rows[0].shape == both[0].shape == (4, 3) and few_queries[0].shape == (3, 3)


def test_auto_without_faiss_uses_numpy_and_faiss_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = spy(monkeypatch)
    monkeypatch.setattr(topk, "_faiss", lambda: None)
    monkeypatch.setattr(topk, "FAISS_MIN_ROWS", 1)
    monkeypatch.setattr(topk, "FAISS_MIN_QUERIES", 1)
    assert not faiss_available()
    vectors, keys = random_table(50, 4)
    got_k, _ = exact_top_k(vectors, keys, np.ones((1, 4)), 3, "dot")
    assert calls == ["numpy"] and got_k.shape == (1, 3)
    with pytest.raises(ConfigError, match=r"backend 'faiss' needs the faiss-cpu package.*carls-dask\[faiss\]"):
        exact_top_k(vectors, keys, np.ones((1, 4)), 3, "dot", backend="faiss")


def test_bad_arguments_name_what_was_given_and_expected() -> None:
    vectors, keys = random_table(10, 4)
    with pytest.raises(InvalidBatchError) as info:
        exact_top_k(vectors, keys, np.ones((1, 4)), 3, "dot", backend="gpu")
    assert str(info.value) == "top_k: backend 'gpu' is unknown; expected one of ('auto', 'numpy', 'faiss')"
    assert isinstance(info.value, ValueError)
    with pytest.raises(InvalidBatchError, match=r"metric 'l2' is unknown; expected one of \('dot', 'cosine'\)"):
        exact_top_k(vectors, keys, np.ones((1, 4)), 3, "l2")
    for k in (0, -1, True, 2.5):
        with pytest.raises(InvalidBatchError, match="k must be a positive int"):
            exact_top_k(vectors, keys, np.ones((1, 4)), k, "dot")  # type: ignore[arg-type]
    with pytest.raises(InvalidShapeError, match=r"query has shape \(1, 3\); expected \(q>0, 4\)"):
        exact_top_k(vectors, keys, np.ones((1, 3)), 3, "dot")
    with pytest.raises(InvalidShapeError, match="expected"):
        exact_top_k(vectors, keys[:5], np.ones((1, 4)), 3, "dot")


_CENTRES = np.random.default_rng(70).normal(size=(200, 64)).astype(np.float32)


def _clustered(n: int, d: int, rng: np.random.Generator) -> np.ndarray:
    """A Gaussian mixture around 200 fixed centres (ANN recall on uniform random vectors means nothing)."""
    c = _CENTRES[:, :d]
    return (c[rng.integers(0, c.shape[0], n)] + 0.35 * rng.normal(size=(n, d))).astype(np.float32)


def _recall(core: ShardCore, q: np.ndarray, metric: str) -> float:
    ek, _ = core.top_k("c", q, 10, metric=metric, method="exact")
    ak, as_ = core.top_k("c", q, 10, metric=metric, method="ivf")
    assert np.all(np.diff(as_, axis=1) <= 0)
    return float(np.mean([np.intersect1d(a, e).size / 10 for a, e in zip(ak, ek, strict=True)]))


@pytest.mark.skipif(not faiss_available(), reason="faiss is not installed")
@pytest.mark.parametrize("metric", ["dot", "cosine"])
def test_ivf_top_k_recall_and_it_stays_current_after_updates_and_deletes(metric: str) -> None:
    rng = np.random.default_rng(7)
    spec = TableSpec("c", columns=(Column("embedding", shape=(64,)),), optimizer="sgd", learning_rate=0.5,
                     initializer="zeros", init_scale=0.0)
    core = ShardCore([spec], initial_capacity=1 << 16)
    n = 50_000
    keys = np.arange(n, dtype=np.int64) * 3
    core.update("c", keys, {"embedding": _clustered(n, 64, rng)})
    q = _clustered(64, 64, rng)
    assert _recall(core, q, metric) >= 0.95
    assert core.ann_state("c")[f"embedding/{metric}"]["builds"] == 1
    # move 2 % of the rows onto the queries, delete 1 %, add 1 %: the index follows without a rebuild
    moved = keys[rng.choice(np.arange(500, n), 1000, replace=False)]
    core.update("c", moved, {"embedding": _clustered(1000, 64, rng)})
    core.apply_gradients("c", moved[:10], -np.repeat(q[:1], 10, axis=0))  # sgd: w += 0.5 * q[0]
    core.update("c", moved[:10], {"embedding": np.repeat(q[:1], 10, axis=0) * 1.5})  # the best rows of q[0]
    gone = keys[:500]
    core.delete("c", gone)
    core.update("c", np.arange(500) * 3 + 1, {"embedding": _clustered(500, 64, rng)})
    assert _recall(core, q, metric) >= 0.95
    ak, _ = core.top_k("c", q[:1], 10, metric=metric, method="ivf")
    assert sorted(ak[0].tolist()) == sorted(moved[:10].tolist())
    assert not np.isin(core.top_k("c", q, 10, metric=metric, method="ivf")[0], gone).any()
    st = core.ann_state("c")[f"embedding/{metric}"]
    assert st["builds"] == 1 and st["updates"] == 1 and st["vectors"] == n
    with pytest.raises(InvalidBatchError, match="method 'hnsw'"):
        core.top_k("c", q, 10, method="hnsw")
