"""What a run measured and ``RUN/result.json``: :class:`RunResult`, shared by the runner and the Workbench.

:mod:`carls_dask.runtime.runner` builds the result of a paradigm's run (its schema is described there);
:func:`workbench_result` builds that of a run made on a plain
:class:`~carls_dask.runtime.workbench.Workbench` that keeps its run folder itself.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import pathlib
import platform
import time
from collections.abc import Mapping, Sequence
from typing import Any

from carls_dask.runtime.context import LoopResult
from carls_dask.runtime.paradigm import Paradigm
from carls_dask.runtime.settings import strict_json
from carls_dask.storage.runfolder import RunFolder

__all__ = [
    "RESULT_SCHEMA", "RunResult", "has_snapshot", "loop_records", "snapshots_of", "versions", "workbench_result",
    "write_json",
]

RESULT_SCHEMA = "carls-dask/result/2"


@dataclasses.dataclass
class RunResult:
    """What a run measured; :meth:`to_json` is the content of ``RUN/result.json``.

    Attributes
    ----------
    paradigm, variant, seed
        What ran (for a run on a plain Workbench: no paradigm, variant or seed).
    driver
        ``"workbench"`` or ``"inline"``.
    settings
        The settings, as JSON.
    figures
        The paradigm's figures (:meth:`Paradigm.summarize`), over every segment of the run.
    loops
        Per loop: kind, steps (or rounds) over every segment, the step it ended at, seconds, why it
        ended, restarts and its last metrics.
    snapshots
        The bank snapshots the run folder keeps (version and step).
    resumed_from
        The step the primary trainer continued from, or ``None``.
    versions
        Versions of carls-dask and its main dependencies.
    started, ended, wall_seconds
        Unix times of the first segment's start and the last one's end, and the wall time of all segments.
    run_id
        The run's identity (``request.json``), the same in a moved or copied folder.
    reasons
        Why each figure that is ``None`` has no value (a run too short to measure it, ...).
    segments
        One entry per segment of the run (a run extended with ``resume_run(..., steps=N)`` has several).
    run_dir
        The run folder, or ``None``.
    results
        Every loop's :class:`~carls_dask.runtime.context.LoopResult` of the newest segment (not written to JSON).
    """

    paradigm: str
    variant: str
    seed: int | None
    driver: str
    settings: dict[str, Any]
    figures: dict[str, Any]
    loops: dict[str, dict[str, Any]]
    snapshots: list[dict[str, int]]
    resumed_from: int | None
    versions: dict[str, str]
    started: float
    ended: float
    wall_seconds: float
    run_id: str = ""
    reasons: dict[str, str] = dataclasses.field(default_factory=dict)
    segments: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    run_dir: str | None = None
    results: dict[str, LoopResult] = dataclasses.field(default_factory=dict, repr=False)

    def __getitem__(self, name: str) -> Any:
        """A figure by name (``result["test_acc"]``)."""
        return self.figures[name]

    def to_json(self) -> dict[str, Any]:
        """The strict-JSON form written to ``result.json``."""
        out = {"schema": RESULT_SCHEMA}
        for f in dataclasses.fields(self):
            if f.name not in ("results", "run_dir"):
                out[f.name] = getattr(self, f.name)
        result: dict[str, Any] = strict_json(out)
        return result

    def headline(self, names: Sequence[str] = ()) -> str:
        """One line: the paradigm, variant and seed, then the named figures (all numeric ones when none are named).

        A named figure without a value reads ``none``; :meth:`notes` says why.
        """
        keys = [n for n in names if n in self.figures] or [k for k, v in self.figures.items()
                                                           if isinstance(v, int | float) and not isinstance(v, bool)]
        parts = []
        for k in keys:
            v = self.figures[k]
            if v is None or (isinstance(v, float) and not math.isfinite(v)):
                parts.append(f"{k} none")
            else:
                parts.append(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}")
        return f"{self.paradigm} {self.variant} (seed {self.seed}): " + (", ".join(parts) or "no figures")

    def notes(self, names: Sequence[str] = ()) -> list[str]:
        """Why each of the named figures (every figure when none are named) has no value, one line per reason."""
        keys = [n for n in (names or self.figures) if n in self.reasons]
        by_reason: dict[str, list[str]] = {}
        for k in keys:
            by_reason.setdefault(self.reasons[k], []).append(k)
        return [f"{', '.join(ks)}: {why}" for why, ks in by_reason.items()]


def versions() -> dict[str, str]:
    """Versions of carls-dask and the libraries a run's figures depend on."""
    import importlib.metadata as md

    out = {"python": platform.python_version()}
    for dist, key in (("carls-dask", "carls-dask"), ("torch", "torch"), ("dask", "dask"),
                      ("distributed", "distributed"), ("numpy", "numpy"), ("xarray", "xarray"), ("zarr", "zarr")):
        try:
            out[key] = md.version(dist)
        except md.PackageNotFoundError:
            out[key] = "not installed"
    return out


def write_json(path: pathlib.Path, obj: Any) -> None:
    """Write ``obj`` to ``path`` under a temporary name, then rename it: a reader never sees half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, allow_nan=False))
    os.replace(tmp, path)


def snapshots_of(bank_root: str | None) -> list[dict[str, int]]:
    """The snapshots a bank store keeps (version and step); empty without one."""
    if bank_root is None or not has_snapshot(bank_root):
        return []
    from carls_dask.storage import list_snapshots

    return [{"version": int(s["version"]), "step": int(s["step"])} for s in list_snapshots(bank_root)]


def loop_records(results: Mapping[str, LoopResult], restarts: Mapping[str, int]) -> dict[str, Any]:
    """What ``result.json`` says of each loop."""
    records: dict[str, Any] = strict_json({
        n: {"kind": r.kind, "steps": r.steps, "step": r.step if r.kind == "trainer" else None, "seconds": r.elapsed,
            "reason": r.reason, "restarts": int(restarts.get(n, 0)), "metrics": dict(r.metrics)}
        for n, r in results.items()})
    return records


def workbench_result(run_dir: str | os.PathLike[str], results: Mapping[str, LoopResult], restarts: Mapping[str, int],
                     *, primary: str, started: float, run_id: str, bank_root: str | None) -> RunResult:
    """The ``result.json`` of a run made on a plain :class:`~carls_dask.runtime.workbench.Workbench` (no paradigm),
    written into ``run_dir``: the loops' results, the primary trainer's figures (its ``finish()`` value when
    it is a mapping, as :meth:`Paradigm.summarize` takes them) and the snapshots ``bank_root`` keeps."""
    figures = dict(Paradigm[None]().summarize(None, results))
    ended = time.time()
    loops = loop_records(results, restarts)
    first = results.get(primary)
    segment = {"driver": "workbench", "from_step": first.resumed_at if first is not None else None,
               "to_step": first.step if first is not None else None, "started": started, "ended": ended,
               "wall_seconds": ended - started, "figures": strict_json(figures),
               "loops": {n: {k: v for k, v in lp.items() if k != "metrics"} for n, lp in loops.items()}}
    result = RunResult(
        paradigm="", variant="", seed=None, driver="workbench", settings={}, figures=figures, loops=loops,
        snapshots=snapshots_of(bank_root), resumed_from=first.resumed_at if first is not None else None,
        versions=versions(), started=started, ended=ended, wall_seconds=ended - started, run_id=run_id,
        segments=[segment], run_dir=str(run_dir), results=dict(results),
    )
    write_json(RunFolder(run_dir).result, result.to_json())
    return result


def has_snapshot(root: str) -> bool:
    from carls_dask.errors import CarlsError
    from carls_dask.storage import list_snapshots

    try:
        return bool(list_snapshots(root))
    except CarlsError:
        return False
