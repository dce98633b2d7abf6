"""The key index: probe chains, hash-tag collisions, wrap-around, deletes and growth against a dict."""

from __future__ import annotations

import numpy as np
import pytest

from carls_dask.bank.hashing import bucket_of_hash, splitmix64
from carls_dask.bank.keyindex import KeyIndex

_G = 0x9E3779B97F4A7C15
_M1 = 0xBF58476D1CE4E5B9
_M2 = 0x94D049BB133111EB
_U64 = (1 << 64) - 1


def _unxorshift(y: int, s: int) -> int:
    x = y
    for _ in range(64 // s + 1):
        x = y ^ (x >> s)
    return x


def key_with_hash(h: int) -> int:
    """The int64 key whose splitmix64 is ``h`` (the finalizer is a bijection)."""
    z = _unxorshift(h, 31)
    z = (z * pow(_M2, -1, 1 << 64)) & _U64
    z = _unxorshift(z, 27)
    z = (z * pow(_M1, -1, 1 << 64)) & _U64
    z = _unxorshift(z, 30)
    x = (z - _G) & _U64
    return x - (1 << 64) if x >= 1 << 63 else x


@pytest.fixture(params=[True, False], ids=["compiled", "numpy"])
def compiled(request: pytest.FixtureRequest) -> bool:
    """Both probe implementations (the compiled loops, when numba is installed, and the NumPy rounds)."""
    return bool(request.param)


class Column:
    """A key column the index reads keys from (row -> key)."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.int64)

    def add(self, keys: list[int]) -> np.ndarray:
        rows = np.arange(self.keys.size, self.keys.size + len(keys))
        self.keys = np.concatenate([self.keys, np.asarray(keys, dtype=np.int64)])
        return rows


def test_key_with_hash_inverts_splitmix64() -> None:
    for h in (0, 1, 2**63, _U64, 0x0123456789ABCDEF):
        k = key_with_hash(h)
        assert int(splitmix64(np.array([k], dtype=np.int64).view(np.uint64))[0]) == h


def test_keys_with_equal_home_and_tag_are_told_apart_by_their_key(compiled: bool) -> None:
    idx = KeyIndex(capacity=8, compiled=compiled)  # 16 slots: the home is the top 4 bits of the hash
    home, tag = 5, 0xDEADBEEF
    same = [key_with_hash((home << 60) | (mid << 32) | tag) for mid in (1, 2, 3, 4)]
    col = Column()
    rows = col.add(same[:3])
    idx.insert(np.array(same[:3]), rows, col.keys)
    assert idx.find(np.array(same), col.keys).tolist() == [0, 1, 2, -1]
    slots, found = idx.find_slots(np.array(same[:3]), col.keys)
    assert slots.tolist() == [5, 6, 7] and found.tolist() == [0, 1, 2]
    # the first one deleted: the others stay reachable past its tombstone; it is gone
    assert idx.remove(np.array(same[:1]), col.keys).tolist() == [0]
    assert idx.find(np.array(same), col.keys).tolist() == [-1, 1, 2, -1]
    got_rows, data = np.empty(4, dtype=np.int64), np.empty((4, 1), dtype=np.int64)
    assert idx.read(np.array(same), np.stack([col.keys, col.keys * 0 + 7], axis=1), 16, None, got_rows, data,
                    np.array([-9])) == -1
    assert got_rows.tolist() == [-1, 1, 2, -1]
    assert data[:, 0].tolist() == [-9, 7, 7, -9]


def test_probe_chains_longer_than_a_window_and_wrapping_around_the_end(compiled: bool) -> None:
    idx = KeyIndex(capacity=32, compiled=compiled)  # 64 slots, 6 home bits
    last = 63
    keys = [key_with_hash((last << 58) | (i << 32) | (1000 + i)) for i in range(20)]
    col = Column()
    idx.insert(np.array(keys), col.add(keys), col.keys)
    assert idx.find(np.array(keys), col.keys).tolist() == list(range(20))
    slots, _ = idx.find_slots(np.array(keys), col.keys)
    assert sorted(slots.tolist()) == [*range(19), 63]  # wrapped past the last slot
    absent = key_with_hash((last << 58) | (99 << 32) | 5)
    assert idx.find(np.array([absent]), col.keys).tolist() == [-1]


def test_random_inserts_deletes_moves_and_growth_match_a_dict(compiled: bool) -> None:
    rng = np.random.default_rng(7)
    idx = KeyIndex(capacity=16, compiled=compiled)
    col = Column()
    model: dict[int, int] = {}
    universe = rng.integers(-(2**63), 2**63 - 1, size=3000, dtype=np.int64)
    universe[:200] = np.arange(200)  # small keys cluster in few homes
    for _ in range(60):
        batch = np.unique(rng.choice(universe, size=int(rng.integers(1, 300))))
        new = [int(k) for k in batch if int(k) not in model]
        if new:
            rows = col.add(new)
            idx.insert(np.array(new, dtype=np.int64), rows, col.keys)
            model.update(zip(new, rows.tolist(), strict=True))
        gone = [int(k) for k in rng.choice(universe, size=50) if int(k) in model]
        gone = list(dict.fromkeys(gone))
        if gone:
            removed = idx.remove(np.array(gone, dtype=np.int64), col.keys)
            assert removed.tolist() == [model.pop(k) for k in gone]
        if model and rng.random() < 0.3:  # move some rows, as a delete compaction does
            movers = rng.choice(np.array(list(model), dtype=np.int64), size=min(5, len(model)), replace=False)
            slots, _ = idx.find_slots(movers, col.keys)
            new_rows = col.add([int(k) for k in movers])
            idx.set_rows(slots, new_rows)
            model.update(zip(movers.tolist(), new_rows.tolist(), strict=True))
        probe = rng.choice(universe, size=400)
        expect = [model.get(int(k), -1) for k in probe]
        assert idx.find(probe, col.keys).tolist() == expect
        got = np.empty(probe.size, dtype=np.int64)
        idx.read(probe, col.keys[:, None], 16, None, got, np.empty((probe.size, 0), dtype=np.int64), np.empty(0, np.int64))
        assert got.tolist() == expect
        assert idx.live == len(model)
    idx.rebuild(len(model), col.keys, None)
    probe = np.array(list(model), dtype=np.int64)
    assert idx.find(probe, col.keys).tolist() == list(model.values())


def test_build_places_every_key_of_a_column(compiled: bool) -> None:
    keys = np.random.default_rng(3).choice(2**62, size=50_000, replace=False).astype(np.int64)
    idx = KeyIndex.build(keys, compiled=compiled)
    assert idx.live == keys.size and idx.live <= idx.max_load * idx.table.size
    assert np.array_equal(idx.find(keys, keys), np.arange(keys.size))
    assert (idx.find(keys + 1, keys) == -1).sum() >= keys.size - 2


def test_read_finds_rows_copies_their_data_and_stops_at_a_foreign_bucket(compiled: bool) -> None:
    rng = np.random.default_rng(3)
    keys = rng.choice(2**40, size=3000, replace=False).astype(np.int64)
    data = np.column_stack([keys, rng.integers(0, 100, size=(3000, 4))]).astype(np.int64)
    idx = KeyIndex.build(keys, compiled=compiled)
    missing = np.array([0, -1, 0, 5], dtype=np.int64)
    asked = np.r_[keys[::7], -keys[:40] - 1]  # present keys, then absent ones
    rng.shuffle(asked)
    rows = np.empty(asked.size, dtype=np.int64)
    meta = np.empty((asked.size, 4), dtype=np.int64)
    assert idx.read(asked, data, 16, None, rows, meta, missing) == -1
    want = {int(k): r for r, k in enumerate(keys)}
    for i, k in enumerate(asked.tolist()):
        r = want.get(k, -1)
        assert rows[i] == r
        assert meta[i].tolist() == (data[r, 1:].tolist() if r >= 0 else missing.tolist())
    owned = np.zeros(16, dtype=bool)
    owned[bucket_of_hash(splitmix64(keys[:1].view(np.uint64)), 16)] = True
    first_bad = int(np.flatnonzero(~owned[bucket_of_hash(splitmix64(asked.view(np.uint64)), 16)])[0])
    assert idx.read(asked, data, 16, owned, rows, meta, missing) == first_bad
