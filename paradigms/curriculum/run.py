"""``carls-dask run curriculum``: the curriculum on a Dask cluster, writing a run folder the dashboards open.

Options (``-o KEY=VALUE``) are the fields of :class:`~carls_dask.paradigms.curriculum.settings.CurriculumSettings`
(``dataset``, ``noise``, ``pacing``, ``clean``, ``scorer``, ...) plus:

``makers``
    Knowledge makers sharing the scoring of the data (default 1).
``snapshot-every``
    Maker rounds between bank snapshots (default 1).
``timeout``
    Seconds the run may take before it is stopped with an error (default 3600).

The run folder holds ``bank/`` (a snapshot after every maker round), ``metrics.zarr`` (progress,
pacing vs admitted fraction, realised sampling, detection precision), ``truth.npz`` (the clean
training labels, for the dashboards' accuracy-by-difficulty view), ``run.json`` and
``curriculum.json`` (settings and final figures).
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
import sys
from typing import Any

import numpy as np

from carls_dask.paradigms.curriculum.loops import CurriculumTrainer, DifficultyMaker, difficulty_table
from carls_dask.paradigms.curriculum.settings import CurriculumSettings, load_data
from carls_dask.runtime.progress import ProgressBook
from carls_dask.runtime.registry import RunRequest
from carls_dask.storage.errors import ConfigError

__all__ = ["CurriculumBook", "main", "run_curriculum"]

logger = logging.getLogger(__name__)

#: Series the dashboards read without a loop prefix, and the loop kind that reports them.
UNPREFIXED = {
    "trainer": ("pacing", "admitted_fraction", "sampled_fraction", "batch_rank", "label_accuracy", "test_accuracy"),
    "maker": ("pl_precision", "pl_coverage", "flag_precision", "flag_recall", "flagged_fraction"),
}


class CurriculumBook(ProgressBook):
    """A progress book that also writes the curriculum's series under the names the dashboards read."""

    def row(self) -> dict[str, float]:
        out = super().row()
        with self._lock:
            for kind, names in UNPREFIXED.items():
                loops = [n for n in self.loops if self.kinds.get(n) == kind]
                if not loops:
                    continue
                values = self.loops[loops[0]]
                out.update({name: values[name] for name in names if name in values})
        return out


def _pop_int(options: dict[str, str], key: str, default: int) -> int:
    text = options.pop(key, None)
    if text is None:
        return default
    try:
        value = int(text)
    except ValueError:
        raise ConfigError(f"curriculum option {key}={text!r}: expected a positive int") from None
    if value < 1:
        raise ConfigError(f"curriculum option {key}={text!r}: expected a positive int")
    return value


def run_curriculum(settings: CurriculumSettings, run_dir: str | pathlib.Path, *, makers: int = 1,
                   snapshot_every: int = 1, timeout: float = 3600.0, cluster: Any = None,
                   progress: bool | None = None) -> dict[str, Any]:
    """Run one curriculum on a Workbench and return its summary (also written to ``curriculum.json``).

    Parameters
    ----------
    settings
        The run.
    run_dir
        The run folder to write.
    makers
        Knowledge makers; each scores ``1/makers`` of the examples.
    snapshot_every
        Maker rounds between bank snapshots.
    timeout
        Seconds the trainer may run; :class:`~carls_dask.errors.DeadlineExceeded` after that.
    cluster
        Passed to :class:`~carls_dask.runtime.Workbench` (``None``: the configured cluster).
    progress
        Show a terminal progress bar (default ``carls.runtime.progress``).
    """
    from carls_dask.runtime.workbench import Workbench

    run = pathlib.Path(run_dir)
    data = load_data(settings)  # fails here, before a cluster starts, when the data is missing
    run.mkdir(parents=True, exist_ok=True)
    np.savez(run / "truth.npz", keys=np.arange(data.labels.clean.shape[0], dtype=np.int64),
             labels=data.labels.clean)
    wb = Workbench(cluster, run_dir=run, progress=progress)
    wb.book = CurriculumBook()
    with wb.start():
        wb.create_bank([difficulty_table()])
        wb.submit_trainer(CurriculumTrainer(settings))
        for i in range(makers):
            wb.submit_maker(DifficultyMaker(settings, name=f"maker-{i}" if makers > 1 else "maker",
                                            snapshot_dir=str(run / "bank") if i == 0 else None,
                                            snapshot_every=snapshot_every, part=i, parts=makers))
        wb.wait(timeout=timeout)
        results = wb.stop()
    trainer = results["trainer"]
    value = dict(trainer.value or {})
    maker_rounds = {name: r.steps for name, r in results.items() if r.kind == "maker"}
    staleness = [m.staleness for r in results.values() if r.kind == "maker" for m in r.rounds]
    summary = {
        "settings": settings.to_json(),
        "test_accuracy": value.get("test_accuracy"),
        "train_accuracy_clean": value.get("train_accuracy_clean"),
        "flag_precision": value.get("flag_precision"),
        "flag_recall": value.get("flag_recall"),
        "flagged_fraction": value.get("flagged_fraction"),
        "label_accuracy": value.get("label_accuracy"),
        "trainer_steps": trainer.steps,
        "trainer_seconds": trainer.elapsed,
        "maker_rounds": maker_rounds,
        "maker_staleness_s_mean": float(np.mean(staleness)) if staleness else math.nan,
        "history": value.get("history", []),
    }
    (run / "curriculum.json").write_text(json.dumps(summary, indent=2, default=float))
    return summary


def main(request: RunRequest) -> int:
    """The ``carls-dask run curriculum`` entry point."""
    options = dict(request.options)
    makers = _pop_int(options, "makers", 1)
    snapshot_every = _pop_int(options, "snapshot-every", _pop_int(options, "snapshot_every", 1))
    timeout = float(_pop_int(options, "timeout", 3600))
    overrides: dict[str, Any] = {}
    if request.steps is not None:
        overrides["steps"] = request.steps
    settings = CurriculumSettings.from_options(options, **overrides)
    summary = run_curriculum(settings, request.run_dir, makers=makers, snapshot_every=snapshot_every,
                             timeout=timeout)

    def fmt(v: Any) -> str:
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.3f}"

    sys.stdout.write(
        f"curriculum {settings.dataset} noise={settings.noise:g} pacing={settings.pacing} clean={settings.clean}: "
        f"test accuracy {fmt(summary['test_accuracy'])}, flag precision {fmt(summary['flag_precision'])}, "
        f"recall {fmt(summary['flag_recall'])}; run folder {request.run_dir}\n")
    return 0
