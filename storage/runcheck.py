"""What a finished run folder lacks: the parts its ``result.json`` promises that are missing or cannot be read.

A run that is still going (or died) has written only part of its folder, and the dashboards show
what is there. A run that *finished* wrote every part; when one of them is gone or damaged later
(deleted, copied half, a disk error), the readers must say so instead of waiting for data that will
never come. :func:`run_damage` names each such part in one sentence.
"""

from __future__ import annotations

import os
from typing import Any

from carls_dask.errors import StoreError
from carls_dask.storage.manifest import list_snapshots, read_manifest
from carls_dask.storage.metrics import series_names
from carls_dask.storage.runfolder import BANK, METRICS, RESULT, RunFolder

__all__ = ["run_damage"]


def _snapshots(result: dict[str, Any] | None) -> list[dict[str, Any]]:
    snaps = result.get("snapshots") if isinstance(result, dict) else None
    return [s for s in snaps if isinstance(s, dict)] if isinstance(snaps, list) else []


def run_damage(path: str | os.PathLike[str]) -> list[str]:
    """The parts of the finished run in ``path`` that are missing or unreadable, one sentence each.

    Empty when the run is whole, and for a run that has not finished (no ``result.json``): what it
    has not written yet is not damage. Checked: ``result.json`` reads as JSON; ``metrics.zarr``
    is there and its commit record reads; ``bank/`` is there and holds the newest snapshot the
    result lists (when it lists any).
    """
    run = RunFolder(path)
    if not run.finished():
        return []
    problems: list[str] = []
    try:
        result = run.read_json(RESULT)
    except StoreError as exc:
        problems.append(f"{RESULT} cannot be read ({exc})")
        result = None
    if not run.metrics.exists():
        problems.append(f"{METRICS} (the metric store: the learning curves) is missing")
    else:
        try:
            series_names(run.metrics)
        except StoreError as exc:
            problems.append(f"{METRICS} cannot be read ({exc})")
    snaps = _snapshots(result)
    if snaps:
        newest = snaps[-1]
        if not run.bank.exists():
            problems.append(f"{BANK}/ (the bank store, {len(snaps)} snapshot(s) listed in {RESULT}) is missing")
        else:
            try:
                versions = {int(s["version"]) for s in list_snapshots(run.bank)}
                version = int(newest.get("version", -1))
                if version not in versions:
                    problems.append(f"{BANK}/ lacks snapshot v{version} (step {newest.get('step')}) that {RESULT} "
                                    f"lists; it holds versions {sorted(versions)}")
                else:
                    read_manifest(run.bank, version)
            except StoreError as exc:
                problems.append(f"{BANK}/ cannot be read ({exc})")
    return problems
