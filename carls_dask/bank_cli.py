"""``carls-dask bank``: inspect, list, prune and restore knowledge-bank stores.

``inspect``, ``snapshots`` and ``prune`` read the store directly (no cluster). ``restore`` starts the
bank on a cluster from a snapshot (onto any shard count) through :meth:`KnowledgeBank.restore`, reports
what came back and can write it out again as a snapshot of another store (``--to``).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Sequence
from typing import Any, TextIO

import numpy as np

__all__ = ["add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bank`` sub-subcommands to ``parser``."""
    sub = parser.add_subparsers(dest="bank_command", metavar="ACTION", required=True)

    p = sub.add_parser("inspect", help="print a store's snapshot: tables, rows per shard, columns, steps, sizes, and "
                                       "the folder's bytes by part (snapshots, delta log)")
    p.add_argument("path", help="bank store folder (RUN/bank)")
    p.add_argument("--version", type=int, default=None, help="snapshot version (default: newest)")
    p.add_argument("--json", action="store_true", help="print the snapshot manifest as JSON")

    p = sub.add_parser("snapshots", help="list the committed snapshots of a store")
    p.add_argument("path", help="bank store folder (RUN/bank)")

    p = sub.add_parser("prune", help="delete all but the newest snapshots (and covered delta-log segments)")
    p.add_argument("path", help="bank store folder (RUN/bank)")
    p.add_argument("--keep", type=int, default=None, help="snapshots to keep (default: carls.storage.keep-snapshots)")

    p = sub.add_parser("restore", help="start a bank from a snapshot on a cluster, onto any number of shards")
    p.add_argument("path", help="bank store folder (RUN/bank)")
    p.add_argument("--shards", type=int, default=None, help="number of shards (default: as saved)")
    p.add_argument("--version", type=int, default=None, help="snapshot version (default: newest)")
    p.add_argument("--no-delta", action="store_true", help="do not replay the delta log after the snapshot")
    p.add_argument("--to", default=None, help="write the restored bank as a new snapshot of this store")
    p.add_argument("--step", type=int, default=None, help="step of the --to snapshot (default: the source's)")
    p.add_argument("--address", default=None, help="scheduler address (default: start a cluster from carls.cluster)")
    p.add_argument("--timeout", type=float, default=None, help="deadline in seconds of each shard call")


def run(args: argparse.Namespace) -> int:
    """Dispatch ``carls-dask bank ACTION``."""
    handlers = {"inspect": _inspect, "snapshots": _snapshots, "prune": _prune, "restore": _restore}
    return handlers[args.bank_command](args, sys.stdout)


def _mb(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{int(n)} B"


def _when(t: float) -> str:
    return datetime.datetime.fromtimestamp(t, tz=datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _table(out: TextIO, header: Sequence[str], rows: Sequence[Sequence[Any]], indent: str = "  ") -> None:
    cells = [list(map(str, header)), *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    for r in cells:
        out.write(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() + "\n")


def _snapshots(args: argparse.Namespace, out: TextIO) -> int:
    from carls_dask.storage.snapshots import list_snapshots

    snaps = list_snapshots(args.path)
    if not snaps:
        out.write(f"bank store {args.path}: no committed snapshot\n")
        return 0
    rows = [
        (e["version"], e["step"], _when(e["created"]), e["n_shards"],
         ", ".join(f"{t}={n}" for t, n in e["rows"].items()), _mb(e["bytes"]))
        for e in snaps
    ]
    _table(out, ("version", "step", "created", "shards", "rows", "size"), rows, indent="")
    return 0


def _inspect(args: argparse.Namespace, out: TextIO) -> int:
    from carls_dask.errors import StoreNotFoundError
    from carls_dask.storage.bankstore import MAKERS_TABLE, store_bytes
    from carls_dask.storage.deltalog import replay
    from carls_dask.storage.snapshots import list_snapshots, read_manifest

    man = read_manifest(args.path, args.version)
    if args.json:
        out.write(json.dumps(man, indent=1, sort_keys=True) + "\n")
        return 0
    n_snaps = len(list_snapshots(args.path))
    parts = store_bytes(args.path)
    out.write(f"bank store {args.path}: {n_snaps} snapshot(s)\n")
    out.write(f"bytes: {_mb(parts['total'])} = snapshots {_mb(parts['snapshots'])} + delta log {_mb(parts['log'])} "
              f"+ other {_mb(parts['other'])}\n")
    out.write(
        f"snapshot v{man['version']}: step {man['step']}, created {_when(man['created'])}, "
        f"{man['n_shards']} shards, {man['buckets']} buckets, {_mb(man['bytes'])}\n"
    )
    if man.get("makers"):
        out.write(f"makers: {', '.join(repr(m) for m in man['makers'])}\n")
    for tname, t in man["tables"].items():
        out.write(f"\ntable {tname!r}: {t['rows']} rows\n")
        spec = man.get("meta", {}).get("tables", {}).get(tname, {})
        if spec.get("optimizer"):
            out.write(f"  optimizer {spec['optimizer']}, learning rate {spec.get('learning_rate')}\n")
        out.write(f"  durability {spec.get('durability') or 'every-write'}\n")
        rows = [(name, np.dtype(a["dtype"]).name, tuple(a["shape"])) for name, a in t["arrays"].items()]
        _table(out, ("array", "dtype", "row shape"), rows)
    shard_rows = []
    for s, info in man["shards"].items():
        shard_rows.append(
            (s, *[info["tables"].get(t, {}).get("rows", 0) for t in man["tables"]],
             len(info["meta"].get("owned_buckets", [])), info["delta_seq"], _mb(info["bytes"]))
        )
    out.write("\nrows per shard:\n")
    _table(out, ("shard", *man["tables"], "buckets", "delta seq", "size"), shard_rows)
    pending: dict[int, list[int]] = {}
    try:
        for rec in replay(args.path, since_version=man["version"]):
            if rec.table != MAKERS_TABLE:
                pending.setdefault(rec.shard, []).append(rec.step)
    except StoreNotFoundError:
        out.write(f"\ndelta log after v{man['version']}: truncated by a newer snapshot (carls.storage.log-history)\n")
        return 0
    if pending:
        out.write(f"\ndelta log after v{man['version']}:\n")
        _table(out, ("shard", "records", "steps"),
               [(s, len(v), f"{min(v)}..{max(v)}") for s, v in sorted(pending.items())])
    else:
        out.write(f"\ndelta log after v{man['version']}: no records\n")
    return 0


def _prune(args: argparse.Namespace, out: TextIO) -> int:
    from carls_dask import config
    from carls_dask.storage.bankstore import prune_snapshots
    from carls_dask.storage.manifest import list_snapshots

    keep = int(config.get("storage.keep-snapshots", args.keep))
    removed = prune_snapshots(args.path, keep)
    kept = [e["version"] for e in list_snapshots(args.path)]
    out.write(f"removed versions {removed or 'none'}; kept {kept}\n")
    return 0


def _restore(args: argparse.Namespace, out: TextIO) -> int:
    from distributed import Client

    from carls_dask.bank import KnowledgeBank
    from carls_dask.runtime.clusters import start_cluster
    from carls_dask.storage.snapshots import read_manifest

    man = read_manifest(args.path, args.version)  # fail fast, before any cluster starts
    if args.address:
        cluster, address = None, args.address
    else:
        cluster, address = start_cluster()
    try:
        with Client(cluster if cluster is not None else address, direct_to_workers=True, timeout=60) as client:
            bank = KnowledgeBank.restore(
                client, args.path, n_shards=args.shards, version=man["version"],
                replay_log=not args.no_delta, timeout=args.timeout,
            )
            try:
                stats = bank.stats()
                out.write(
                    f"restored v{man['version']} (step {man['step']}, {man['n_shards']} shards) of {args.path} "
                    f"onto {bank.n_shards} shards\n"
                )
                rows = [
                    (i, *[st["tables"].get(t, {}).get("rows", 0) for t in stats["tables"]])
                    for i, st in enumerate(stats["shards"])
                ]
                _table(out, ("shard", *stats["tables"]), rows)
                if args.to:
                    step = int(man["step"] if args.step is None else args.step)
                    version = bank.snapshot(args.to, step)
                    out.write(f"wrote snapshot v{version} (step {step}) to {args.to}\n")
            finally:
                bank.close()
    finally:
        if cluster is not None:
            cluster.close()
    return 0
