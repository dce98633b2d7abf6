"""``carls-dask bank inspect|snapshots|prune|restore`` against real stores (and a real cluster for restore)."""

from __future__ import annotations

import pathlib
from typing import Any

import numpy as np
import pytest

from carls_dask.cli import main
from carls_dask.storage.snapshots import (
    begin_snapshot,
    commit_snapshot,
    list_snapshots,
    read_manifest,
    read_snapshot,
    write_shard,
)
from tests.storage.states import TABLE_SPEC, make_states, sort_by_key


def _store(root: pathlib.Path, versions: int = 1) -> None:
    for v in range(versions):
        h = begin_snapshot(root, 10 * (v + 1))
        states = make_states(300, n_shards=2, seed=v)
        for st in states:
            write_shard(h, st, delta_seq=0)
        commit_snapshot(h, {"n_shards": 2, "tables": {"nodes": TABLE_SPEC}})


def test_inspect_and_snapshots(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    _store(tmp_path, versions=2)
    assert main(["bank", "inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"bank store {tmp_path}: 2 snapshot(s)" in out
    assert "snapshot v2: step 20" in out and "2 shards, 64 buckets" in out
    assert "table 'nodes': 300 rows" in out and "optimizer adagrad" in out
    assert ["col/embedding", "float32", "(8,)"] in [line.split() for line in out.splitlines()]
    man = read_manifest(tmp_path)
    r0, r1 = man["shards"]["0"]["tables"]["nodes"]["rows"], man["shards"]["1"]["tables"]["nodes"]["rows"]
    assert r0 + r1 == 300
    lines = out.splitlines()
    start = lines.index("rows per shard:")
    assert lines[start + 2].split()[:3] == ["0", str(r0), "32"]
    assert lines[start + 3].split()[:3] == ["1", str(r1), "32"]
    assert "delta log after v2: no records" in out
    assert main(["bank", "inspect", str(tmp_path), "--version", "1", "--json"]) == 0
    assert '"version": 1' in capsys.readouterr().out
    assert main(["bank", "snapshots", str(tmp_path)]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0].split()[:2] == ["version", "step"] and len(rows) == 3
    assert rows[2].split()[:2] == ["2", "20"]


def test_prune_and_errors(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    _store(tmp_path, versions=3)
    assert main(["bank", "prune", str(tmp_path), "--keep", "1"]) == 0
    assert "removed versions [1, 2]; kept [3]" in capsys.readouterr().out
    assert [e["version"] for e in list_snapshots(tmp_path)] == [3]
    assert main(["bank", "inspect", str(tmp_path / "missing")]) == 1
    err = capsys.readouterr().err
    assert "carls-dask bank: error:" in err and "no such folder" in err
    assert main(["bank", "restore", str(tmp_path), "--version", "1"]) == 1
    assert "no snapshot version 1; committed versions are [3]" in capsys.readouterr().err


def _bank_snapshot(client: Any, root: pathlib.Path) -> None:
    from carls_dask.bank import Column, KnowledgeBank, TableSpec

    spec = TableSpec("nodes", columns=(Column("embedding", shape=(8,)), Column("label", dtype="int64", shape=())),
                     optimizer="adagrad", learning_rate=0.5)
    bank = KnowledgeBank.create(client, [spec], n_shards=2, buckets=64, name="cli-src")
    try:
        keys = np.arange(1, 401, dtype=np.int64) * 7919
        rng = np.random.default_rng(0)
        bank.update("nodes", keys, {"embedding": rng.standard_normal((400, 8)).astype(np.float32),
                                    "label": np.arange(400)}, model_step=3, maker="m1")
        bank.apply_gradients("nodes", keys[:100], rng.standard_normal((100, 8)).astype(np.float32))
        bank.snapshot(str(root), 42)
    finally:
        bank.close()


def test_restore_onto_three_shards_and_write_back(
    client: Any, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    _bank_snapshot(client, src)
    address = client.scheduler.address
    assert main(["bank", "restore", str(src), "--shards", "3", "--to", str(dst), "--address", address]) == 0
    out = capsys.readouterr().out
    assert "restored v1 (step 42, 2 shards)" in out and "onto 3 shards" in out
    entry = list_snapshots(dst)[-1]
    assert entry["n_shards"] == 3 and entry["step"] == 42 and entry["rows"] == {"nodes": 400}
    a = sort_by_key(read_snapshot(src)["nodes"])
    b = sort_by_key(read_snapshot(dst)["nodes"])
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].tobytes() == b[name].tobytes(), name  # values, Adagrad slots and provenance
    assert read_manifest(dst)["makers"] == read_manifest(src)["makers"]


def test_inspect_prints_the_folders_bytes_by_part_and_each_tables_durability(
        tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    import os

    from carls_dask.bank import Column, KnowledgeBank, TableSpec
    from carls_dask.bank_cli import _mb

    made = TableSpec("made", columns=(Column("value", shape=(4,)),), optimizer=None, durability="group")
    trained = TableSpec("trained", columns=(Column("embedding", shape=(4,)),), durability="snapshot")
    keys = np.arange(200, dtype=np.int64)
    with KnowledgeBank.local([made, trained], n_shards=2, buckets=16, log_root=str(tmp_path)) as bank:
        for step in (1, 2):
            bank.update("made", keys, {"value": np.full((200, 4), step, np.float32)})
            bank.lookup("trained", keys, insert=True)
            bank.snapshot(str(tmp_path), step)
        bank.update("made", keys[:10], {"value": np.full((10, 4), 3, np.float32)})
    log = sum(p.stat().st_size for p in (tmp_path / "delta").glob("shard-*/seg-*.log"))
    snaps = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path / "snapshots") for f in fs)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(tmp_path) for f in fs)
    assert main(["bank", "inspect", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert (f"bytes: {_mb(total)} = snapshots {_mb(snaps)} + delta log {_mb(log)} + other {_mb(total - snaps - log)}"
            in out.splitlines())
    assert "  durability group" in out and "  durability snapshot" in out
    assert main(["bank", "inspect", str(tmp_path), "--version", "1"]) == 0
    assert "delta log after v1: truncated by a newer snapshot (carls.storage.log-history)" in capsys.readouterr().out
