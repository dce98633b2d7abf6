"""Stores are JSON and raw numbers only: a tampered store is refused with a clear error, nothing unpickled."""

from __future__ import annotations

import base64
import json
import pathlib
import pickle
import re
import shutil
import struct
import zlib
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from carls_dask.errors import CorruptStoreError, IncompatibleStoreError
from carls_dask.storage.bankview import open_bank
from carls_dask.storage.deltalog import DeltaLog, replay
from carls_dask.storage.snapshots import read_manifest, read_snapshot
from tests.storage.states import assert_same, make_states, merged, snapshot, sort_by_key, table_rows

REPO = pathlib.Path(__file__).resolve().parents[2]
SHARD = "snapshots/v000001/shard-0000.zarr/nodes"


class Canary:
    """Unpickling it creates a file: proof that something was unpickled."""

    def __init__(self, path: pathlib.Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, ...]:
        return (pathlib.Path.touch, (self.path,))


def test_no_reader_can_unpickle() -> None:
    """The store code has no pickle, object codec or allow_pickle anywhere."""
    pattern = re.compile(r"\bpickle\b|object_codec|allow_pickle|dtype=object|numcodecs\.Pickle|\bmarshal\b")
    hits = []
    for folder in ("storage", "carls_dask/bank", "dashboards"):
        for path in (REPO / folder).rglob("*.py"):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                code = line.split("#", 1)[0]
                if pattern.search(code) and "Nothing is pickled" not in line:
                    hits.append(f"{path.relative_to(REPO)}:{i}: {line.strip()}")
    # np.load is only ever called with its default allow_pickle=False
    assert hits == [], hits


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    root = tmp_path_factory.mktemp("pristine") / "bank"
    snapshot(root, make_states(300, n_shards=1, seed=3), chunk_rows=100)
    with DeltaLog(root, 0) as log:
        for seq in (1, 2):
            keys = np.arange(seq * 10, seq * 10 + 5, dtype=np.int64)
            log.append(seq, "nodes", "upsert", table_rows(keys, 64, seed=seq))
    return root


def _edit_json(path: pathlib.Path, change: Callable[[dict[str, Any]], None]) -> None:
    obj = json.loads(path.read_text())
    change(obj)
    path.write_text(json.dumps(obj))


def _set(path: list[str], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(obj: dict[str, Any]) -> None:
        for k in path[:-1]:
            obj = obj[k]
        obj[path[-1]] = value
    return change


def _blob(sentinel: pathlib.Path) -> bytes:
    return pickle.dumps(Canary(sentinel))


ZARR = f"{SHARD}/col/embedding/zarr.json"
SNAP = "snapshots/v000001/snapshot.json"
# (case, file, how to tamper, the error's type, what its message names)
CASES: list[tuple[str, str, Any, type, str]] = [
    ("object dtype in zarr.json", ZARR, _set(["data_type"], "object"), CorruptStoreError, "cannot be opened"),
    ("string dtype in zarr.json", ZARR,
     lambda o: o.update(data_type="string", codecs=[{"name": "vlen-utf8"}]), CorruptStoreError, "expected a numeric"),
    ("pickle codec in zarr.json", ZARR,
     _set(["codecs"], [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "numcodecs.pickle"}]),
     CorruptStoreError, "numcodecs.pickle"),
    ("pickled blob in attributes", ZARR, "attrs", CorruptStoreError, "carries attributes"),
    ("pickled chunk", f"{SHARD}/col/embedding/c/1/0", "chunk", CorruptStoreError, "c/1/0"),
    ("object dtype in the manifest", SNAP, _set(["tables", "nodes", "arrays", "col/embedding", "dtype"], "|O"),
     CorruptStoreError, "dtype '|O'"),
    ("rows as a string", SNAP, _set(["shards", "0", "tables", "nodes", "rows"], "300"), CorruptStoreError, "rows '300'"),
    ("shards as a list", SNAP, _set(["shards"], [1]), CorruptStoreError, "shards is list"),
    ("path out of the store", SNAP, _set(["path"], "../../elsewhere"), CorruptStoreError, "'../../elsewhere'"),
    ("makers as a string", SNAP, _set(["makers"], "m"), CorruptStoreError, "makers is 'm'"),
    ("negative shape", SNAP, _set(["tables", "nodes", "arrays", "col/embedding", "shape"], [-8]),
     CorruptStoreError, "shape [-8]"),
    ("format as a string", SNAP, _set(["format"], "1"), IncompatibleStoreError, "format version is '1'"),
    ("root entry version as a string", "manifest.json", lambda o: o["snapshots"][0].update(version="1"),
     CorruptStoreError, "int 'version'"),
    ("root manifest not JSON", "manifest.json", "garbage", CorruptStoreError, "not valid JSON"),
    ("pickled root manifest", "manifest.json", "pickle", CorruptStoreError, "not valid JSON"),
]


@pytest.mark.parametrize(("case", "rel", "how", "error", "needle"), CASES, ids=[c[0] for c in CASES])
def test_tampered_snapshot_is_refused_and_nothing_unpickled(
    pristine: pathlib.Path, tmp_path: pathlib.Path, case: str, rel: str, how: Any, error: type, needle: str
) -> None:
    root = tmp_path / "bank"
    shutil.copytree(pristine, root)
    sentinel = tmp_path / "unpickled"
    target = root / rel
    if how == "attrs":
        _edit_json(target, _set(["attributes"], {"blob": base64.b64encode(_blob(sentinel)).decode()}))
    elif how == "chunk":
        target.write_bytes(_blob(sentinel))
    elif how == "garbage":
        target.write_text("{not json")
    elif how == "pickle":
        target.write_bytes(_blob(sentinel))
    else:
        _edit_json(target, how)
    files = {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}
    loaders = [lambda: read_snapshot(root), lambda: open_bank(root)["embedding"].load()]
    if rel in (SNAP, "manifest.json"):
        loaders.append(lambda: list(replay(root, since_version=1)))  # the log reader trusts no manifest either
    for load in loaders:
        with pytest.raises(error) as info:
            load()
        assert needle in str(info.value), str(info.value)
        assert str(root) in str(info.value) or "bank store" in str(info.value)  # names the store
    assert not sentinel.exists()
    assert {p: p.read_bytes() for p in root.rglob("*") if p.is_file()} == files  # reading changed nothing


def test_untampered_copy_reads(pristine: pathlib.Path, tmp_path: pathlib.Path) -> None:
    """The control: the same copy and readers work on an untouched store."""
    root = tmp_path / "bank"
    shutil.copytree(pristine, root)
    assert_same(sort_by_key(read_snapshot(root)["nodes"]), merged(make_states(300, n_shards=1, seed=3)))
    assert read_manifest(root)["version"] == 1
    keys = set(read_snapshot(root)["nodes"]["keys"].tolist()) | set(range(10, 15)) | set(range(20, 25))
    assert open_bank(root)["embedding"].shape[0] == len(keys)  # snapshot rows + logged keys
    assert [r.seq for r in replay(root, since_version=1)] == [1, 2]


def _reframe(path: pathlib.Path, header: bytes, payload: bytes) -> None:
    """Append a frame with a correct CRC: only what a writer controls is wrong."""
    frame = struct.pack("<4sIQI", b"CDL1", len(header), len(payload), zlib.crc32(payload, zlib.crc32(header)))
    with open(path, "ab") as fh:
        fh.write(frame + header + payload)


@pytest.mark.parametrize("bad", ["object dtype", "pickled header", "header list", "byte count"])
def test_tampered_delta_record_is_refused(pristine: pathlib.Path, tmp_path: pathlib.Path, bad: str) -> None:
    from carls_dask.storage.deltalog import _FRAME

    assert _FRAME.size == struct.calcsize("<4sIQI")
    root = tmp_path / "bank"
    shutil.copytree(pristine, root)
    sentinel = tmp_path / "unpickled"
    seg = next((root / "delta/shard-0000").glob("seg-*.log"))
    blob = _blob(sentinel)
    header: dict[str, Any] = {"seq": 3, "step": 3, "table": "nodes", "op": "upsert", "wall_time": 1.0,
                              "arrays": [["keys", "<i8", [1], 0, 8], ["col/x", "|O", [1], 8, len(blob)]]}
    if bad == "pickled header":
        _reframe(seg, blob, b"")
    elif bad == "header list":
        _reframe(seg, b"[3]", b"")
    else:
        if bad == "byte count":
            header["arrays"] = [["keys", "<i8", [1], 0, 16]]
        _reframe(seg, json.dumps(header).encode(), np.int64(7).tobytes() + blob)
    with pytest.raises(CorruptStoreError, match=r"delta log .*seg-.*record at byte \d+ does not decode"):
        list(replay(root))
    with pytest.raises(CorruptStoreError, match="does not decode"):
        DeltaLog(root, 0)  # a writer does not truncate it away as if it were a torn tail
    assert not sentinel.exists()
