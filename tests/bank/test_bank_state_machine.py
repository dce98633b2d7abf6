"""Random operation sequences on a ShardCore checked against a plain dict model (Hypothesis)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from carls_dask.bank.bounds import low_water
from carls_dask.bank.core import ShardCore
from carls_dask.bank.hashing import splitmix64
from carls_dask.bank.schema import Column, TableSpec
from carls_dask.errors import InvalidBatchError

DIM = 3
LR = 0.5
INIT = 0.25
SPEC = TableSpec(
    "t",
    columns=(Column("embedding", shape=(DIM,)), Column("label", "int64", (), ())),
    optimizer="sgd",
    learning_rate=LR,
    initializer="constant",
    init_scale=INIT,
)
# small keys collide in the index; a few far-apart ones exercise the full int64 range
KEYS = st.one_of(st.integers(0, 40), st.sampled_from([-(2**63), 2**63 - 1, -1, 2**40 + 3]))
BATCH = st.lists(KEYS, min_size=1, max_size=12)
# values and gradients that are exact in float32, so the model's arithmetic matches bit for bit
HALVES = st.integers(-8, 8).map(lambda i: i / 2)


class BankModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.core = ShardCore([SPEC], initial_capacity=2)
        self.model: dict[int, dict[str, object]] = {}
        # incremental snapshots: the image of the last committed snapshot (key -> full row) and the keys
        # written since (what the next increment must hold)
        self.image: dict[int, dict[str, np.ndarray]] = {}
        self.touched: set[int] = set()

    def _new_row(self) -> dict[str, object]:
        return {"emb": np.full(DIM, INIT, np.float32), "label": 0, "freq": 0, "version": 0}

    @rule(keys=BATCH)
    def lookup_insert(self, keys: list[int]) -> None:
        r = self.core.lookup("t", np.array(keys, dtype=np.int64), insert=True)
        self.touched |= set(keys)
        for k in keys:
            row = self.model.setdefault(k, self._new_row())
            if row["freq"] == 0 and row["version"] == 0:
                row["version"] = 1
            row["freq"] = int(row["freq"]) + 1  # type: ignore[call-overload]
        assert r.found.all()
        for i, k in enumerate(keys):
            assert r.frequency[i] == self.model[k]["freq"]
            np.testing.assert_array_equal(r.values["embedding"][i], self.model[k]["emb"])

    @rule(keys=BATCH)
    def lookup(self, keys: list[int]) -> None:
        r = self.core.lookup("t", np.array(keys, dtype=np.int64))
        for i, k in enumerate(keys):
            assert r.found[i] == (k in self.model)
            if k in self.model:
                np.testing.assert_array_equal(r.values["embedding"][i], self.model[k]["emb"])
                assert r.values["label"][i] == self.model[k]["label"]
                assert r.version[i] == self.model[k]["version"]
            else:
                assert not r.values["embedding"][i].any() and np.isnan(r.age[i])

    @rule(data=st.data(), keys=BATCH)
    def update(self, data: st.DataObject, keys: list[int]) -> None:
        n = len(keys)
        emb = np.array(data.draw(st.lists(st.lists(HALVES, min_size=DIM, max_size=DIM), min_size=n, max_size=n)),
                       dtype=np.float32)
        labels = np.array(data.draw(st.lists(st.integers(-5, 5), min_size=n, max_size=n)), dtype=np.int64)
        self.core.update("t", np.array(keys, dtype=np.int64), {"embedding": emb, "label": labels})
        self.touched |= set(keys)
        for k in set(keys):
            row = self.model.setdefault(k, self._new_row())
            last = max(i for i, kk in enumerate(keys) if kk == k)
            row["emb"], row["label"] = emb[last].copy(), int(labels[last])
            row["version"] = int(row["version"]) + 1  # type: ignore[call-overload]

    @rule(data=st.data(), keys=BATCH)
    def apply_gradients(self, data: st.DataObject, keys: list[int]) -> None:
        n = len(keys)
        g = np.array(data.draw(st.lists(st.lists(HALVES, min_size=DIM, max_size=DIM), min_size=n, max_size=n)),
                     dtype=np.float32)
        found = self.core.apply_gradients("t", np.array(keys, dtype=np.int64), g)
        assert found.tolist() == [k in self.model for k in keys]
        self.touched |= {k for k in keys if k in self.model}
        for k in {k for k in keys if k in self.model}:
            summed = sum(g[i] for i, kk in enumerate(keys) if kk == k)
            row = self.model[k]
            row["emb"] = (row["emb"] - np.float32(LR) * summed).astype(np.float32)  # type: ignore[operator]
            row["version"] = int(row["version"]) + 1  # type: ignore[call-overload]

    @rule(keys=BATCH)
    def delete(self, keys: list[int]) -> None:
        present = self.core.delete("t", np.array(keys, dtype=np.int64))
        assert present.tolist() == [k in self.model for k in keys]
        for k in keys:
            self.model.pop(k, None)

    @rule(data=st.data(), sampler=st.sampled_from(["uniform", "log_uniform"]), unique=st.booleans(),
          exclude=st.booleans(), seed=st.integers(0, 2**16))
    def sample_negatives(self, data: st.DataObject, sampler: str, unique: bool, exclude: bool, seed: int) -> None:
        live = sorted(self.model)
        true = data.draw(st.lists(st.sampled_from(live), max_size=3)) if live else []
        room = len(live) - (len(set(true)) if exclude else 0)
        if room == 0:
            return
        n = data.draw(st.integers(1, room if unique else 8))
        s = self.core.sample_negatives("t", n, sampler=sampler, unique=unique, true_keys=np.array([*true, 10 ** 6]),
                                       seed=seed, exclude_true=exclude)
        assert set(s.keys.tolist()) <= set(live) and s.keys.size == n
        if unique:
            assert np.unique(s.keys).size == n
        if exclude:
            assert not set(s.keys.tolist()) & set(true)
        assert s.true_expected_count[-1] == 0.0
        # one-draw probabilities of every live key sum to one: the rank order (tail ranks, tombstones) is exact
        every = self.core.sample_negatives("t", 1, sampler=sampler, unique=False, true_keys=np.array(live), seed=0)
        assert abs(every.true_expected_count.sum() - 1.0) < 1e-9

    @rule(q=st.lists(HALVES, min_size=DIM, max_size=DIM), k=st.integers(1, 5))
    def top_k_ivf_follows_the_rows(self, q: list[float], k: int) -> None:
        if not self.model or not any(q):
            return
        query = np.array([q], dtype=np.float32)
        _ek, es = self.core.top_k("t", query, k, method="exact")
        ak, as_ = self.core.top_k("t", query, k, method="ivf")  # under 39 rows: one cell, scanned in full
        np.testing.assert_allclose(as_, es, rtol=1e-6)
        assert set(ak[0].tolist()) <= set(self.model)
        for key, score in zip(ak[0].tolist(), as_[0].tolist(), strict=True):
            assert float(np.dot(self.model[key]["emb"], query[0])) == pytest.approx(score, rel=1e-6, abs=1e-6)

    @rule(commit=st.booleans())
    def incremental_snapshot(self, commit: bool) -> None:
        """The changes since the last committed snapshot, applied to its image, give the current state exactly;
        they hold exactly the rows written since; an uncommitted snapshot's changes count again."""
        changes = self.core.export_changes()
        rows, gone = changes["tables"]["t"], changes["deleted"]["t"]["keys"].tolist()
        assert sorted(rows["keys"].tolist()) == sorted(self.touched & set(self.model))
        assert not set(gone) & set(self.model)
        assert set(self.image) - set(self.model) <= set(gone)
        image = {k: v for k, v in self.image.items() if k not in gone}
        for i, k in enumerate(rows["keys"].tolist()):
            image[k] = {name: a[i].copy() for name, a in rows.items()}
        state = self.core.export_state()["tables"]["t"]
        assert sorted(image) == sorted(state["keys"].tolist())
        for i, k in enumerate(state["keys"].tolist()):
            for name, a in state.items():
                assert image[k][name].tobytes() == a[i].tobytes(), (k, name)
        if commit:
            self.core.commit_changes()
            self.image, self.touched = image, set()
        else:
            self.core.rollback_changes()

    @rule(keys=BATCH, bad=st.sampled_from(["nan", "shape"]))
    def bad_update_changes_nothing(self, keys: list[int], bad: str) -> None:
        n = len(keys)
        emb = np.zeros((n, DIM), np.float32)
        if bad == "nan":
            emb[-1, 0] = np.nan
        else:
            emb = np.zeros((n, DIM + 1), np.float32)
        try:
            self.core.update("t", np.array(keys, dtype=np.int64), {"embedding": emb})
        except InvalidBatchError:
            pass
        else:  # pragma: no cover - the test fails here
            raise AssertionError("a bad batch was accepted")

    @invariant()
    def sizes_and_keys_agree(self) -> None:
        assert self.core.size("t") == len(self.model)
        assert sorted(self.core.keys("t").tolist()) == sorted(self.model)
        if self.model:
            ks = np.array(sorted(self.model), dtype=np.int64)
            assert self.core.contains("t", ks).all()
            r = self.core.lookup("t", ks)
            for i, k in enumerate(ks.tolist()):
                np.testing.assert_array_equal(r.values["embedding"][i], self.model[k]["emb"])
                assert r.frequency[i] == self.model[k]["freq"]

    @invariant()
    def export_round_trips(self) -> None:
        state = self.core.export_state()
        again = ShardCore.from_state(state).export_state()
        for name, arr in state["tables"]["t"].items():
            np.testing.assert_array_equal(arr, again["tables"]["t"][name])


BankModel.TestCase.settings = settings(
    max_examples=30, stateful_step_count=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestBankModel = BankModel.TestCase


CAP = 6
BOUNDED = TableSpec("b", columns=(Column("embedding", shape=(DIM,)),), optimizer="sgd", learning_rate=LR,
                    initializer="constant", init_scale=INIT, max_rows=CAP, eviction="lfu", min_frequency=2,
                    sketch_width=1 << 16, sketch_depth=4)
SMALL_KEYS = st.lists(st.integers(0, 15), min_size=1, max_size=8)


def _key_hash(k: int) -> int:
    return int(splitmix64(np.array([k], dtype=np.int64).view(np.uint64))[0])


class BoundedBankModel(RuleBasedStateMachine):
    """A bounded LFU table (cap 6, admission after 2 sightings) against an exact dict model.

    The model keeps each key's sightings (the sketch is wide enough to count these 16 keys exactly),
    admits a missing key once it was seen twice (its frequency starts at its sightings), and when over
    the cap evicts the lowest ``(frequency, splitmix64(key))`` rows down to the low-water mark; the rows
    an ``update`` wrote go last.
    """

    def __init__(self) -> None:
        super().__init__()
        self.core = ShardCore([BOUNDED], initial_capacity=2)
        self.model: dict[int, dict[str, object]] = {}
        self.seen: dict[int, int] = {}
        self.evicted = 0

    def _evict(self, protect: set[int]) -> None:
        if len(self.model) <= CAP:
            return
        need = len(self.model) - low_water(CAP)
        order = sorted(self.model, key=lambda k: (k in protect, 0 if k in protect else self.model[k]["freq"],
                                                  _key_hash(k)))
        for k in order[:need]:
            del self.model[k]
        self.evicted += need

    @rule(keys=SMALL_KEYS)
    def lookup_insert(self, keys: list[int]) -> None:
        r = self.core.lookup("b", np.array(keys, dtype=np.int64), insert=True)
        counts: dict[int, int] = {}
        for k in keys:
            counts[k] = counts.get(k, 0) + 1
        for k, c in counts.items():
            self.seen[k] = self.seen.get(k, 0) + c
            if k in self.model:
                self.model[k]["freq"] = int(self.model[k]["freq"]) + c  # type: ignore[call-overload]
            elif self.seen[k] >= 2:
                self.model[k] = {"emb": np.full(DIM, INIT, np.float32), "freq": self.seen[k], "version": 1}
        self._evict(set())
        for i, k in enumerate(keys):
            assert r.found[i] == (k in self.model)
            assert r.rejected[i] == (k not in self.model)
            if k in self.model:
                assert r.frequency[i] == self.model[k]["freq"]

    @rule(data=st.data(), keys=SMALL_KEYS)
    def update(self, data: st.DataObject, keys: list[int]) -> None:
        n = len(keys)
        emb = np.array(data.draw(st.lists(st.lists(HALVES, min_size=DIM, max_size=DIM), min_size=n, max_size=n)),
                       dtype=np.float32)
        self.core.update("b", np.array(keys, dtype=np.int64), {"embedding": emb})
        for k in set(keys):  # updates always write, admitted or not
            row = self.model.setdefault(k, {"emb": None, "freq": 0, "version": 0})
            row["emb"] = emb[max(i for i, kk in enumerate(keys) if kk == k)].copy()
            row["version"] = int(row["version"]) + 1  # type: ignore[call-overload]
        self._evict(set(keys))

    @rule(keys=SMALL_KEYS)
    def delete(self, keys: list[int]) -> None:
        present = self.core.delete("b", np.array(keys, dtype=np.int64))
        assert present.tolist() == [k in self.model for k in keys]
        for k in keys:
            self.model.pop(k, None)

    @invariant()
    def cap_holds_and_rows_agree(self) -> None:
        assert self.core.size("b") == len(self.model) <= CAP
        assert sorted(self.core.keys("b").tolist()) == sorted(self.model)
        if self.model:
            ks = np.array(sorted(self.model), dtype=np.int64)
            r = self.core.lookup("b", ks)
            for i, k in enumerate(ks.tolist()):
                np.testing.assert_array_equal(r.values["embedding"][i], self.model[k]["emb"])
                assert r.frequency[i] == self.model[k]["freq"] and r.version[i] == self.model[k]["version"]
        assert self.core.stats()["tables"]["b"]["bounds"]["evictions"]["cap"] == self.evicted


BoundedBankModel.TestCase.settings = settings(
    max_examples=30, stateful_step_count=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestBoundedBankModel = BoundedBankModel.TestCase
