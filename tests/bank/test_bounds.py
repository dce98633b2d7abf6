"""Bounded tables: the admission sketch, each eviction policy, TTL, admission, and the cap under a Zipf stream."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest

from carls_dask.bank import Column, KnowledgeBank, TableSpec
from carls_dask.bank.bounds import CountMinSketch, choose_victims, expired_rows, low_water, victim_scores
from carls_dask.bank.core import ShardCore
from carls_dask.bank.hashing import splitmix64
from carls_dask.bank.schema import EVICTIONS


class Clock:
    """A settable clock for the shard."""

    def __init__(self, now: float = 1000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


def spec(**bounds: object) -> TableSpec:
    return TableSpec("t", columns=(Column("embedding", shape=(2,)),), optimizer="sgd", learning_rate=0.1,
                     initializer="constant", init_scale=0.5, **bounds)  # type: ignore[arg-type]


def zipf_stream(batches: int, size: int, distinct: int, seed: int = 0, a: float = 1.1) -> Iterator[np.ndarray]:
    """Batches of keys drawn from Zipf(a) over ``distinct`` ids (ranks scrambled into int64 keys)."""
    rng = np.random.default_rng(seed)
    for _ in range(batches):
        ranks = rng.zipf(a, size) % distinct
        yield splitmix64(ranks.astype(np.uint64)).view(np.int64)


# -- the sketch ----------------------------------------------------------------------------------------
def test_sketch_never_underestimates_and_stays_within_its_error_bound() -> None:
    width, depth = 4096, 4
    sketch = CountMinSketch(width, depth, seed=7)
    stream = np.concatenate(list(zipf_stream(8, 25_000, 100_000, seed=1)))
    for part in np.array_split(stream, 8):
        sketch.add(part)  # duplicates summed inside
    keys, true = np.unique(stream, return_counts=True)
    est = sketch.estimate(keys)
    assert (est >= true).all()
    bound = math.e * stream.size / width
    assert np.mean(est - true > bound) <= math.exp(-depth)  # the count-min guarantee
    # conservative update: the mean excess is far below a plain count-min's (about N / width per key);
    # measured 5.0 against 48.8
    assert np.mean(est - true) < 0.2 * stream.size / width
    assert sketch.nbytes == width * depth * 4
    roomy = CountMinSketch(1 << 18, depth, seed=7)  # width >> distinct keys: nearly every estimate is exact
    roomy.add(stream)
    assert np.mean(roomy.estimate(keys) == true) > 0.99  # measured 0.9997


def test_sketch_add_returns_estimates_and_aggregates_duplicates() -> None:
    a, b = CountMinSketch(64, 3, seed=1), CountMinSketch(64, 3, seed=1)
    out = a.add(np.array([5, 5, 9, 5], dtype=np.int64))
    np.testing.assert_array_equal(out, [3, 3, 1, 3])
    b.add(np.array([5, 9], dtype=np.int64), np.array([3, 1]), assume_unique=True)
    np.testing.assert_array_equal(a.counts, b.counts)
    with pytest.raises(ValueError, match="power of two"):
        CountMinSketch(100, 3)


# -- victims -------------------------------------------------------------------------------------------
def test_each_policy_picks_its_victims_independent_of_row_order() -> None:
    keys = np.arange(100, 110, dtype=np.int64)
    freq = np.array([5, 1, 7, 1, 9, 2, 1, 8, 3, 6], dtype=np.int64)
    wall = np.array([3.0, 9.0, 1.0, 2.0, 8.0, 7.0, 6.0, 5.0, 4.0, 0.5])
    lfu = choose_victims(victim_scores("lfu", freq, wall), keys, 2)
    assert set(keys[lfu]) < {101, 103, 106} and lfu.size == 2  # two of the three with frequency 1
    for policy in ("lru", "oldest"):
        old = choose_victims(victim_scores(policy, freq, wall), keys, 3)
        assert set(keys[old].tolist()) == {109, 102, 103}
    perm = np.random.default_rng(0).permutation(10)
    again = choose_victims(victim_scores("lfu", freq[perm], wall[perm]), keys[perm], 2)
    assert set(keys[perm][again].tolist()) == set(keys[lfu].tolist())  # ties by key hash, not position
    protected = choose_victims(victim_scores("lfu", freq, wall), keys, 2, protected=np.array([1, 3, 6]))
    assert set(keys[protected].tolist()) == {105, 108}
    assert choose_victims(victim_scores("lfu", freq, wall), keys, 0).size == 0
    assert set(choose_victims(victim_scores("lfu", freq, wall), keys, 12).tolist()) == set(range(10))
    with pytest.raises(ValueError, match="not one of"):
        victim_scores("mru", freq, wall)


def test_ttl_selection_and_low_water() -> None:
    np.testing.assert_array_equal(expired_rows(np.array([1.0, 5.0, 9.0]), 10.0, 5.5), [0])
    assert low_water(1) == 1 and low_water(20) == 19 and low_water(1000) == 950


# -- the shard core --------------------------------------------------------------------------------------
def test_admission_needs_min_frequency_sightings_and_reports_rejected() -> None:
    core = ShardCore([spec(min_frequency=3, sketch_width=1024)])
    k = np.array([1, 2], dtype=np.int64)
    r = core.lookup("t", k, insert=True)
    assert not r.found.any() and r.rejected.all() and core.size("t") == 0
    assert not r.values["embedding"].any() and np.isnan(r.age).all() and (r.frequency == 0).all()
    r = core.lookup("t", np.array([1, 1, 2], dtype=np.int64), insert=True)  # key 1 seen 3 times now
    assert r.found.tolist() == [True, True, False] and r.rejected.tolist() == [False, False, True]
    assert r.frequency[0] == 3 and r.version[0] == 1
    np.testing.assert_array_equal(r.values["embedding"][0], [0.5, 0.5])
    assert core.keys("t").tolist() == [1]
    core.update("t", np.array([50], dtype=np.int64), {"embedding": np.ones((1, 2), np.float32)})  # always writes
    assert core.contains("t", np.array([50], dtype=np.int64)).all()
    b = core.stats()["tables"]["t"]["bounds"]
    assert (b["admissions"], b["rejections"]) == (1, 3) and b["sketch_bytes"] == 1024 * 4 * 4
    plain = ShardCore([spec()])
    r = plain.lookup("t", k, insert=True)
    assert r.found.all() and not r.rejected.any() and "bounds" not in plain.stats()["tables"]["t"]


@pytest.mark.parametrize("eviction", EVICTIONS)
def test_cap_holds_and_each_policy_evicts_its_rows(eviction: str) -> None:
    clock = Clock()
    core = ShardCore([spec(max_rows=20, eviction=eviction)], clock=clock)
    core.lookup("t", np.arange(20, dtype=np.int64), insert=True)
    clock.now += 1
    hot = np.arange(10, dtype=np.int64)
    core.lookup("t", np.r_[hot, hot], insert=True)  # lfu: keys 0-9 more frequent; lru: recently used
    clock.now += 1
    core.update("t", np.arange(15, 20, dtype=np.int64), {"embedding": np.ones((5, 2), np.float32)})
    clock.now += 1
    core.lookup("t", np.array([100], dtype=np.int64), insert=True)  # 21 rows: evict down to 19
    kept = set(core.keys("t").tolist())
    assert core.size("t") == low_water(20) == 19
    gone = set(range(20)) | {100}
    gone -= kept
    if eviction == "lfu":  # key 100 (frequency 1) and one of 10..19 (frequency 1) go
        assert len(gone) == 2 and gone <= set(range(10, 20)) | {100}
    elif eviction == "lru":  # least recently used: keys 10..14 (written at the start, never used since)
        assert gone <= set(range(10, 15))
    else:  # oldest by last write: 0..14 were written first; lookups do not count
        assert gone <= set(range(15))
    assert core.stats()["tables"]["t"]["bounds"]["evictions"] == {"cap": 2, "ttl": 0}


def test_update_keeps_the_rows_it_wrote() -> None:
    core = ShardCore([spec(max_rows=4)])
    core.lookup("t", np.array([1, 1, 1, 2, 2, 2, 3, 3, 3, 4, 4, 4], dtype=np.int64), insert=True)
    core.update("t", np.array([9], dtype=np.int64), {"embedding": np.ones((1, 2), np.float32)})
    assert core.size("t") == 4 and 9 in core.keys("t").tolist()  # frequency 0, yet kept


def test_ttl_expires_on_writes_and_on_expire() -> None:
    clock = Clock(0.0)
    core = ShardCore([spec(ttl=10.0)], clock=clock)
    core.lookup("t", np.arange(5, dtype=np.int64), insert=True)
    clock.now = 6.0
    core.update("t", np.array([0, 1], dtype=np.int64), {"embedding": np.ones((2, 2), np.float32)})
    clock.now = 12.0
    assert core.size("t") == 5  # reads do not expire
    core.lookup("t", np.array([3], dtype=np.int64), insert=True)  # the sweep runs first: 2, 3, 4 expired
    assert sorted(core.keys("t").tolist()) == [0, 1, 3]
    r = core.lookup("t", np.array([3], dtype=np.int64))
    assert r.version[0] == 1 and r.frequency[0] == 1  # 3 came back fresh
    clock.now = 17.0
    assert core.expire("t") == 2 and core.keys("t").tolist() == [3]
    assert core.stats()["tables"]["t"]["bounds"]["evictions"] == {"cap": 0, "ttl": 5}
    assert ShardCore([spec()]).expire("t") == 0


def test_lru_lookups_refresh_wall_time_but_oldest_does_not() -> None:
    for eviction, refreshed in (("lru", True), ("oldest", False)):
        clock = Clock(0.0)
        core = ShardCore([spec(max_rows=100, eviction=eviction)], clock=clock)
        core.lookup("t", np.array([1], dtype=np.int64), insert=True)
        clock.now = 5.0
        core.lookup("t", np.array([1], dtype=np.int64), insert=True)
        assert core.lookup("t", np.array([1], dtype=np.int64)).age[0] == (0.0 if refreshed else 5.0)


def test_zipf_stream_over_20m_keys_never_exceeds_the_cap_and_keeps_the_most_frequent() -> None:
    cap = 10_000
    core = ShardCore([spec(max_rows=cap, min_frequency=2)], initial_capacity=cap + 65_536)
    seen = []
    most = 0
    for batch in zipf_stream(40, 65_536, 20_000_000, seed=3):
        core.lookup("t", batch, insert=True)
        most = max(most, core.size("t"))
        seen.append(batch)
    assert most <= cap
    keys, counts = np.unique(np.concatenate(seen), return_counts=True)
    kept = core.keys("t")
    top = keys[np.argsort(-counts, kind="stable")[: kept.size]]
    overlap = np.intersect1d(top, kept).size / kept.size
    assert overlap >= 0.9, overlap  # measured 0.98
    b = core.stats()["tables"]["t"]["bounds"]
    assert b["rejections"] > b["admissions"] > b["evictions"]["cap"] > 0


# -- options -----------------------------------------------------------------------------------------
@pytest.mark.parametrize(("option", "value", "match"), [
    ("max_rows", 0, "max_rows must be None or an int >= 1"),
    ("max_rows", 2.5, "max_rows must be None or an int >= 1"),
    ("max_rows", True, "max_rows must be None or an int >= 1"),
    ("eviction", "fifo", "eviction 'fifo' is not one of"),
    ("min_frequency", 0, "min_frequency must be an int >= 1"),
    ("ttl", 0, "ttl must be None or a finite number of seconds > 0"),
    ("ttl", float("inf"), "ttl must be None"),
    ("ttl", "1h", "ttl must be None"),
    ("sketch_width", 1000, "sketch_width must be a power of two >= 64"),
    ("sketch_depth", 0, "sketch_depth must be an int in"),
])
def test_bad_bound_options_are_refused(option: str, value: object, match: str) -> None:
    with pytest.raises(ValueError, match=match) as err:
        spec(**{option: value})
    assert "table 't'" in str(err.value)


def test_bound_options_round_trip_through_json() -> None:
    s = spec(max_rows=7, eviction="lru", min_frequency=3, ttl=60, sketch_width=256, sketch_depth=2)
    again = TableSpec.from_json(s.to_json())
    assert again == s and again.ttl == 60.0 and again.is_bounded
    old = {k: v for k, v in s.to_json().items() if k not in ("max_rows", "eviction", "min_frequency", "ttl",
                                                              "sketch_width", "sketch_depth")}
    assert not TableSpec.from_json(old).is_bounded  # stores written before bounds load unbounded


def test_client_merges_rejected_over_shards() -> None:
    bank = KnowledgeBank.local([spec(min_frequency=2, sketch_width=1024)], n_shards=2, buckets=8)
    try:
        keys = np.arange(40, dtype=np.int64)
        assert bank.lookup("t", keys, insert=True).rejected.all()
        r = bank.lookup("t", np.r_[keys[:20], [1000]], insert=True)
        assert r.found.tolist() == [True] * 20 + [False] and r.rejected.tolist() == [False] * 20 + [True]
        assert bank.size("t") == 20
        assert not bank.lookup("t", keys).rejected.any()  # plain reads never reject
    finally:
        bank.close()
