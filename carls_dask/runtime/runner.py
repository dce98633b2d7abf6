"""Run a :class:`~carls_dask.runtime.paradigm.Paradigm`: on a Workbench, or in this process in lock step.

Both drivers write the same run folder::

    RUN/request.json        what was asked: paradigm, variant, settings, driver (read by --resume)
    RUN/bank/               bank snapshots every carls.run.snapshot-every steps and at the end, and the delta log
    RUN/checkpoints/NAME/   each trainer's saved state at the same steps
    RUN/metrics.zarr        every loop's figures every carls.run.metrics-every steps and at every evaluation
    RUN/run.json            what ran (loops, their states, the resolved configuration)
    RUN/result.json         settings, variant, seed, figures, versions and wall time (schema below)

Every run is durable: the bank logs each acknowledged write under ``RUN/bank`` before the call
returns, so a shard whose worker dies is re-homed from the store; a trainer whose worker dies is
run again from its newest saved state; :func:`resume_run` continues a run folder whose process
died from its newest checkpoint.

``result.json`` (strict JSON: a figure that is not a finite number is ``null``)::

    {"schema": "carls-dask/result/1", "paradigm": str, "variant": str, "seed": int,
     "driver": "workbench" | "inline", "settings": {...}, "figures": {name: number | null, ...},
     "loops": {name: {"kind", "steps", "seconds", "reason", "restarts", "metrics"}},
     "snapshots": [{"version", "step"}, ...], "resumed_from": int | null,
     "versions": {"carls-dask", "torch", "dask", "distributed", "numpy", "xarray", "zarr", "python"},
     "started": unix seconds, "ended": unix seconds, "wall_seconds": float}
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import pathlib
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from carls_dask import config
from carls_dask.errors import ConfigError
from carls_dask.runtime.channel import LocalModelChannel
from carls_dask.runtime.checkpoints import Checkpointer
from carls_dask.runtime.context import LoopContext, LoopResult, ThreadStop, pick_device
from carls_dask.runtime.loops import MakerDriver, TrainerDriver
from carls_dask.runtime.maker import KnowledgeMaker
from carls_dask.runtime.paradigm import Paradigm
from carls_dask.runtime.progress import ProgressBook, ProgressSink
from carls_dask.runtime.settings import settings_from_json, settings_to_json, strict_json
from carls_dask.runtime.trainer import Trainer

__all__ = ["RESULT_SCHEMA", "RunResult", "resume_run", "run_inline", "run_paradigm"]

logger = logging.getLogger(__name__)

RESULT_SCHEMA = "carls-dask/result/1"
REQUEST_FILE = "request.json"
RESULT_FILE = "result.json"


@dataclasses.dataclass
class RunResult:
    """What a run measured; :meth:`to_json` is the content of ``RUN/result.json``.

    Attributes
    ----------
    paradigm, variant, seed
        What ran.
    driver
        ``"workbench"`` or ``"inline"``.
    settings
        The settings, as JSON.
    figures
        The paradigm's figures (:meth:`Paradigm.summarize`).
    loops
        Per loop: kind, steps (or rounds), seconds, why it ended, restarts and its last metrics.
    snapshots
        The bank snapshots the run folder keeps (version and step).
    resumed_from
        The step the primary trainer continued from, or ``None``.
    versions
        Versions of carls-dask and its main dependencies.
    started, ended, wall_seconds
        Unix times and the run's wall time.
    run_dir
        The run folder, or ``None``.
    results
        Every loop's :class:`~carls_dask.runtime.context.LoopResult` (not written to JSON).
    """

    paradigm: str
    variant: str
    seed: int
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
        """One line: the paradigm, variant and seed, then the named figures (all numeric ones when none are named)."""
        keys = [n for n in names if n in self.figures] or [k for k, v in self.figures.items()
                                                           if isinstance(v, int | float) and not isinstance(v, bool)]
        parts = []
        for k in keys:
            v = self.figures[k]
            parts.append(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}")
        return f"{self.paradigm} {self.variant} (seed {self.seed}): " + (", ".join(parts) or "no figures")


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


def _paradigm(paradigm: Paradigm | str) -> Paradigm:
    if isinstance(paradigm, Paradigm):
        return paradigm
    from carls_dask.runtime.registry import get_paradigm

    return get_paradigm(str(paradigm))


def _split(loops: Sequence[Trainer | KnowledgeMaker], owner: str) -> tuple[list[Trainer], list[KnowledgeMaker]]:
    trainers = [lp for lp in loops if isinstance(lp, Trainer)]
    makers = [lp for lp in loops if isinstance(lp, KnowledgeMaker)]
    other = [type(lp).__name__ for lp in loops if not isinstance(lp, Trainer | KnowledgeMaker)]
    if other or not trainers:
        raise ConfigError(f"paradigm {owner!r}: loops() must return at least one Trainer, then KnowledgeMakers; "
                          f"got {[type(lp).__name__ for lp in loops]}")
    names = [lp.name for lp in loops]
    if len(set(names)) != len(names):
        raise ConfigError(f"paradigm {owner!r}: loop names must be unique, got {names}")
    return trainers, makers


@dataclasses.dataclass
class _Plan:
    """What both drivers prepare: the paradigm, settings, the run folder and its checkpointer."""

    paradigm: Paradigm
    variant: str
    settings: Any
    run_dir: pathlib.Path | None
    checkpointer: Checkpointer | None
    resume: bool
    started: float
    tables: Sequence[Any] = ()

    @property
    def bank_root(self) -> str | None:
        return None if self.run_dir is None else str(self.run_dir / "bank")


def _plan(paradigm: Paradigm | str, settings: Any, variant: str | None, run_dir: str | os.PathLike[str] | None,
          driver: str, *, resume: bool = False) -> _Plan:
    p = _paradigm(paradigm)
    if settings is None:
        name = p.variant_name(variant)
        settings = p.settings(name)
    elif not isinstance(settings, p.settings_type):
        raise ConfigError(f"paradigm {p.name!r}: settings must be a {p.settings_type.__name__}, "
                          f"got {type(settings).__name__}")
    else:
        name = p.variant_name(variant) if variant is not None else p.variant_of(settings)
    settings = p.prepare(settings)
    tables = list(p.tables(settings))  # asked once: a paradigm may read its data to answer
    folder = pathlib.Path(run_dir) if run_dir is not None else None
    checkpointer = None
    if folder is not None:
        if not resume and folder.exists() and any(folder.iterdir()):
            raise ConfigError(f"run folder {folder}: already holds files; expected a new or empty folder "
                              "(continue a run with carls-dask run --resume RUN_DIR)")
        folder.mkdir(parents=True, exist_ok=True)
        request = {"paradigm": p.name, "variant": name, "driver": driver, "settings": settings_to_json(settings)}
        (folder / REQUEST_FILE).write_text(json.dumps(request, indent=2))
        if not resume:
            p.write_artifacts(settings, folder)
        checkpointer = Checkpointer(str(folder), int(config.get("run.snapshot-every")),
                                    int(config.get("storage.keep-snapshots")),
                                    str(folder / "bank") if tables else None)
    return _Plan(p, name, settings, folder, checkpointer, resume, time.time(), tables)


def _finish(plan: _Plan, driver: str, results: Mapping[str, LoopResult], restarts: Mapping[str, int]) -> RunResult:
    p = plan.paradigm
    figures = p.summarize(plan.settings, results)
    snaps: list[dict[str, int]] = []
    if plan.bank_root is not None and plan.checkpointer is not None and plan.checkpointer.bank_root is not None:
        from carls_dask.storage import list_snapshots

        snaps = [{"version": int(s["version"]), "step": int(s["step"])} for s in list_snapshots(plan.bank_root)]
    primary = next(r for r in results.values() if r.kind == "trainer")
    ended = time.time()
    result = RunResult(
        paradigm=p.name, variant=plan.variant, seed=int(getattr(plan.settings, "seed", 0)), driver=driver,
        settings=settings_to_json(plan.settings), figures=dict(figures),
        loops={n: {"kind": r.kind, "steps": r.steps, "seconds": r.elapsed, "reason": r.reason,
                   "restarts": int(restarts.get(n, 0)), "metrics": dict(r.metrics)} for n, r in results.items()},
        snapshots=snaps, resumed_from=primary.resumed_at, versions=versions(), started=plan.started, ended=ended,
        wall_seconds=ended - plan.started, run_dir=str(plan.run_dir) if plan.run_dir is not None else None,
        results=dict(results),
    )
    if plan.run_dir is not None:
        text = json.dumps(result.to_json(), indent=2, allow_nan=False)
        tmp = plan.run_dir / f".{RESULT_FILE}.tmp"
        tmp.write_text(text)
        os.replace(tmp, plan.run_dir / RESULT_FILE)
    logger.info("%s", result.headline(p.headline))
    return result


def _has_initialise(p: Paradigm) -> bool:
    return type(p).initialise is not Paradigm.initialise


def run_paradigm(paradigm: Paradigm | str, settings: Any = None, *, variant: str | None = None,
                 run_dir: str | os.PathLike[str] | None = None, cluster: Any = None, progress: bool | None = None,
                 timeout: float | str | None = None, n_shards: int | None = None, _resume: bool = False) -> RunResult:
    """Run ``paradigm`` on a :class:`~carls_dask.runtime.workbench.Workbench` and return its :class:`RunResult`.

    Parameters
    ----------
    paradigm
        A :class:`Paradigm` or the name of a registered one.
    settings
        Its settings object; ``None`` takes the variant's.
    variant
        The named variant (default: the paradigm's default variant).
    run_dir
        The run folder (new or empty). With one the run is durable (delta log, snapshots every
        ``carls.run.snapshot-every`` steps, trainer states) and writes ``result.json``; ``None``
        keeps nothing.
    cluster
        What :class:`Workbench` accepts: ``None`` (``carls.cluster``), an address, a cluster or a client.
    progress
        Show the progress bar (default ``carls.runtime.progress``).
    timeout
        Deadline of the run (default ``carls.run.timeout``).
    n_shards
        Bank shards (default ``carls.bank.shards``).

    Raises
    ------
    ConfigError
        For bad settings or a run folder that already holds files.
    DeadlineExceeded
        When the trainers did not finish within ``timeout``.
    LoopFailedError
        When a loop failed; its exception is the ``__cause__``.
    """
    from carls_dask.runtime.workbench import Workbench

    plan = _plan(paradigm, settings, variant, run_dir, "workbench", resume=_resume)
    p, s = plan.paradigm, plan.settings
    seconds = config.get_seconds("run.timeout", timeout)
    trainers, makers = _split(p.loops(s), p.name)
    tables = plan.tables
    wb = Workbench(cluster, run_dir=plan.run_dir, progress=progress, checkpointer=plan.checkpointer,
                   name=plan.run_dir.name if plan.run_dir is not None else p.name)
    wb.book = ProgressBook(p.unprefixed)
    with wb:
        if tables:
            root = plan.bank_root
            if plan.resume and root is not None and _has_snapshot(root):
                wb.restore_bank(root, n_shards=n_shards)
            else:
                wb.create_bank(tables, n_shards=n_shards, log_root=plan.bank_root)
                if _has_initialise(p):
                    wb.client.submit(p.initialise, wb.bank, s, pure=False).result(timeout=seconds)
        for i, t in enumerate(trainers):
            wb.submit_trainer(t, primary=i == 0)
        for m in makers:
            wb.submit_maker(m)
        wb.wait(timeout=seconds)
        results = wb.stop()
        if wb.bank is not None and plan.checkpointer is not None and plan.checkpointer.bank_root is not None:
            plan.checkpointer.snapshot_bank(wb.bank, results[trainers[0].name].step)
        restarts = {n: h.restarts for n, h in wb.loops.items()}
    return _finish(plan, "workbench", results, restarts)


def _has_snapshot(root: str) -> bool:
    from carls_dask.errors import CarlsError
    from carls_dask.storage import list_snapshots

    try:
        return bool(list_snapshots(root))
    except CarlsError:
        return False


def run_inline(paradigm: Paradigm | str, settings: Any = None, *, variant: str | None = None,
               run_dir: str | os.PathLike[str] | None = None, progress: bool = False, n_shards: int = 1,
               on_step: Callable[[int, Any], None] | None = None, _resume: bool = False) -> RunResult:
    """Run ``paradigm`` in this process, deterministically, and return its :class:`RunResult`.

    The same trainer and maker objects, drivers, bank client, run folder, checkpoints and metrics as
    :func:`run_paradigm`, in lock step: after every version a trainer publishes, each maker reading
    it makes its round before training goes on. The bank is
    :meth:`KnowledgeBank.local <carls_dask.bank.KnowledgeBank.local>` (in-process shards with the
    real validation, delta log and snapshots), so the same settings and seed give the same result
    every time.

    Parameters
    ----------
    paradigm, settings, variant, run_dir
        As in :func:`run_paradigm`.
    progress
        Show a progress bar.
    n_shards
        In-process bank shards.
    on_step
        Called after every step of the primary trainer (and the makers' rounds it caused) with the
        step and the bank (``None`` without one), e.g. to look at the bank as the run goes.
    """
    from carls_dask.bank import KnowledgeBank

    plan = _plan(paradigm, settings, variant, run_dir, "inline", resume=_resume)
    p, s = plan.paradigm, plan.settings
    trainers, makers = _split(p.loops(s), p.name)
    tables = plan.tables
    bank = None
    if tables:
        if plan.resume and plan.bank_root is not None and _has_snapshot(plan.bank_root):
            bank = KnowledgeBank.restore_local(plan.bank_root, n_shards=n_shards, log_root=plan.bank_root)
        else:
            bank = KnowledgeBank.local(tables, n_shards=n_shards, log_root=plan.bank_root)
    book = ProgressBook(p.unprefixed)
    metrics = plan.run_dir / "metrics.zarr" if plan.run_dir is not None else None
    sink = ProgressSink(book, total=trainers[0].max_steps, show=progress, metrics_path=metrics,
                        run=plan.run_dir.name if plan.run_dir is not None else p.name)
    stop = ThreadStop()
    device = pick_device()
    channels = {t.name: LocalModelChannel(t.name) for t in trainers}
    resolved = config.resolved()

    def ctx(obj: Trainer | KnowledgeMaker, channel: LocalModelChannel, primary: bool = False) -> LoopContext:
        def report(values: Mapping[str, float]) -> None:
            book.update({"loop": obj.name, "kind": obj.kind, "time": time.time(), **values})

        return LoopContext(name=obj.name, kind=obj.kind, device=device, channel=channel, stop=stop, bank=bank,
                           report=report, config=resolved, publish_every=int(config.get("runtime.publish-every")),
                           metrics_every=int(config.get("run.metrics-every")),
                           checkpoint=plan.checkpointer if isinstance(obj, Trainer) else None, primary=primary)

    tdrivers = [TrainerDriver(t, ctx(t, channels[t.name], i == 0)) for i, t in enumerate(trainers)]
    mdrivers = []
    for m in makers:
        source = m.source or trainers[0].name
        if source not in channels:
            raise ConfigError(f"maker {m.name!r}: source {source!r} is not a trainer of paradigm {p.name!r}; "
                              f"expected one of {sorted(channels)}")
        mdrivers.append((source, MakerDriver(m, ctx(m, channels[source]))))
    started: list[TrainerDriver | MakerDriver] = []
    results: dict[str, LoopResult] = {}

    def rounds(source: str) -> None:
        for src, md in mdrivers:
            if src == source and md.rounds_left():
                got = channels[source].fetch(newer_than=md.last_version)
                if got is not None:
                    md.make_round(*got)

    try:
        if bank is not None and not plan.resume and _has_initialise(p):
            p.initialise(bank, s)
        # makers first: a trainer's setup and saved state then fix torch's random state for its steps
        # alone, whether the run starts afresh or continues from a checkpoint
        drivers: list[TrainerDriver | MakerDriver] = [*(md for _, md in mdrivers), *tdrivers]
        for d in drivers:
            started.append(d)
            d.begin()
        running = list(tdrivers)
        while running:
            for td in list(running):
                if td.done():
                    running.remove(td)
                    continue
                if td.advance() is not None:
                    rounds(td.name)
                if td is tdrivers[0] and on_step is not None:
                    on_step(td.step, bank)
            sink.flush()
        for td in tdrivers:
            results[td.name] = td.end()
            rounds(td.name)
        for _, md in mdrivers:
            results[md.name] = md.end("stopped")
        if bank is not None and plan.checkpointer is not None and plan.checkpointer.bank_root is not None:
            plan.checkpointer.snapshot_bank(bank, tdrivers[0].step)
    finally:
        for d in started:
            obj = d.trainer if isinstance(d, TrainerDriver) else d.maker
            try:
                obj.teardown()
            except Exception:
                logger.warning("%s %s: teardown failed", obj.kind, obj.name, exc_info=True)
        sink.close()
        if bank is not None:
            bank.close()
    return _finish(plan, "inline", results, {})


def resume_run(run_dir: str | os.PathLike[str], *, steps: int | None = None, inline: bool | None = None,
               cluster: Any = None, progress: bool | None = None, timeout: float | str | None = None) -> RunResult:
    """Continue the run in ``run_dir`` from its newest checkpoint (bank snapshot plus delta log, trainer states).

    The paradigm, variant and settings come from ``RUN/request.json``; ``steps`` raises the primary
    trainer's step budget. ``inline`` picks the driver (default: the one the run used).

    Raises
    ------
    ConfigError
        When ``run_dir`` holds no ``request.json``.
    """
    folder = pathlib.Path(run_dir)
    path = folder / REQUEST_FILE
    if not path.is_file():
        raise ConfigError(f"resume {folder}: no {REQUEST_FILE} there; expected a run folder written by carls-dask run")
    request = json.loads(path.read_text())
    p = _paradigm(request["paradigm"])
    saved = dict(request["settings"])
    if steps is not None:
        saved["steps"] = int(steps)
    settings = settings_from_json(p.settings_type, saved, owner=f"resume {folder}")
    use_inline = request.get("driver") == "inline" if inline is None else bool(inline)
    logger.info("resuming %s %s in %s", p.name, request["variant"], folder)
    if use_inline:
        return run_inline(p, settings, variant=request["variant"], run_dir=folder, progress=bool(progress),
                          _resume=True)
    return run_paradigm(p, settings, variant=request["variant"], run_dir=folder, cluster=cluster, progress=progress,
                        timeout=timeout, _resume=True)
