"""The manifests of a bank store: which snapshots are committed, and what each one holds.

``RUN/bank/manifest.json`` lists the committed snapshots, newest last; it is replaced atomically and is
the commit point of a snapshot. Each version folder has its own ``snapshot.json`` with the tables, the
arrays' dtypes and row shapes, the maker names and, per shard, the rows it holds and ``delta_seq`` (the
last delta-log record the snapshot includes).

This module only reads and checks those JSON files; it imports neither Zarr nor the delta log, so both
:mod:`carls_dask.storage.snapshots` and :mod:`carls_dask.storage.deltalog` can use it. Every field is
type-checked before anything is read from it: a tampered manifest is refused with
:class:`~carls_dask.errors.CorruptStoreError`.
"""

from __future__ import annotations

import logging
import os
import pathlib
import re
from collections.abc import Mapping
from typing import Any

import numpy as np

from carls_dask.errors import CorruptStoreError, IncompatibleStoreError, StoreNotFoundError
from carls_dask.storage.fsutil import read_json
from carls_dask.storage.runfolder import BANK, part_hint

__all__ = [
    "FORMAT",
    "KIND",
    "MANIFEST",
    "SNAPSHOTS",
    "check_format",
    "delta_seqs",
    "entry_at_step",
    "is_incremental",
    "list_snapshots",
    "load_root_manifest",
    "read_manifest",
    "shard_name",
    "version_name",
]

logger = logging.getLogger(__name__)

#: Version of the on-disk layout; readers refuse other values.
FORMAT = 1
KIND = "carls-dask bank"
MANIFEST = "manifest.json"
SNAPSHOTS = "snapshots"
VERSION_RE = re.compile(r"^v(\d{6,})$")


def version_name(version: int) -> str:
    """The folder name of snapshot ``version`` (``v000007``)."""
    return f"v{version:06d}"


def shard_name(shard: int) -> str:
    """The file-name stem of ``shard`` inside a version folder (``shard-0003``)."""
    return f"shard-{shard:04d}"


def empty_manifest() -> dict[str, Any]:
    """The root manifest of a store without a committed snapshot."""
    return {"format": FORMAT, "kind": KIND, "snapshots": []}


def load_root_manifest(root: pathlib.Path) -> dict[str, Any]:
    """The root manifest of ``root``, checked (an empty one when nothing was committed yet)."""
    if not root.is_dir():
        raise StoreNotFoundError(f"bank store {root}: no such folder; expected a run's bank folder (RUN/{BANK}) or a "
                                 "folder a KnowledgeBank snapshot was written to" + part_hint(root, BANK))
    path = root / MANIFEST
    if not path.exists():
        return empty_manifest()
    man = read_json(path, f"bank store {root}")
    check_format(man, f"bank store {root} ({MANIFEST})")
    if not isinstance(man.get("snapshots"), list):
        raise CorruptStoreError(f"bank store {root}: {MANIFEST} has no 'snapshots' list")
    for e in man["snapshots"]:
        if not isinstance(e, dict) or not all(_is_int(e.get(k)) for k in ("version", "step", "n_shards", "bytes")) \
                or not isinstance(e.get("created"), int | float) or not isinstance(e.get("rows"), dict) \
                or not isinstance(e.get("path"), str) or ".." in pathlib.PurePosixPath(e["path"]).parts:
            raise CorruptStoreError(f"bank store {root}: {MANIFEST} lists {e!r:.200}; expected entries with int "
                                    "'version', 'step', 'n_shards', 'bytes', 'created' seconds, 'rows' and a 'path' "
                                    "inside the store")
    return man


def check_format(obj: Mapping[str, Any], what: str) -> None:
    """Refuse a manifest of another kind or format version (``what`` names it in the error)."""
    if obj.get("kind", KIND) != KIND:
        raise IncompatibleStoreError(f"{what}: kind is {obj.get('kind')!r}; expected {KIND!r}")
    if obj.get("format") != FORMAT:
        raise IncompatibleStoreError(
            f"{what}: format version is {obj.get('format')!r}; this carls-dask reads format {FORMAT}"
        )


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_arrays(arrays: Any, where: str) -> None:
    """Each array entry of a manifest: a numeric dtype string and a list of positive row dims."""
    if not isinstance(arrays, dict):
        raise CorruptStoreError(f"{where}: 'arrays' is a {type(arrays).__name__}; expected an object")
    for name, desc in arrays.items():
        dtype = desc.get("dtype") if isinstance(desc, dict) else None
        try:
            kind = np.dtype(dtype).kind if isinstance(dtype, str) else "?"
        except TypeError:
            kind = "?"
        if kind not in "biuf":
            raise CorruptStoreError(f"{where}, array {name!r}: dtype {dtype!r}; expected a numeric dtype "
                                    "string such as '<f4' (object and string arrays are never read)")
        shape = desc.get("shape")
        if not isinstance(shape, list) or not all(_is_int(d) and d > 0 for d in shape):
            raise CorruptStoreError(f"{where}, array {name!r}: shape {shape!r}; expected a list of positive ints")


def _check_snapshot_manifest(man: dict[str, Any], what: str) -> None:
    """Refuse a snapshot manifest whose fields have the wrong types before anything is read from it."""
    for key in ("version", "buckets", "n_shards", "step", "bytes"):
        if not _is_int(man.get(key)) or man[key] < 0:
            raise CorruptStoreError(f"{what}: {key} is {man.get(key)!r}; expected a non-negative int")
    if not isinstance(man.get("created"), int | float) or isinstance(man["created"], bool):
        raise CorruptStoreError(f"{what}: created is {man.get('created')!r}; expected unix seconds")
    if not isinstance(man.get("path"), str) or ".." in pathlib.PurePosixPath(man["path"]).parts:
        raise CorruptStoreError(f"{what}: path is {man.get('path')!r}; expected a folder inside the store")
    makers = man.get("makers")
    if not isinstance(makers, list) or not all(isinstance(m, str) for m in makers):
        raise CorruptStoreError(f"{what}: makers is {makers!r}; expected a list of names")
    for field in ("tables", "shards", "meta"):
        if not isinstance(man.get(field), dict):
            raise CorruptStoreError(f"{what}: {field} is {type(man.get(field)).__name__}; expected an object")
    specs = man["meta"].get("tables", {})
    if not isinstance(specs, dict) or not all(isinstance(v, dict) for v in specs.values()):
        raise CorruptStoreError(f"{what}: meta.tables is {specs!r:.80}; expected an object of table specs")
    for tname, tinfo in man["tables"].items():
        if not isinstance(tinfo, dict) or not _is_int(tinfo.get("rows")) or tinfo["rows"] < 0:
            raise CorruptStoreError(f"{what}: table {tname!r} is {tinfo!r:.80}; expected an object with int rows")
        _check_arrays(tinfo.get("arrays"), f"{what}, table {tname!r}")
    for s_key, info in man["shards"].items():
        where = f"{what}, shard {s_key!r}"
        if not s_key.isdigit() or not isinstance(info, dict):
            raise CorruptStoreError(f"{where}: expected a shard number with an object of its tables")
        if not _is_int(info.get("delta_seq")) or not _is_int(info.get("bytes")) \
                or not isinstance(info.get("meta"), dict) or not isinstance(info.get("tables"), dict) \
                or not isinstance(info["meta"].get("owned_buckets", []), list):
            raise CorruptStoreError(f"{where}: delta_seq {info.get('delta_seq')!r}, bytes {info.get('bytes')!r}, "
                                    "meta and tables; expected two ints and two objects")
        parent = info.get("parent")
        if parent is not None and (not _is_int(parent) or parent < 0 or parent >= man["version"]):
            raise CorruptStoreError(f"{where}: parent {parent!r}; expected None or an older version")
        if not isinstance(info["meta"].get("makers", []), list) or not all(
                m in makers for m in info["meta"].get("makers", [])):
            raise CorruptStoreError(f"{where}: maker list {info['meta'].get('makers')!r}; expected names of {makers}")
        for tname, tinfo in info["tables"].items():
            if not isinstance(tinfo, dict) or not _is_int(tinfo.get("rows")) or tinfo["rows"] < 0:
                raise CorruptStoreError(f"{where}, table {tname!r}: rows {tinfo.get('rows') if isinstance(tinfo, dict) else tinfo!r}; "
                                        "expected a non-negative int")
            _check_arrays(tinfo.get("arrays"), f"{where}, table {tname!r}")
            if not _is_int(tinfo.get("deleted", 0)) or tinfo.get("deleted", 0) < 0:
                raise CorruptStoreError(f"{where}, table {tname!r}: deleted {tinfo.get('deleted')!r}; "
                                        "expected a non-negative int")


def is_incremental(man: Mapping[str, Any]) -> bool:
    """Whether any shard of a snapshot manifest is an increment on an older version."""
    return any(info.get("parent") is not None for info in man["shards"].values())


def list_snapshots(root: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """Committed snapshots of a bank store, oldest first.

    Each entry holds ``version``, ``step``, ``created`` (unix seconds), ``n_shards``, ``buckets``,
    ``rows`` (per table), ``bytes`` and ``path`` (relative to ``root``).

    Raises
    ------
    StoreNotFoundError
        If ``root`` is not a folder.
    IncompatibleStoreError
        If the store was written in another format version.
    """
    return list(load_root_manifest(pathlib.Path(root))["snapshots"])


def _no_snapshot(root: pathlib.Path) -> StoreNotFoundError:
    """The error for a bank store without a committed snapshot (a run folder given for its bank gets a hint)."""
    hint = part_hint(root, BANK)
    return StoreNotFoundError(f"bank store {root}: no committed snapshot; expected at least one"
                              + (hint or " (a run writes its first at step carls.run.snapshot-every)"))


def _entry(root: pathlib.Path, version: int | None) -> dict[str, Any]:
    snaps = list_snapshots(root)
    if not snaps:
        raise _no_snapshot(root)
    if version is None:
        return dict(snaps[-1])
    for e in snaps:
        if e["version"] == version:
            return dict(e)
    have = [e["version"] for e in snaps]
    raise StoreNotFoundError(f"bank store {root}: no snapshot version {version}; committed versions are {have}")


def read_manifest(root: str | os.PathLike[str], version: int | None = None) -> dict[str, Any]:
    """The manifest of one committed snapshot (the newest when ``version`` is None).

    It holds the fields of :func:`list_snapshots` plus ``meta`` (what the committer passed), ``makers``
    (maker names; ``prov/maker`` codes returned by :func:`read_snapshot` index this list), ``tables``
    (per table: rows, and each array's dtype and row shape) and ``shards`` (per shard: its exported
    ``meta``, rows per table and ``delta_seq``).
    """
    rootp = pathlib.Path(root)
    entry = _entry(rootp, version)
    man = read_json(rootp / entry["path"] / "snapshot.json", f"snapshot v{entry['version']} of {rootp}")
    check_format(man, f"snapshot v{entry['version']} of {rootp}")
    _check_snapshot_manifest(man, f"snapshot v{entry['version']} of {rootp}")
    return man


# --------------------------------------------------------------------------------------------- writing



def entry_at_step(root: str | os.PathLike[str], step: int | None) -> dict[str, Any]:
    """The root-manifest entry of the newest snapshot at or before ``step`` (the newest when None).

    Raises
    ------
    StoreNotFoundError
        If no committed snapshot is that old (or none at all).
    """
    rootp = pathlib.Path(root)
    snaps = list_snapshots(rootp)
    if not snaps:
        raise _no_snapshot(rootp)
    if step is None:
        return dict(snaps[-1])
    older = [e for e in snaps if e["step"] <= step]
    if not older:
        raise StoreNotFoundError(
            f"bank store {rootp}: no snapshot at or before step {step}; the oldest kept is at step {snaps[0]['step']}"
        )
    return dict(max(older, key=lambda e: (e["step"], e["version"])))


def delta_seqs(man: Mapping[str, Any]) -> dict[int, int]:
    """Per shard of a snapshot manifest, the last delta-log record the snapshot includes."""
    return {int(s): int(info["delta_seq"]) for s, info in man["shards"].items()}
