"""Run a curriculum in one process, deterministically: the benchmark's and the unit tests' driver.

The trainer and the maker are the same classes the Workbench runs as Dask futures, driven here in
lock step: every ``publish_every`` trainer steps the maker scores the new version before training
goes on. The bank is a single in-process :class:`~carls_dask.bank.core.ShardCore` owning every
bucket (:class:`LocalBank`), so a run depends only on its settings and seed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from carls_dask.bank.core import LookupResult, ShardCore
from carls_dask.paradigms.curriculum.loops import CurriculumTrainer, DifficultyMaker, difficulty_table
from carls_dask.paradigms.curriculum.settings import CurriculumSettings
from carls_dask.runtime.channel import LocalModelChannel
from carls_dask.runtime.context import LoopContext, ThreadStop, pick_device

__all__ = ["InlineResult", "LocalBank", "run_inline"]

logger = logging.getLogger(__name__)


class LocalBank:
    """A one-shard bank in this process with the :class:`~carls_dask.bank.KnowledgeBank` calls the curriculum uses."""

    def __init__(self, tables: list[Any], buckets: int = 64) -> None:
        from carls_dask import config

        specs = [t if t.is_resolved else t.resolve(
            optimizer=config.get("bank.optimizer"), learning_rate=float(config.get("bank.learning-rate")),
            initializer=config.get("bank.initializer"), init_scale=float(config.get("bank.init-scale")))
            for t in tables]
        self.core = ShardCore(specs, shard=0, n_shards=1, buckets=buckets)
        self.buckets = buckets
        self.specs = {t.name: t for t in specs}

    def lookup(self, table: str, keys: Any, columns: list[str] | None = None, insert: bool = False,
               max_staleness: float | None = None) -> LookupResult:
        return self.core.lookup(table, keys, columns, insert, max_staleness)

    def update(self, table: str, keys: Any, values: Mapping[str, Any], *, model_step: int = 0,
               maker: str = "") -> int:
        return len(self.core.update(table, keys, values, model_step=model_step, maker=maker))

    def size(self, table: str | None = None) -> int:
        return self.core.size(table)

    def snapshot(self, root: str, step: int) -> int:
        """Write and commit a snapshot of the bank under ``root``; returns its version."""
        from carls_dask.storage.snapshots import begin_snapshot, commit_snapshot, write_shard

        handle = begin_snapshot(root, int(step))
        write_shard(handle, self.core.export_state(), delta_seq=0)  # an inline bank keeps no delta log
        entry = commit_snapshot(handle, {"name": "inline", "n_shards": 1, "buckets": self.buckets,
                                         "tables": {t: s.to_json() for t, s in self.specs.items()}, "optimizer": {}})
        return int(entry["version"])


@dataclasses.dataclass
class InlineResult:
    """What :func:`run_inline` returns.

    Attributes
    ----------
    trainer
        The trainer's ``finish()`` value (``test_accuracy``, ...).
    maker
        The last maker round's numbers (flag precision and recall, ...), empty without a maker.
    rounds
        Maker rounds made.
    seconds
        Wall time of the run.
    """

    trainer: dict[str, Any]
    maker: dict[str, float]
    rounds: int
    seconds: float


def run_inline(settings: CurriculumSettings, *, with_maker: bool | None = None, snapshot_dir: str | None = None,
               on_step: Callable[[int, Mapping[str, float]], None] | None = None) -> InlineResult:
    """Train one curriculum run in this process.

    Parameters
    ----------
    settings
        The run.
    with_maker
        Whether makers score the data; default: unless the run is the uniform baseline without cleaning.
    snapshot_dir
        Bank store folder to snapshot into after every maker round.
    on_step
        Called with each step and the trainer's numbers (progress display).
    """
    t0 = time.monotonic()
    if with_maker is None:
        with_maker = settings.pacing != "uniform" or settings.clean != "none"
    bank = LocalBank([difficulty_table()]) if with_maker else None
    stop = ThreadStop()
    channel = LocalModelChannel("trainer")
    device = pick_device()

    def ctx(name: str, kind: str) -> LoopContext:
        return LoopContext(name=name, kind=kind, device=device, channel=channel, stop=stop, bank=bank)

    trainer = CurriculumTrainer(settings)
    maker = DifficultyMaker(settings, snapshot_dir=snapshot_dir) if with_maker else None
    trainer.ctx = ctx(trainer.name, "trainer")
    trainer.setup(trainer.ctx)
    made: dict[str, float] = {}
    version = 0
    try:
        if maker is not None:
            maker.ctx = ctx(maker.name, "maker")
            maker.setup(maker.ctx)
        for step in range(settings.steps):
            metrics = trainer.step(step)
            if on_step is not None:
                on_step(step, metrics)
            done = step + 1
            if maker is not None and (done % settings.publish_every == 0 or done == settings.steps):
                record = channel.publish(trainer.publish_state(), step=done, producer=trainer.name)
                got = channel.fetch(newer_than=version)
                assert got is not None
                version = record.version
                maker.load_model(got[1], got[0])
                made = {k: float(v) for k, v in maker.make(got[0]).items()}
        value = trainer.finish()
    finally:
        trainer.teardown()
        if maker is not None:
            maker.teardown()
    return InlineResult(dict(value), made, version, time.monotonic() - t0)
