"""open_bank: a lazy xarray view of the newest snapshot, delta-log merges and reads as of a past step."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import xarray as xr

from carls_dask.errors import StoreNotFoundError, UnknownTableError
from carls_dask.storage import open_bank, read_bank
from carls_dask.storage.bankstore import MAKERS_TABLE, encode_makers
from carls_dask.storage.deltalog import DeltaLog
from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot, write_shard
from tests.storage.states import make_states, merged, table_rows


def _snapshot(root: pathlib.Path, states: list, step: int) -> None:
    h = begin_snapshot(root, step, chunk_rows=64)
    for st in states:
        write_shard(h, st, delta_seq=0)
    commit_snapshot(h, {"n_shards": len(states), "tables": {"nodes": states[0]["meta"]["tables"]["nodes"]}})


def test_lazy_view_of_newest_snapshot(tmp_path: pathlib.Path) -> None:
    states = make_states(700, n_shards=2, buckets=64, seed=4)
    _snapshot(tmp_path, states, step=12)
    ds = open_bank(tmp_path)
    want = merged(states)
    assert isinstance(ds, xr.Dataset) and ds.attrs["table"] == "nodes" and ds.attrs["step"] == 12
    assert ds.attrs["n_shards"] == 2 and ds.attrs["buckets"] == 64 and ds.attrs["delta"] == 0
    assert json.loads(ds.attrs["spec"])["optimizer"] == "adagrad"
    assert dict(ds.sizes) == {"key": 700, "dim": 8, "class": 3, "neighbour": 4}
    assert ds["embedding"].dims == ("key", "dim") and ds["slot_embedding_accum"].dims == ("key", "dim")
    # lazy: nothing but keys and makers is in memory until asked for
    assert not ds["embedding"].variable._in_memory and ds["maker"].variable._in_memory
    sub = ds.sel(key=want["keys"][:5])
    np.testing.assert_array_equal(sub["embedding"].values, want["col/embedding"][:5])
    got = ds.sortby("key").load()
    for name, var in [("col/logits", "logits"), ("prov/wall_time", "wall_time"), ("frequency", "frequency"),
                      ("slot/embedding/accum", "slot_embedding_accum"), ("col/neighbours", "neighbours")]:
        assert got[var].values.tobytes() == want[name].tobytes(), var
    makers = np.asarray(["maker-0-a", "common", "maker-1-a"])
    np.testing.assert_array_equal(got["maker"].values, makers[want["prov/maker"]])
    np.testing.assert_array_equal(ds["embedding"][10:20:3].values, ds["embedding"].values[10:20:3])


def test_delta_log_merge_and_point_in_time(tmp_path: pathlib.Path) -> None:
    states = make_states(300, n_shards=1, buckets=64, seed=5)
    _snapshot(tmp_path, states, step=10)
    keys = states[0]["tables"]["nodes"]["keys"]
    with DeltaLog(tmp_path, 0) as log:
        log.append(11, MAKERS_TABLE, "upsert", encode_makers([2], ["late-maker"]))
        up = table_rows(keys[:4], 64, seed=77)
        up["prov/maker"] = np.full(4, 2, np.int32)  # the shard's code 2 = "late-maker"
        log.append(11, "nodes", "upsert", up)
        new = table_rows(np.array([1, 2, 3], np.int64), 64, seed=78)
        new["prov/maker"] = np.zeros(3, np.int32)
        log.append(12, "nodes", "upsert", new)
        log.append(13, "nodes", "delete", {"keys": np.array([keys[0], 2], np.int64)})
    now = open_bank(tmp_path)
    assert now.attrs["delta"] == 1 and now.sizes["key"] == 300 + 3 - 2
    assert keys[0] not in now["key"].values and 2 not in now["key"].values
    np.testing.assert_array_equal(now.sel(key=keys[1])["embedding"].values, up["col/embedding"][1])
    assert now.sel(key=keys[1])["maker"].item() == "late-maker"
    assert now.sel(key=3)["maker"].item() == "maker-0-a"
    at11 = open_bank(tmp_path, step=11)
    assert at11.sizes["key"] == 300 and at11.attrs["step"] == 11
    np.testing.assert_array_equal(at11.sel(key=keys[0])["embedding"].values, up["col/embedding"][0])
    at10 = open_bank(tmp_path, step=10)
    assert at10.attrs["delta"] == 0
    base = merged(states)
    np.testing.assert_array_equal(at10.sortby("key")["embedding"].values, base["col/embedding"])
    rows, makers, man = read_bank(tmp_path, step=12)
    assert rows["keys"].shape == (303,) and "late-maker" in makers and man["version"] == 1
    with pytest.raises(StoreNotFoundError, match="no snapshot at or before step 9; the oldest kept is at step 10"):
        open_bank(tmp_path, step=9)


def test_table_choice_errors(tmp_path: pathlib.Path) -> None:
    with pytest.raises(StoreNotFoundError):
        open_bank(tmp_path / "missing")
    st = make_states(50, n_shards=1)[0]
    st["tables"]["items"] = st["tables"]["nodes"]
    h = begin_snapshot(tmp_path, 0)
    write_shard(h, st, delta_seq=0)
    commit_snapshot(h)
    with pytest.raises(UnknownTableError, match=r"holds tables \['items', 'nodes'\]; pass table="):
        open_bank(tmp_path)
    with pytest.raises(UnknownTableError, match="no table 'users'"):
        open_bank(tmp_path, table="users")
    assert open_bank(tmp_path, table="items").sizes["key"] == 50
