"""Run a :class:`~carls_dask.runtime.paradigm.Paradigm`: on a Workbench, or in this process in lock step.

Both drivers write the same run folder (its names: :mod:`carls_dask.storage.runfolder`)::

    RUN/request.json        what was asked: paradigm (its name and import path), variant, settings, driver,
                            the run's id, its primary trainer (read by --resume)
    RUN/bank/               bank snapshots every carls.run.snapshot-every steps and at the end, and the delta log
    RUN/checkpoints/NAME/   each trainer's saved state at the same steps
    RUN/metrics.zarr        every loop's figures every carls.run.metrics-every steps and at every evaluation
    RUN/run.json            what ran (loops, their states, the resolved configuration)
    RUN/result.json         settings, variant, seed, figures, versions and wall time of every segment (schema below)

Every run is durable, each table as its durability policy says (:mod:`carls_dask.runtime.durability`):
a table written by makers logs each acknowledged write under ``RUN/bank`` before the call returns, a
table trained by gradients is kept by the run's checkpoints. A shard whose worker dies is re-homed from
the store; when it held tables kept by snapshots, those and the trainer go back to the newest checkpoint
together (one consistent cut) and the run goes on. A trainer whose worker dies is run again from its
newest saved state; :func:`resume_run` continues a run folder whose process died from its newest
checkpoint, and extends a finished run to more steps. A run whose bank writes would take the disk below
``carls.storage.disk-reserve`` stops cleanly with :class:`~carls_dask.errors.RunStopped`, its last
checkpoint kept. A run never loses a
result: a resume that would (a finished run without more steps, ``steps`` at or below the
checkpoint, a folder that mixes two runs) is refused before anything is written, and an extended
run's ``result.json`` keeps every segment. The run's identity is the ``run_id`` in
``request.json``, not the folder's name, so a moved or copied run folder resumes.

``result.json`` (strict JSON: a figure that is not a finite number is ``null``, and ``reasons`` says why)::

    {"schema": "carls-dask/result/2", "paradigm": str, "variant": str, "seed": int, "run_id": str,
     "driver": "workbench" | "inline", "settings": {...},
     "figures": {name: number | null, ...}, "reasons": {name of a null figure: why, ...},
     "loops": {name: {"kind", "steps", "step", "seconds", "reason", "restarts", "metrics"}},
     "segments": [{"driver", "from_step", "to_step", "started", "ended", "wall_seconds", "figures",
                   "loops": {name: {"kind", "steps", "seconds", "reason", "restarts"}}}, ...],
     "snapshots": [{"version", "step"}, ...], "resumed_from": int | null,
     "versions": {"carls-dask", "torch", "dask", "distributed", "numpy", "xarray", "zarr", "python"},
     "started": unix seconds, "ended": unix seconds, "wall_seconds": float}

A run that was extended (``carls-dask run --resume RUN --steps N``) has one segment per part: the
top-level ``loops[*].steps`` (trainer steps, maker rounds), ``seconds``, ``restarts`` and
``wall_seconds`` add up over the segments; ``started`` is the first segment's start; ``figures``
are the newest segment's, with a figure it did not measure kept from an earlier segment and the
paradigm's :attr:`~carls_dask.runtime.paradigm.Paradigm.cumulative` figures (rounds, lookups)
added up.
"""

from __future__ import annotations

import dataclasses
import fcntl
import fnmatch
import json
import logging
import math
import os
import pathlib
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from carls_dask import config
from carls_dask.console import command_name
from carls_dask.errors import (
    CarlsError,
    ConfigError,
    CorruptStoreError,
    DiskReserveError,
    LoopFailedError,
    RunInterrupted,
    RunStopped,
    StoreError,
)
from carls_dask.runtime.channel import LocalModelChannel
from carls_dask.runtime.checkpoints import Checkpointer
from carls_dask.runtime.context import LoopContext, LoopResult, ThreadStop, pick_device
from carls_dask.runtime.durability import cause_of, drop_states_after, newest_cut, run_tables, snapshot_kept
from carls_dask.runtime.loops import MakerDriver, TrainerDriver
from carls_dask.runtime.maker import KnowledgeMaker
from carls_dask.runtime.paradigm import Paradigm
from carls_dask.runtime.progress import ProgressBook, ProgressSink
from carls_dask.runtime.results import (
    RESULT_SCHEMA,
    RunResult,
    has_snapshot,
    loop_records,
    snapshots_of,
    versions,
    write_json,
)
from carls_dask.runtime.settings import settings_from_json, settings_to_json, strict_json
from carls_dask.runtime.trainer import Trainer
from carls_dask.storage.runfolder import METRICS, REQUEST, RESULT, RunFolder

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = [
    "RESULT_SCHEMA", "RunInterrupted", "RunResult", "recorded_paradigm", "resume_run", "run_inline", "run_paradigm",
]

logger = logging.getLogger(__name__)

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


@dataclasses.dataclass(frozen=True)
class _Resume:
    """What :func:`resume_run` checked before anything was written: the run's identity, its checkpoint, its past."""

    run_id: str
    checkpoint: int
    previous: dict[str, Any] | None
    #: The snapshot of the cut, when the bank holds tables kept by snapshots alone (their rows and the
    #: trainer's state come back from the same step); None otherwise.
    bank_version: int | None = None


@dataclasses.dataclass
class _Plan:
    """What both drivers prepare: the paradigm, settings, loops, the run folder and its checkpointer."""

    paradigm: Paradigm
    variant: str
    settings: Any
    run_dir: pathlib.Path | None
    checkpointer: Checkpointer | None
    resume: _Resume | None
    started: float
    run_id: str
    trainers: list[Trainer]
    makers: list[KnowledgeMaker]
    tables: Sequence[Any] = ()

    @property
    def bank_root(self) -> str | None:
        return None if self.run_dir is None else str(RunFolder(self.run_dir).bank)

    @property
    def metrics(self) -> pathlib.Path | None:
        return None if self.run_dir is None else RunFolder(self.run_dir).metrics

    @property
    def first_step(self) -> int:
        """The step the primary trainer starts from (the checkpoint's, when resuming)."""
        return self.resume.checkpoint if self.resume is not None else 0


def _plan(paradigm: Paradigm | str, settings: Any, variant: str | None, run_dir: str | os.PathLike[str] | None,
          driver: str, *, resume: _Resume | None = None) -> _Plan:
    p = _paradigm(paradigm)
    folder = pathlib.Path(run_dir) if run_dir is not None else None
    if resume is None and folder is not None and folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ConfigError(f"run folder {folder}: already holds files; expected a new or empty folder "
                          "(continue a run with carls-dask run --resume RUN_DIR)")
    if settings is None:
        name = p.variant_name(variant)
        settings = p.settings(name)
    elif not isinstance(settings, p.settings_type):
        raise ConfigError(f"paradigm {p.name!r}: settings must be a {p.settings_type.__name__}, "
                          f"got {type(settings).__name__}")
    else:
        name = p.variant_name(variant) if variant is not None else p.variant_of(settings)
    settings = p.prepare(settings)
    tables = run_tables(p.tables(settings))  # asked once: a paradigm may read its data to answer
    trainers, makers = _split(p.loops(settings), p.name)
    run_id = resume.run_id if resume is not None else uuid.uuid4().hex
    checkpointer = None
    if folder is not None:
        run = RunFolder(folder)
        folder.mkdir(parents=True, exist_ok=True)
        from carls_dask.runtime.registry import paradigm_path

        request = {"paradigm": p.name, "paradigm_path": paradigm_path(p), "variant": name, "driver": driver,
                   "settings": settings_to_json(settings), "run_id": run_id, "primary": trainers[0].name}
        write_json(run.request, request)
        if resume is None:
            p.write_artifacts(settings, folder)
        checkpointer = Checkpointer(str(folder), int(config.get("run.snapshot-every")),
                                    int(config.get("storage.keep-snapshots")),
                                    str(run.bank) if tables else None)
    return _Plan(p, name, settings, folder, checkpointer, resume, time.time(), run_id, trainers, makers, tables)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _no_value(v: Any) -> bool:
    """Whether a figure has no value: ``None`` or a float that is not finite (``null`` in ``result.json``)."""
    return v is None or (isinstance(v, float) and not math.isfinite(v))


def _merge_figures(before: Mapping[str, Any], now: Mapping[str, Any], cumulative: Sequence[str]) -> dict[str, Any]:
    """The figures of a run extended by a segment: ``now``'s, ``before``'s where ``now`` has none, counts added."""
    out = dict(before)
    for key, value in now.items():
        if any(fnmatch.fnmatchcase(key, pattern) for pattern in cumulative) and _is_number(value) \
                and _is_number(before.get(key)):
            out[key] = before[key] + value
        elif _no_value(value):
            if _no_value(out.get(key)):
                out[key] = value
        else:
            out[key] = value
    return out


def _merge_loops(before: Mapping[str, Any], now: Mapping[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each loop over every segment: steps, seconds and restarts added up, the newest reason, step and metrics."""
    out = {name: dict(v) for name, v in before.items() if isinstance(v, dict)}
    for name, loop in now.items():
        old = out.get(name)
        if old is None:
            out[name] = dict(loop)
            continue
        merged = {**old, **loop}
        for key in ("steps", "seconds", "restarts"):
            if _is_number(old.get(key)) and _is_number(loop.get(key)):
                merged[key] = old[key] + loop[key]
        merged["metrics"] = {**(old.get("metrics") or {}), **{k: v for k, v in (loop.get("metrics") or {}).items()
                                                              if v is not None}}
        out[name] = merged
    return out


def _earlier_segments(previous: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """The segments a previous ``result.json`` holds (one built from the top level for a result without them)."""
    if not previous:
        return []
    if isinstance(previous.get("segments"), list):
        return [dict(s) for s in previous["segments"] if isinstance(s, dict)]
    found = previous.get("loops")
    loops: dict[str, Any] = found if isinstance(found, dict) else {}
    return [{"driver": previous.get("driver"), "from_step": previous.get("resumed_from"), "to_step": None,
             "started": previous.get("started"), "ended": previous.get("ended"),
             "wall_seconds": previous.get("wall_seconds"), "figures": previous.get("figures") or {},
             "loops": {n: {k: v for k, v in lp.items() if k != "metrics"} for n, lp in loops.items()
                       if isinstance(lp, dict)}}]


def _finish(plan: _Plan, driver: str, results: Mapping[str, LoopResult], restarts: Mapping[str, int]) -> RunResult:
    p = plan.paradigm
    figures = dict(p.summarize(plan.settings, results))
    snaps: list[dict[str, int]] = []
    if plan.checkpointer is not None and plan.checkpointer.bank_root is not None:
        snaps = snapshots_of(plan.bank_root)
    primary = results[plan.trainers[0].name]
    ended = time.time()
    loops = loop_records(results, restarts)
    segment = {"driver": driver, "from_step": primary.resumed_at, "to_step": primary.step, "started": plan.started,
               "ended": ended, "wall_seconds": ended - plan.started, "figures": strict_json(figures),
               "loops": {n: {k: v for k, v in lp.items() if k != "metrics"} for n, lp in loops.items()}}
    previous = plan.resume.previous if plan.resume is not None else None
    segments = [*_earlier_segments(previous), segment]
    started, wall = plan.started, ended - plan.started
    if previous:
        figures = _merge_figures(previous.get("figures") or {}, figures, p.cumulative)
        loops = _merge_loops(previous.get("loops") or {}, loops)
        started = float(previous.get("started") or plan.started)
        wall += sum(float(s.get("wall_seconds") or 0.0) for s in segments[:-1])
    missing = [k for k, v in figures.items() if _no_value(v)]
    reasons = {k: v for k, v in p.missing_reasons(plan.settings, results, missing).items() if k in missing}
    result = RunResult(
        paradigm=p.name, variant=plan.variant, seed=int(getattr(plan.settings, "seed", 0)), driver=driver,
        settings=settings_to_json(plan.settings), figures=figures, loops=loops, snapshots=snaps,
        resumed_from=primary.resumed_at, versions=versions(), started=started, ended=ended, wall_seconds=wall,
        run_id=plan.run_id, reasons=reasons, segments=segments,
        run_dir=str(plan.run_dir) if plan.run_dir is not None else None, results=dict(results),
    )
    if plan.run_dir is not None:
        write_json(RunFolder(plan.run_dir).result, result.to_json())
    logger.info("%s", result.headline(p.headline))
    return result


def _interrupted(plan: _Plan, step: int) -> RunInterrupted:
    """The :class:`RunInterrupted` of ``plan``'s run stopped at ``step``, naming the checkpoint it keeps."""
    checkpoint = None
    if plan.run_dir is not None:
        run = RunFolder(plan.run_dir)
        steps = run.state_steps(plan.trainers[0].name)
        checkpoint = steps[-1] if steps else None
        if _snapshot_kept_store(run.bank):  # what --resume continues from: the newest consistent cut
            version, cut = newest_cut(str(run.bank), steps)
            checkpoint = cut if version is not None and cut in steps else None
    return RunInterrupted(plan.run_dir, step, checkpoint, command_name())


def _has_initialise(p: Paradigm) -> bool:
    return type(p).initialise is not Paradigm.initialise


def run_paradigm(paradigm: Paradigm | str, settings: Any = None, *, variant: str | None = None,
                 run_dir: str | os.PathLike[str] | None = None, cluster: Any = None, progress: bool | None = None,
                 timeout: float | str | None = None, n_shards: int | None = None,
                 _resume: _Resume | None = None) -> RunResult:
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
    RunInterrupted
        On Ctrl-C, after the loops were stopped (a :class:`KeyboardInterrupt` naming the checkpoint kept).
    """
    from carls_dask.runtime.workbench import Workbench

    plan = _plan(paradigm, settings, variant, run_dir, "workbench", resume=_resume)
    p, s = plan.paradigm, plan.settings
    seconds = config.get_seconds("run.timeout", timeout)
    trainers, makers = plan.trainers, plan.makers
    tables = plan.tables
    wb = Workbench(cluster, run_dir=plan.run_dir, progress=progress, checkpointer=plan.checkpointer,
                   name=plan.run_dir.name if plan.run_dir is not None else p.name, run_id=plan.run_id)
    wb.book = ProgressBook(p.unprefixed, primary=trainers[0].name)
    try:
        with wb:
            wb.progress_from(plan.first_step)
            if tables:
                root = plan.bank_root
                if plan.resume is not None and root is not None and has_snapshot(root):
                    wb.restore_bank(root, n_shards=n_shards)
                    _roll_back_to_cut(wb.the_bank, plan)
                else:
                    wb.create_bank(tables, n_shards=n_shards, log_root=plan.bank_root)
                    if _has_initialise(p):
                        wb.client.submit(p.initialise, wb.bank, s, pure=False).result(timeout=seconds)
                    kept = snapshot_kept(tables)
                    if kept and plan.checkpointer is not None and root is not None and \
                            any(wb.the_bank.size(t) for t in kept):  # what initialise put there: a cut to go back to
                        plan.checkpointer.snapshot_bank(wb.the_bank, 0)
            for i, t in enumerate(trainers):
                wb.submit_trainer(t, primary=i == 0)
            for m in makers:
                wb.submit_maker(m)
            wb.wait(timeout=seconds)
            results = wb.stop()
            if wb.bank is not None and plan.checkpointer is not None and plan.checkpointer.bank_root is not None:
                plan.checkpointer.snapshot_bank(wb.bank, results[trainers[0].name].step)
            restarts = {n: h.restarts for n, h in wb.loops.items()}
    except KeyboardInterrupt as exc:
        if isinstance(exc, RunInterrupted):
            raise
        raise _interrupted(plan, max(plan.first_step, wb.book.primary_step())) from None
    except (LoopFailedError, DiskReserveError) as exc:
        full = cause_of(exc, DiskReserveError)  # a loop's failure carries it as its cause
        if full is None:
            raise
        raise _stopped(plan, max(plan.first_step, wb.book.primary_step()), full) from exc
    return _finish(plan, "workbench", results, restarts)


def _stopped(plan: _Plan, step: int, why: DiskReserveError) -> RunStopped:
    """The :class:`RunStopped` of a run whose bank refused a write at the disk reserve, naming its last checkpoint."""
    stop = _interrupted(plan, step)
    if stop.run_dir is None:
        return RunStopped(f"stopped at step {step}: {why}", None, step, None)
    where = (f"checkpoint at step {stop.checkpoint} kept in {stop.run_dir}; then continue with: "
             f"{command_name()} run --resume {stop.run_dir}") if stop.checkpoint is not None else (
        f"no checkpoint was kept in {stop.run_dir} (it stopped before the first): start it again")
    return RunStopped(f"run stopped cleanly at step {step}: {why}; {where}", stop.run_dir, step, stop.checkpoint)


def _roll_back_to_cut(bank: KnowledgeBank, plan: _Plan) -> None:
    """After restoring a resumed run's bank: bring the tables kept by snapshots back to the cut, when the cut is
    not the newest snapshot (the logged tables keep the newest state the store holds)."""
    from carls_dask.storage import list_snapshots

    version = plan.resume.bank_version if plan.resume is not None else None
    root = plan.bank_root
    if version is None or root is None or int(list_snapshots(root)[-1]["version"]) == version:
        return
    bank.rollback(root, version)


def run_inline(paradigm: Paradigm | str, settings: Any = None, *, variant: str | None = None,
               run_dir: str | os.PathLike[str] | None = None, progress: bool = False, n_shards: int = 1,
               on_step: Callable[[int, Any], None] | None = None, _resume: _Resume | None = None) -> RunResult:
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

    Raises
    ------
    RunInterrupted
        On Ctrl-C (a :class:`KeyboardInterrupt` naming the step reached and the checkpoint kept).
    """
    from carls_dask.bank import KnowledgeBank

    plan = _plan(paradigm, settings, variant, run_dir, "inline", resume=_resume)
    p, s = plan.paradigm, plan.settings
    trainers, makers = plan.trainers, plan.makers
    tables = plan.tables
    bank = None
    if tables:
        if plan.resume is not None and plan.bank_root is not None and has_snapshot(plan.bank_root):
            bank = KnowledgeBank.restore_local(plan.bank_root, n_shards=n_shards, log_root=plan.bank_root)
            _roll_back_to_cut(bank, plan)
        else:
            bank = KnowledgeBank.local(tables, n_shards=n_shards, log_root=plan.bank_root)
    book = ProgressBook(p.unprefixed, primary=trainers[0].name)
    sink = ProgressSink(book, total=trainers[0].max_steps, show=progress, metrics_path=plan.metrics,
                        run=plan.run_id, desc=plan.run_dir.name if plan.run_dir is not None else p.name,
                        initial=plan.first_step)
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
    full: DiskReserveError | None = None

    def rounds(source: str) -> None:
        for src, md in mdrivers:
            if src == source and md.rounds_left():
                got = channels[source].fetch(newer_than=md.last_version)
                if got is not None:
                    md.make_round(*got)

    try:
        if bank is not None and plan.resume is None and _has_initialise(p):
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
    except KeyboardInterrupt as exc:
        if isinstance(exc, RunInterrupted):
            raise
        interrupted = True
    except DiskReserveError as exc:
        full = exc
        interrupted = False
    else:
        interrupted = False
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
    if interrupted:
        raise _interrupted(plan, max(plan.first_step, tdrivers[0].step)) from None
    if full is not None:
        raise _stopped(plan, max(plan.first_step, tdrivers[0].step), full) from full
    return _finish(plan, "inline", results, {})


def _primary_of(run: RunFolder, request: Mapping[str, Any], previous: Mapping[str, Any] | None) -> str | None:
    """The name of the run's primary trainer: from ``request.json``, the result, or its only checkpoint folder."""
    if isinstance(request.get("primary"), str):
        return str(request["primary"])
    loops = previous.get("loops") if previous else None
    if isinstance(loops, dict):
        trainers = [n for n, lp in loops.items() if isinstance(lp, dict) and lp.get("kind") == "trainer"]
        if trainers:
            return str(trainers[0])
    folders = sorted(p.name for p in run.checkpoints.iterdir() if p.is_dir()) if run.checkpoints.is_dir() else []
    return folders[0] if len(folders) == 1 else None


def _writer_running(path: pathlib.Path) -> bool:
    """Whether a process holds the writer lock file ``path`` now (checked without writing to it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing the descriptor releases a lock taken here
    return False


def _check_resume(folder: pathlib.Path, steps: int | None) -> tuple[dict[str, Any], Any, Paradigm, _Resume]:
    """Every check of :func:`resume_run`, made before anything is written; returns request, settings, paradigm."""
    run = RunFolder(folder)
    where = f"resume {folder}"
    if not folder.is_dir():
        raise ConfigError(f"{where}: no such folder; expected a run folder written by carls-dask run")
    try:
        request = run.read_json(REQUEST)
        previous = run.read_json(RESULT)
    except StoreError as exc:
        raise ConfigError(f"{where}: {exc}; the folder was left as it is") from exc
    if request is None:
        raise ConfigError(f"{where}: no {REQUEST} there; expected a run folder written by carls-dask run")
    if not isinstance(request.get("paradigm"), str) or not isinstance(request.get("settings"), dict):
        raise ConfigError(f"{where}: {REQUEST} lacks the paradigm or its settings; expected the file "
                          "carls-dask run wrote")
    p = _recorded(request, where)
    saved = dict(request["settings"])
    primary = _primary_of(run, request, previous)
    if primary is None:
        raise ConfigError(f"{where}: cannot tell which trainer's checkpoint to continue from ({REQUEST} names no "
                          "primary trainer and the folder has no single checkpoints/ folder)")
    have = run.state_steps(primary)
    checkpoint = have[-1] if have else None
    bank_version = None
    if _snapshot_kept_store(run.bank):  # the trained tables and the trainer come back from one step
        bank_version, cut = newest_cut(str(run.bank), have)
        checkpoint = cut if bank_version is not None and cut in have else None
    if checkpoint is None:
        raise ConfigError(f"{where}: no checkpoint of trainer {primary!r} to continue from (the run stopped before "
                          f"its first one, every carls.run.snapshot-every steps); start it again into a new folder")
    if previous is not None:
        if steps is None:
            raise ConfigError(f"{where}: the run finished at step {checkpoint}; nothing to resume. Extend it with "
                              f"{command_name()} run --resume {folder} --steps N, N above {checkpoint}")
        if steps <= checkpoint:
            raise ConfigError(f"{where}: --steps {steps} is not above step {checkpoint}, where the run finished; "
                              f"expected N > {checkpoint} to extend it")
    elif steps is not None and steps <= checkpoint:
        raise ConfigError(f"{where}: --steps {steps} is at or below the checkpoint at step {checkpoint}; expected "
                          f"N > {checkpoint}, or no --steps to continue to step {saved.get('steps')}")
    if steps is not None:
        saved["steps"] = int(steps)
    try:
        settings = settings_from_json(p.settings_type, saved, owner=where)
    except TypeError as exc:
        raise ConfigError(f"{where}: the settings in {REQUEST} do not fit paradigm {p.name!r} ({exc})") from exc
    from carls_dask.storage.metrics import INDEX, WRITER_LOCK

    index = run.metrics / INDEX
    run_id = request.get("run_id")
    stored = None
    if index.exists():
        try:
            stored = json.loads(index.read_text()).get("run")
        except (OSError, ValueError, AttributeError) as exc:
            raise CorruptStoreError(f"{where}: the metric store's {index.name} cannot be read ({exc}); "
                                    "the folder was left as it is") from exc
        if _writer_running(run.metrics / WRITER_LOCK):
            raise ConfigError(f"{where}: another process is writing this run now ({METRICS} is locked); "
                              "wait for it to end or stop it first")
    if isinstance(run_id, str) and stored not in (None, run_id):
        raise ConfigError(f"{where}: {REQUEST} names run {run_id!r} but {METRICS} belongs to run {stored!r}; "
                          "the folder mixes two runs, so it is left as it is")
    identity = str(run_id) if isinstance(run_id, str) else str(stored or folder.name)
    return request, settings, p, _Resume(identity, checkpoint, previous, bank_version)


def _snapshot_kept_store(root: pathlib.Path) -> bool:
    """Whether the bank store's newest snapshot holds tables kept by snapshots alone."""
    from carls_dask.storage.manifest import read_manifest

    try:
        man = read_manifest(root)
    except CarlsError:
        return False
    return bool(snapshot_kept(man.get("meta", {}).get("tables", {}).values()))


def _recorded(request: Mapping[str, Any], where: str) -> Paradigm:
    """The paradigm a ``request.json`` names: the class at its import path, else the one registered by its name."""
    from carls_dask.runtime.registry import get_paradigm, is_import_path, load_paradigm

    path = request.get("paradigm_path")
    name = str(request.get("paradigm"))
    if isinstance(path, str) and is_import_path(path):
        try:
            return load_paradigm(path)
        except ConfigError as exc:
            try:
                found = get_paradigm(name)
            except ConfigError:
                raise ConfigError(f"{where}: {exc}, and no paradigm is registered as {name!r}") from exc
            logger.warning("%s: %s; running the paradigm registered as %r instead", where, exc, name)
            return found
    try:
        return get_paradigm(name)
    except ConfigError as exc:
        raise ConfigError(f"{where}: {exc} ({REQUEST} records no import path of the paradigm: register it, or "
                          "start the run again with carls-dask run package.module:Class)") from exc


def recorded_paradigm(run_dir: str | os.PathLike[str]) -> Paradigm:
    """The paradigm the run in ``run_dir`` ran, as ``--resume`` finds it from its ``request.json``.

    Raises
    ------
    ConfigError
        If the folder holds no ``request.json`` naming a paradigm that can be found.
    """
    folder = pathlib.Path(run_dir)
    where = f"run {folder}"
    try:
        request = RunFolder(folder).read_json(REQUEST)
    except StoreError as exc:
        raise ConfigError(f"{where}: {exc}") from exc
    if request is None or not isinstance(request.get("paradigm"), str):
        raise ConfigError(f"{where}: no {REQUEST} naming a paradigm; expected a run folder written by carls-dask run")
    return _recorded(request, where)


def resume_run(run_dir: str | os.PathLike[str], *, steps: int | None = None, inline: bool | None = None,
               cluster: Any = None, progress: bool | None = None, timeout: float | str | None = None) -> RunResult:
    """Continue the run in ``run_dir`` from its newest checkpoint (bank snapshot plus delta log, trainer states).

    The paradigm, variant and settings come from ``RUN/request.json``; ``steps`` raises the primary
    trainer's step budget. A run that died continues to its requested steps (or ``steps``); a
    finished run is extended only with ``steps`` above the step it finished at, and its
    ``result.json`` then keeps both segments (see the module's description). ``inline`` picks the
    driver (default: the one the run used). A moved or copied run folder resumes: the run's identity
    is the ``run_id`` in ``request.json``.

    Raises
    ------
    ConfigError
        Before anything is written: when ``run_dir`` holds no ``request.json`` or no checkpoint, the run
        finished and ``steps`` is not above its last step, ``steps`` is at or below the checkpoint, the
        folder mixes two runs, or another process is writing it.
    """
    folder = pathlib.Path(run_dir)
    if steps is not None and int(steps) < 1:
        raise ConfigError(f"resume {folder}: steps={steps!r}; expected a positive number of steps")
    request, settings, p, resume = _check_resume(folder, None if steps is None else int(steps))
    if resume.bank_version is not None:  # states past the cut belong to steps the resumed run redoes
        primary = _primary_of(RunFolder(folder), request, resume.previous)
        if primary is not None:
            drop_states_after(Checkpointer(str(folder), 0, 1), primary, resume.checkpoint)
    use_inline = request.get("driver") == "inline" if inline is None else bool(inline)
    logger.info("resuming %s %s in %s from step %d", p.name, request.get("variant"), folder, resume.checkpoint)
    if use_inline:
        return run_inline(p, settings, variant=request.get("variant"), run_dir=folder, progress=bool(progress),
                          _resume=resume)
    return run_paradigm(p, settings, variant=request.get("variant"), run_dir=folder, cluster=cluster,
                        progress=progress, timeout=timeout, _resume=resume)
