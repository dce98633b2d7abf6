"""Learning curves of a run and comparison of runs: series discovery, smoothing, run labels and final figures.

Pure functions over the metric store (an :class:`xarray.Dataset` over ``step``, as
:meth:`~carls_dask.dashboards.runreader.RunReader.metrics` returns it) and over ``result.json`` /
``request.json``; the Panel views in :mod:`carls_dask.dashboards.views.learning` and
:mod:`carls_dask.dashboards.views.compare` draw what these compute.

The runner names every series ``LOOP.metric`` (``trainer.loss``, ``trainer.val_acc``,
``neighbour-maker.staleness_s``); some are also written without the loop's name (``val_acc``,
``maker_staleness_s``). Those aliases are ignored when the prefixed series exists.
"""

from __future__ import annotations

import json
import logging
import math
import pathlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
import xarray as xr

from carls_dask.errors import ConfigError, InvalidArgumentError
from carls_dask.storage.runfolder import MAKER_STALENESS_S, MAKER_VERSION, TRAIN_LOSS, RunFolder

__all__ = [
    "MAKER_METRICS",
    "SMOOTHING",
    "X_AXES",
    "Loops",
    "RunInfo",
    "curve",
    "discover",
    "final_figures",
    "is_eval_metric",
    "last_values",
    "run_info",
    "smooth",
    "summary_table",
]

logger = logging.getLogger(__name__)

#: The figures drawn for every knowledge maker, in order: staleness of the model it used, rounds, rows written,
#: and for makers that follow a change feed, the share of the rows they re-scored and the keys the feed gave.
MAKER_METRICS = ("staleness_s", "round", "rows", "coverage", "feed_keys")
#: Ways to smooth a curve: exponential moving average (span of N points) or trailing mean of N points.
SMOOTHING = ("EMA", "window")
#: What a curve's x axis shows: the step, or seconds since the run's first metric row.
X_AXES = ("step", "wall time (s)")

#: Unprefixed series some runs write for their trainer (older runs, test writers); used only when
#: no ``trainer.<metric>`` series exists.
_TRAINER_ALIASES = {TRAIN_LOSS: "loss", "val_acc": "val_acc", "test_acc": "test_acc", "train_acc": "train_acc"}
#: Unprefixed series the progress sink writes as copies of one loop's series under another name.
_SINK_COPIES = {MAKER_STALENESS_S, MAKER_VERSION}
#: Names of evaluation metrics: accuracies, top-k, recall@k, precision, recall, F1, AUC, ranks.
_EVAL = re.compile(r"(^|_)(acc|accuracy|top\d+|precision|recall|f1|auc|mrr|ndcg)($|_|@)|r@\d+|top\d+")
#: Loss-like metric names of a trainer (the loss and its parts are drawn together).
_LOSS = re.compile(r"(^|_)loss$")


def is_eval_metric(metric: str) -> bool:
    """Whether ``metric`` (without its loop's name) is an evaluation metric: ``val_acc``, ``top1``, ``i2t_r@5`` ...

    Examples
    --------
    >>> [m for m in ("loss", "val_acc", "test_acc", "top5", "i2t_r@1", "steps_per_s", "step") if is_eval_metric(m)]
    ['val_acc', 'test_acc', 'top5', 'i2t_r@1']
    """
    return bool(_EVAL.search(metric))


@dataclass
class Loops:
    """The loops a run's metric store shows and the series of each.

    Attributes
    ----------
    trainers
        Trainer name to ``{metric: series name}`` of its loss (``loss``) and evaluation metrics, in store order.
    makers
        Maker name to ``{metric: series name}`` of :data:`MAKER_METRICS` it writes.
    others
        Every loop (trainers, makers and loops of another kind) to ``{metric: series name}`` of its other
        series, in store order; ``""`` holds series written without a loop's name that copy none of them.
    kinds
        Loop name to its kind (``"trainer"``, ``"maker"`` or ``""`` when the run does not say).
    """

    trainers: dict[str, dict[str, str]] = field(default_factory=dict)
    makers: dict[str, dict[str, str]] = field(default_factory=dict)
    others: dict[str, dict[str, str]] = field(default_factory=dict)
    kinds: dict[str, str] = field(default_factory=dict)

    def series(self) -> list[str]:
        """Every series name drawn (trainers first, then makers, then the loops' other series)."""
        return [s for group in (self.trainers, self.makers, self.others) for loop in group.values()
                for s in loop.values()]

    def trainer_series(self) -> list[str]:
        """The series of every trainer: ``TRAINER.loss`` and its evaluation metrics."""
        return [s for loop in self.trainers.values() for s in loop.values()]

    def __bool__(self) -> bool:
        """Whether a loop wrote a series (series written without a loop's name alone do not count)."""
        return bool(self.trainers or self.makers or any(loop for loop in self.others))


def _kinds(result: Mapping[str, Any] | None) -> dict[str, str]:
    loops = (result or {}).get("loops") or {}
    return {str(k): str(v.get("kind", "")) for k, v in loops.items() if isinstance(v, Mapping)}


def discover(names: Iterable[str], result: Mapping[str, Any] | None = None) -> Loops:
    """The trainers and makers among series ``names`` (``LOOP.metric``) and what each writes.

    A loop is a trainer when it writes ``LOOP.loss`` or ``result["loops"][LOOP]["kind"] == "trainer"``;
    its curves are ``loss`` and every evaluation metric (see :func:`is_eval_metric`). A loop is a
    maker when it writes one of :data:`MAKER_METRICS` (and is no trainer) or ``result`` says it is one.
    Every other series of a loop (``trainer.steps_per_s``, a maker's own ``nb_planted_cos``) is one
    of its :attr:`Loops.others`, but ``LOOP.step`` (the x axis itself). Unprefixed aliases
    (``train_loss``, ``val_acc``, ``test_acc``, ``train_acc``) stand for the trainer named ``trainer``
    only when that trainer has no prefixed series of the same metric; the other unprefixed series are
    copies the progress sink writes of a loop's series (:data:`_SINK_COPIES`, or one named as a loop's
    metric) and are left out, except those that copy none (a run written without loop names).

    Parameters
    ----------
    names
        Series names of the metric store, in store order.
    result
        The run's ``result.json`` (or ``None`` while it runs); gives each loop's kind.
    """
    names = list(names)
    kinds = _kinds(result)
    by_loop: dict[str, dict[str, str]] = {}
    for name in names:
        loop, dot, metric = name.partition(".")
        if dot and loop and metric:
            by_loop.setdefault(loop, {})[metric] = name
    loops = Loops()
    for loop, metrics in by_loop.items():
        kind = kinds.get(loop, "")
        drawn: set[str] = {"step"}
        if kind == "trainer" or (not kind and "loss" in metrics):
            chosen = {m: s for m, s in metrics.items() if _LOSS.search(m) or is_eval_metric(m)}
            ordered = dict(sorted(chosen.items(), key=lambda kv: (kv[0] != "loss", not _LOSS.search(kv[0]))))
            loops.trainers[loop] = ordered
            loops.kinds[loop] = "trainer"
            drawn |= set(chosen)
        elif kind == "maker" or any(m in metrics for m in MAKER_METRICS):
            loops.makers[loop] = {m: metrics[m] for m in MAKER_METRICS if m in metrics}
            loops.kinds[loop] = "maker"
            drawn |= set(MAKER_METRICS)
        else:
            loops.kinds[loop] = kind
        rest = {m: s for m, s in metrics.items() if m not in drawn}
        if rest:
            loops.others[loop] = rest
    present = set(names)
    aliases = {metric: name for name, metric in _TRAINER_ALIASES.items() if name in present}
    copied = {m for metrics in by_loop.values() for m in metrics} | _SINK_COPIES | set(_TRAINER_ALIASES)
    own = {name: name for name in names if "." not in name and name not in copied and name != "wall_time"}
    if own:
        loops.others[""] = own
    if aliases:
        trainer = loops.trainers.setdefault("trainer", {})
        for metric, name in aliases.items():
            trainer.setdefault(metric, name)
        loops.trainers["trainer"] = dict(sorted(trainer.items(), key=lambda kv: kv[0] != "loss"))
    return loops


def smooth(y: np.ndarray, kind: str = "EMA", amount: int = 0) -> np.ndarray:
    """``y`` smoothed over its last ``amount`` points; ``amount`` 0 (or 1) returns it unchanged.

    ``kind`` ``"EMA"``: exponential moving average of span ``amount`` (weight ``2 / (amount + 1)``
    on the newest point, started at the first point); ``"window"``: mean of the trailing ``amount``
    points (fewer at the start). Both only look back, so points already drawn keep their value as
    points are added, and a live curve can be extended by its new points alone.

    Examples
    --------
    >>> smooth(np.array([0.0, 3.0, 6.0]), "window", 2).tolist()
    [0.0, 1.5, 4.5]
    >>> smooth(np.array([0.0, 3.0]), "EMA", 2).tolist()  # weight 2/3 on the newest
    [0.0, 2.0]
    """
    if kind not in SMOOTHING:
        raise ConfigError(f"smoothing kind {kind!r} is not known; expected one of {SMOOTHING}")
    if amount < 0:
        raise ConfigError(f"smoothing amount {amount!r} is negative; expected 0 (raw) or a number of points")
    y = np.asarray(y, dtype=np.float64)
    if amount <= 1 or y.size == 0:
        return y
    s = pd.Series(y)
    if kind == "EMA":
        return s.ewm(span=amount, adjust=False).mean().to_numpy()
    return s.rolling(amount, min_periods=1).mean().to_numpy()


def curve(
    ds: xr.Dataset, name: str, x_axis: str = "step", kind: str = "EMA", amount: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """The points ``(x, y)`` of series ``name`` (rows where it was written), smoothed.

    ``x_axis`` is ``"step"`` or ``"wall time (s)"`` (seconds since the store's first row).
    """
    if x_axis not in X_AXES:
        raise ConfigError(f"x axis {x_axis!r} is not known; expected one of {X_AXES}")
    y = np.asarray(ds[name].values, dtype=np.float64)
    if y.ndim != 1:
        raise InvalidArgumentError(f"series {name!r} has dimensions {ds[name].dims}; a curve needs one value per step")
    if x_axis == "step":
        x = np.asarray(ds["step"].values, dtype=np.float64)
    else:
        wall = np.asarray(ds["wall_time"].values, dtype=np.float64)
        x = wall - (np.nanmin(wall) if wall.size and np.isfinite(wall).any() else 0.0)
    keep = np.isfinite(y) & np.isfinite(x)
    return x[keep], smooth(y[keep], kind, amount)


def last_values(ds: xr.Dataset | None, series: Sequence[str]) -> dict[str, float]:
    """The last written (finite) value of each of ``series`` present in ``ds``."""
    out: dict[str, float] = {}
    if ds is None:
        return out
    for name in series:
        if name in ds:
            y = np.asarray(ds[name].values, dtype=np.float64)
            if y.ndim == 1:
                finite = y[np.isfinite(y)]
                if finite.size:
                    out[name] = float(finite[-1])
    return out


# ---------------------------------------------------------------------------- runs and their final figures


def _read_json(path: pathlib.Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


@dataclass(frozen=True)
class RunInfo:
    """What names a run in a comparison.

    Attributes
    ----------
    path
        The run folder.
    paradigm, variant
        From ``result.json`` or ``request.json`` (empty when neither says).
    seed
        From ``result.json``, else ``request.json``'s settings (``None`` when neither says).
    result
        ``result.json`` when the run has finished, else ``None``.
    """

    path: pathlib.Path
    paradigm: str = ""
    variant: str = ""
    seed: int | None = None
    result: dict[str, Any] | None = None

    @property
    def label(self) -> str:
        """``VARIANT seed N``, or the folder's name when the run does not say its variant and seed."""
        if self.variant and self.seed is not None:
            return f"{self.variant} seed {self.seed}"
        if self.variant:
            return f"{self.variant} ({self.path.name})"
        return self.path.name

    @property
    def group(self) -> tuple[str, str]:
        """The runs averaged together: same paradigm and variant (the folder's name when unknown)."""
        return (self.paradigm, self.variant or self.path.name)


def run_info(path: str | pathlib.Path) -> RunInfo:
    """Paradigm, variant and seed of the run in ``path`` from ``result.json`` or ``request.json``."""
    path = pathlib.Path(path)
    run = RunFolder(path)
    result = _read_json(run.result)
    request = _read_json(run.request)
    src = result or request or {}
    settings = src.get("settings") if isinstance(src.get("settings"), dict) else {}
    seed = src.get("seed", settings.get("seed") if settings else None)
    try:
        seed = int(seed) if seed is not None else None
    except (TypeError, ValueError):
        seed = None
    return RunInfo(path=path, paradigm=str(src.get("paradigm") or ""), variant=str(src.get("variant") or ""), seed=seed,
                   result=result)


#: Figures of ``result.json`` that describe the run rather than measure it: left out of the table.
_NOT_MEASURED = {"seed", "k", "steps", "n_test", "n_val", "n_train"}


def final_figures(info: RunInfo, metrics: xr.Dataset | None = None) -> dict[str, float]:
    """The run's final numeric figures: ``result.json``'s ``figures``, or while it runs the last value
    of each trainer's evaluation metric and loss (named as the result names them: ``test_acc`` for
    the trainer called ``trainer``, ``LOOP.metric`` for the others).
    """
    if info.result is not None and isinstance(info.result.get("figures"), Mapping):
        out = {}
        for k, v in info.result["figures"].items():
            if k in _NOT_MEASURED or isinstance(v, bool) or not isinstance(v, int | float):
                continue
            if math.isfinite(float(v)):
                out[str(k)] = float(v)
        return out
    if metrics is None:
        return {}
    loops = discover([str(v) for v in metrics.data_vars], None)
    out = {}
    for loop, series in loops.trainers.items():
        last = last_values(metrics, list(series.values()))
        for metric, name in series.items():
            if name in last:
                out[metric if loop == "trainer" else f"{loop}.{metric}"] = last[name]
    return out


def _headline_first(columns: Iterable[str]) -> list[str]:
    def rank(c: str) -> tuple[int, str]:
        base = c.rsplit(".", 1)[-1]
        order = ("test_acc", "best_val_acc", "val_acc", "test_accuracy", "top1", "loss")
        return (order.index(base) if base in order else len(order), c)

    return sorted(columns, key=rank)


def summary_table(runs: Sequence[tuple[RunInfo, Mapping[str, float]]]) -> pd.DataFrame:
    """Mean ± std over the runs of each variant: one row per (paradigm, variant), with ``n`` and ``running``.

    Parameters
    ----------
    runs
        Each run's :class:`RunInfo` and its :func:`final_figures`.

    Returns
    -------
    pandas.DataFrame
        Columns ``paradigm``, ``variant``, ``n`` (runs), ``running`` (runs without ``result.json``),
        then for every figure ``FIGURE`` (text ``"mean ± std"``, std over runs with ``ddof=1``;
        ``"mean"`` alone for one run). ``attrs["mean"]``, ``attrs["std"]`` and ``attrs["n"]`` hold the
        numbers as frames indexed by ``(paradigm, variant)``; a figure a run lacks is left out of its
        mean.
    """
    groups: dict[tuple[str, str], list[tuple[RunInfo, Mapping[str, float]]]] = {}
    for info, figs in runs:
        groups.setdefault(info.group, []).append((info, figs))
    columns = _headline_first({k for _, figs in runs for k in figs})
    index = pd.MultiIndex.from_tuples(list(groups), names=["paradigm", "variant"])
    mean = pd.DataFrame(np.nan, index=index, columns=columns)
    std = mean.copy()
    count = pd.DataFrame(0, index=index, columns=columns)
    rows = []
    for g, members in groups.items():
        row: dict[str, object] = {"paradigm": g[0], "variant": g[1], "n": len(members),
                                  "running": sum(info.result is None for info, _ in members)}
        for c in columns:
            vals = np.array([figs[c] for _, figs in members if c in figs], dtype=np.float64)
            count.loc[g, c] = vals.size
            if vals.size == 0:
                row[c] = ""
                continue
            m = float(vals.mean())
            s = float(vals.std(ddof=1)) if vals.size > 1 else float("nan")
            mean.loc[g, c], std.loc[g, c] = m, s
            row[c] = f"{m:.4g} ± {s:.2g}" if vals.size > 1 else f"{m:.4g}"
        rows.append(row)
    table = pd.DataFrame(rows, columns=["paradigm", "variant", "n", "running", *columns])
    table.attrs.update(mean=mean, std=std, n=count)
    return table
