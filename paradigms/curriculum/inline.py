"""Run a curriculum in one process, deterministically: the benchmark's and the unit tests' driver.

The trainer and the maker are the same classes the Workbench runs as Dask futures, driven here in
lock step: every ``publish_every`` trainer steps the maker scores the new version before training
goes on. The bank is the :class:`~carls_dask.bank.KnowledgeBank` client over one in-process shard
owning every bucket (:meth:`~carls_dask.bank.KnowledgeBank.local`), so a run depends only on its
settings and seed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

from carls_dask.bank import KnowledgeBank
from carls_dask.paradigms.curriculum.loops import CurriculumTrainer, DifficultyMaker, difficulty_table
from carls_dask.paradigms.curriculum.settings import CurriculumSettings
from carls_dask.runtime.channel import LocalModelChannel
from carls_dask.runtime.context import LoopContext, ThreadStop, pick_device

__all__ = ["InlineResult", "run_inline"]

logger = logging.getLogger(__name__)


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
    bank = KnowledgeBank.local([difficulty_table()], n_shards=1, buckets=64) if with_maker else None
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
        if bank is not None:
            bank.close()
    return InlineResult(dict(value), made, version, time.monotonic() - t0)
