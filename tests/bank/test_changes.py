"""Change feeds: keys whose watched column moved past a threshold since a cursor (in-process banks and actors)."""

from __future__ import annotations

import dataclasses
import pathlib

import numpy as np
import pytest

from carls_dask.bank import ChangeCursor, ChangeWatch, Column, KnowledgeBank, TableSpec
from carls_dask.bank.changes import ChangeFeed
from carls_dask.errors import InvalidBatchError, UnknownTableError


def watched(metric: str = "l2", threshold: float = 0.5) -> TableSpec:
    return TableSpec("nodes", columns=(Column("embedding", shape=(4,), initializer="zeros"),
                                       Column("label", "int64", (), ())),
                     optimizer="sgd", learning_rate=1.0, watch=(ChangeWatch("embedding", metric, threshold),))


def sorted_keys(batch_keys: np.ndarray) -> list[int]:
    return sorted(int(k) for k in batch_keys)


# -- the pure feed --------------------------------------------------------------------------------------

def test_small_steps_add_up_against_the_reference_and_count_once_past_the_threshold() -> None:
    feed = ChangeFeed(ChangeWatch("x", "l2", 1.0), (2,), np.dtype("float32"))
    rows = np.arange(3)
    assert feed.written(rows, np.zeros((3, 2), np.float32)) == 3  # new rows always count
    seen = feed.seq
    for step in range(1, 4):  # row 0 drifts 0.4 a write: under the threshold each time, not in sum
        feed.written(np.array([0]), np.array([[0.4 * step, 0.0]], np.float32))
    moved, upto, complete = feed.rows_since(seen, 3)
    assert moved.tolist() == [0] and complete and upto == feed.seq
    moved, _, _ = feed.rows_since(upto, 3)
    assert moved.size == 0  # its reference is now the value that moved


def test_cosine_ignores_scale_and_sees_direction() -> None:
    feed = ChangeFeed(ChangeWatch("x", "cosine", 0.1), (2,), np.dtype("float32"))
    feed.written(np.arange(2), np.array([[1, 0], [1, 0]], np.float32))
    seen = feed.seq
    feed.written(np.arange(2), np.array([[5, 0], [0, 1]], np.float32))  # row 0 longer, row 1 turned 90 degrees
    assert feed.rows_since(seen, 2)[0].tolist() == [1]


def test_limit_keeps_whole_write_batches_and_says_the_answer_is_cut() -> None:
    feed = ChangeFeed(ChangeWatch("x"), (1,), np.dtype("float32"))
    feed.written(np.arange(3), np.ones((3, 1), np.float32))  # seq 1: rows 0-2
    feed.written(np.arange(3, 5), np.ones((2, 1), np.float32))  # seq 2: rows 3-4
    feed.written(np.arange(5, 6), np.ones((1, 1), np.float32))  # seq 3: row 5
    rows, upto, complete = feed.rows_since(0, 6, limit=4)
    assert rows.tolist() == [0, 1, 2] and upto == 1 and not complete
    rows, upto, complete = feed.rows_since(upto, 6, limit=4)
    assert rows.tolist() == [3, 4, 5] and upto == 3 and complete
    rows, upto, complete = feed.rows_since(0, 6, limit=2)  # the first batch is bigger than the limit: kept whole
    assert rows.tolist() == [0, 1, 2] and upto == 1 and not complete


@pytest.mark.parametrize("bad", [
    {"metric": "manhattan"}, {"threshold": -1.0}, {"threshold": float("nan")}, {"threshold": "0.5"}, {"column": ""},
])
def test_a_bad_watch_is_refused_with_what_was_given(bad: dict[str, object]) -> None:
    args: dict[str, object] = {"column": "embedding", "metric": "l2", "threshold": 0.5, **bad}
    with pytest.raises(ValueError, match="ChangeWatch"):
        ChangeWatch(**args)  # type: ignore[arg-type]


def test_a_table_refuses_watching_a_missing_or_non_float_column_or_one_twice() -> None:
    base = watched()
    with pytest.raises(ValueError, match=r"watch names column 'nope'; the columns are \['embedding', 'label'\]"):
        dataclasses.replace(base, watch=(ChangeWatch("nope"),))
    with pytest.raises(ValueError, match="watched column 'label' is int64; expected a float column"):
        dataclasses.replace(base, watch=("label",))
    with pytest.raises(ValueError, match="watched twice"):
        dataclasses.replace(base, watch=("embedding", ChangeWatch("embedding", "cosine")))
    with pytest.raises(ValueError, match="must be a sequence"):
        dataclasses.replace(base, watch="embedding")  # type: ignore[arg-type]
    assert TableSpec.from_json(base.to_json()) == base  # the watch survives JSON (snapshot manifests)


# -- through the bank -----------------------------------------------------------------------------------

@pytest.mark.parametrize("n_shards", [1, 3])
def test_a_consumer_sees_each_move_once_and_nothing_that_stayed(n_shards: int) -> None:
    with KnowledgeBank.local([watched()], n_shards=n_shards, buckets=64) as bank:
        keys = np.arange(100, dtype=np.int64)
        bank.update("nodes", keys, {"embedding": np.zeros((100, 4), np.float32)})
        first = bank.changes("nodes")
        assert sorted_keys(first.keys) == keys.tolist() and first.complete
        assert len(first.cursor.shards) == n_shards

        vals = np.zeros((100, 4), np.float32)
        vals[:10, 0] = 1.0  # moved past 0.5
        vals[10:20, 0] = 0.1  # moved, but not far enough
        bank.update("nodes", keys, {"embedding": vals})
        bank.update("nodes", np.array([500, 501]), {"embedding": np.zeros((2, 4), np.float32)})  # new keys
        bank.apply_gradients("nodes", np.array([50]), np.full((1, 4), -1.0, np.float32))  # an optimizer step moves too
        bank.update("nodes", keys[:100], {"label": np.ones(100, np.int64)})  # another column: no move
        second = bank.changes("nodes", first.cursor)
        assert sorted_keys(second.keys) == [*range(10), 50, 500, 501]

        bank.delete("nodes", np.array([3, 500]))  # deleted keys are gone from the feed; moved rows keep their marks
        again = bank.changes("nodes", first.cursor)
        assert sorted_keys(again.keys) == [0, 1, 2, 4, 5, 6, 7, 8, 9, 50, 501]
        assert bank.changes("nodes", second.cursor).keys.size == 0
        feeds = bank.stats()["shards"]
        assert sum(s["feeds"]["nodes/embedding"]["moves"] for s in feeds) == 100 + 10 + 2 + 1


def test_bad_cursors_and_columns_are_refused_and_change_nothing() -> None:
    with KnowledgeBank.local([watched()], n_shards=2, buckets=64, name="one") as bank, \
            KnowledgeBank.local([watched()], n_shards=2, buckets=64, name="other") as other:
        bank.update("nodes", np.arange(10), {"embedding": np.ones((10, 4), np.float32)})
        cursor = bank.changes("nodes").cursor
        with pytest.raises(InvalidBatchError, match="the cursor belongs to bank 'one'; expected one of this bank"):
            other.changes("nodes", cursor)
        with pytest.raises(InvalidBatchError, match="does not watch column 'label'"):
            bank.changes("nodes", cursor, column="label")
        with pytest.raises(InvalidBatchError, match="since must be a ChangeCursor from changes"):
            bank.changes("nodes", {"shards": []})  # type: ignore[arg-type]
        forged = dataclasses.replace(cursor, shards=tuple((e, q + 99) for e, q in cursor.shards))
        with pytest.raises(InvalidBatchError, match=r"unknown cursor position \d+ of shard \d; expected 0\.\.\d"):
            bank.changes("nodes", forged)
        with pytest.raises(InvalidBatchError, match="changes limit must be an integer >= 1, got 0"):
            bank.changes("nodes", cursor, limit=0)
        with pytest.raises(UnknownTableError, match=r"unknown table 'edges'; the bank holds tables \['nodes'\]"):
            bank.changes("edges", cursor)
        plain = TableSpec("plain", columns=(Column("embedding", shape=(4,)),))
        with KnowledgeBank.local([plain], n_shards=1) as unwatched, \
                pytest.raises(InvalidBatchError, match="table 'plain' watches no column"):
            unwatched.changes("plain")
        assert bank.changes("nodes", cursor).keys.size == 0  # the good cursor still works: nothing moved


def test_a_cursor_survives_a_restore_on_another_shard_count_and_loses_nothing(tmp_path: pathlib.Path) -> None:
    root = str(tmp_path / "bank")
    with KnowledgeBank.local([watched()], n_shards=2, buckets=64, name="lineage") as bank:
        bank.update("nodes", np.arange(40), {"embedding": np.zeros((40, 4), np.float32)})
        cursor = bank.changes("nodes").cursor
        bank.snapshot(root, step=1)
    with KnowledgeBank.restore_local(root, n_shards=3) as restored:
        assert restored.lineage == "lineage" and restored.name != "lineage"
        again = restored.changes("nodes", cursor)  # rebuilt shards answer all their keys once
        assert sorted_keys(again.keys) == list(range(40))
        moved = np.zeros((40, 4), np.float32)
        moved[7] = 2.0
        restored.update("nodes", np.arange(40), {"embedding": moved})
        assert sorted_keys(restored.changes("nodes", again.cursor).keys) == [7]


def test_a_limited_consumer_reads_everything_in_batches() -> None:
    with KnowledgeBank.local([watched(threshold=0.0)], n_shards=2, buckets=64) as bank:
        for i in range(10):  # ten write batches of ten keys each
            bank.update("nodes", np.arange(10 * i, 10 * i + 10), {"embedding": np.ones((10, 4), np.float32)})
        start = bank.changes("nodes")
        bank.update("nodes", np.arange(100), {"embedding": np.full((100, 4), 2.0, np.float32)})
        got: list[int] = []
        cursor, rounds = start.cursor, 0
        while True:
            batch = bank.changes("nodes", cursor, limit=15)
            got.extend(int(k) for k in batch.keys)
            cursor, rounds = batch.cursor, rounds + 1
            if batch.complete:
                break
        assert sorted(got) == list(range(100)) and rounds == 1  # one write batch of 100 rows is kept whole
        assert isinstance(cursor, ChangeCursor)
