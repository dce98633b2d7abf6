"""The compiled passes over a batch give the answers of the NumPy chains they replace."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from carls_dask.bank import batchpass
from carls_dask.bank.hashing import bucket_of, splitmix64


@pytest.fixture(params=[True, False], ids=["compiled", "numpy"])
def compiled(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[bool]:
    """Both implementations: the compiled loops (numba is a dependency) and the NumPy fallback."""
    if not request.param:
        monkeypatch.setattr(batchpass, "numba", None)
    yield bool(request.param)


@pytest.mark.parametrize("n_shards", [1, 3, 12])
@pytest.mark.parametrize("buckets", [4096, 1000])
def test_route_gives_each_shard_its_keys_in_batch_order(compiled: bool, n_shards: int, buckets: int) -> None:
    rng = np.random.default_rng(n_shards)
    owner = (rng.permutation(buckets) % n_shards).astype(np.int32)
    keys = rng.integers(-(2**62), 2**62, 5000)
    shard = owner[bucket_of(keys, buckets)]
    got = batchpass.route(keys, owner, buckets)
    assert len(got) == n_shards
    for s, pos in enumerate(got):
        np.testing.assert_array_equal(pos, np.flatnonzero(shard == s))


@pytest.mark.parametrize("keep", ["first", "last"])
@pytest.mark.parametrize("n", [0, 1, 7, 5000])
def test_dedupe_finds_distinct_keys_in_order_of_first_occurrence(compiled: bool, keep: str, n: int) -> None:
    rng = np.random.default_rng(n)
    keys = rng.integers(-5, max(n // 3, 1), n).astype(np.int64) * 1_000_003
    pos, inverse, counts = batchpass.dedupe(keys, keep=keep)
    _, first = np.unique(keys, return_index=True)
    np.testing.assert_array_equal(np.sort(first), np.sort([int(np.flatnonzero(keys == keys[p])[0]) for p in pos]))
    assert list(keys[pos]) == list(dict.fromkeys(keys.tolist()))  # first-occurrence order
    np.testing.assert_array_equal(keys[pos][inverse], keys)
    np.testing.assert_array_equal(counts, [int((keys == k).sum()) for k in keys[pos]])
    for p in pos:
        hits = np.flatnonzero(keys == keys[p])
        assert p == (hits[0] if keep == "first" else hits[-1])


def test_hash_keys_finds_the_first_key_of_a_bucket_not_owned(compiled: bool) -> None:
    keys = np.arange(-50, 50, dtype=np.int64) * 7919
    h, b, bad = batchpass.hash_keys(keys, 64)
    np.testing.assert_array_equal(h, splitmix64(keys.view(np.uint64)))
    np.testing.assert_array_equal(b, bucket_of(keys, 64))
    assert bad == -1
    owned = np.zeros(64, dtype=bool)
    owned[b[:30]] = True
    first_out = int(np.flatnonzero(~owned[b])[0])
    assert batchpass.hash_keys(keys, 64, owned)[2] == first_out


def test_rows_are_taken_and_put_like_fancy_indexing(compiled: bool) -> None:
    rng = np.random.default_rng(0)
    for dtype, shape in ((np.float32, (9,)), (np.int64, (4,)), (np.float16, (3, 2)), (np.uint8, (5,))):
        src = (rng.random((50, *shape)) * 100).astype(dtype)
        pos = rng.integers(0, 50, 20)
        np.testing.assert_array_equal(batchpass.take_rows(src, pos), src[pos])
        dst = np.zeros((60, *shape), dtype=dtype)
        at = rng.permutation(60)[:20]
        batchpass.put_rows(dst, at, src[:20])
        want = np.zeros((60, *shape), dtype=dtype)
        want[at] = src[:20]
        np.testing.assert_array_equal(dst, want)


def test_provenance_of_written_rows_in_one_pass(compiled: bool) -> None:
    meta = np.zeros((10, 5), dtype=np.int64)
    maker = np.zeros(10, dtype=np.int32)
    marks = np.zeros(12, dtype=bool)
    rows = np.array([7, 2, 5])
    batchpass.touch_rows(meta, maker, marks, rows, 1234.5, 9, 3)
    batchpass.touch_rows(meta, maker, marks, rows[:1], 99.0, None, None)
    assert meta[:, 1].tolist() == [0, 0, 1, 0, 0, 1, 0, 2, 0, 0]
    assert meta[[2, 5], 4].view(np.float64).tolist() == [1234.5, 1234.5] and meta[7, 4].view(np.float64) == 99.0
    assert meta[:, 2].tolist() == [0, 0, 9, 0, 0, 9, 0, 9, 0, 0]
    assert maker.tolist() == [0, 0, 3, 0, 0, 3, 0, 3, 0, 0]
    assert np.flatnonzero(marks).tolist() == [2, 5, 7]


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int32])
def test_all_finite_spots_nan_and_inf_anywhere(compiled: bool, dtype: type) -> None:
    x = np.zeros((300, 7), dtype=dtype)
    assert batchpass.all_finite(x)
    if np.dtype(dtype).kind != "f":
        return
    for bad in (np.nan, np.inf, -np.inf):
        for at in ((0, 0), (150, 3), (299, 6)):
            y = x.copy()
            y[at] = bad
            assert not batchpass.all_finite(y)
    assert batchpass.all_finite(np.full(5, np.finfo(dtype).max, dtype=dtype))
