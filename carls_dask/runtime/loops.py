"""The trainer and maker loops. Pure: no Dask here, the context supplies channel, stop, bank and report.

A loop is a driver object with ``begin``, one unit of work (:meth:`TrainerDriver.advance`, one
step; :meth:`MakerDriver.make_round`, one round on a given version) and ``end``.
:func:`run_trainer` and :func:`run_maker` run one driver until it is done, as a long-lived future
does on a worker; the in-process runner (:func:`carls_dask.runtime.runner.run_inline`) steps the
same drivers in lock step. Both therefore publish, report, evaluate and checkpoint identically.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

from carls_dask.bank.stepprofile import StepProfile
from carls_dask.runtime.channel import ModelVersion
from carls_dask.runtime.context import LoopContext, LoopResult, MakerRound
from carls_dask.runtime.maker import KnowledgeMaker
from carls_dask.runtime.trainer import Trainer
from carls_dask.storage.runfolder import STEPS_PER_S

__all__ = ["MakerDriver", "TrainerDriver", "run_loop", "run_maker", "run_trainer"]

logger = logging.getLogger(__name__)


def _numbers(metrics: Mapping[str, Any] | None, where: str) -> dict[str, float]:
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise TypeError(f"{where} must return a mapping of names to numbers or None, got {type(metrics).__name__}")
    out: dict[str, float] = {}
    for key, value in metrics.items():
        try:
            out[str(key)] = float(value)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{where} returned {key}={value!r}; expected a number") from exc
    return out


class TrainerDriver:
    """Runs one :class:`Trainer` step by step; see :class:`Trainer` for the hook order.

    After each step it publishes every ``publish_every`` steps (and then, for the primary trainer,
    sets the bank's step to the published step, so delta-log records carry the model step they
    follow), evaluates every ``eval_every`` steps, reports every ``ctx.metrics_every`` steps and
    after each evaluation, and every ``ctx.checkpoint.every`` steps saves the trainer's state
    (the primary trainer then snapshots the bank at the same step).
    """

    def __init__(self, trainer: Trainer, ctx: LoopContext) -> None:
        self.trainer = trainer
        self.ctx = ctx
        self.result = LoopResult(trainer.name, "trainer")
        self.publish_every = trainer.publish_every or ctx.publish_every
        self.step = 0
        self.first = 0
        self.metrics: dict[str, float] = {}
        self.last_published: int | None = None
        self.last_eval: int | None = None
        self.last_saved: int | None = None
        self._t0 = 0.0
        self._last_report = (0.0, 0)

    @property
    def name(self) -> str:
        """The trainer's name."""
        return self.trainer.name

    def begin(self) -> None:
        """Set up the trainer and load its newest checkpoint (or ``resume_from``) when there is one."""
        trainer, ctx = self.trainer, self.ctx
        trainer.ctx = ctx
        trainer.setup(ctx)
        state = ctx.checkpoint.newest(trainer.name) if ctx.checkpoint is not None else None
        if state is None:
            state = trainer.resume_from
        if state is not None:
            trainer.load_state(state)
            self.result.resumed_at = trainer.start_step
        self.step = self.first = trainer.start_step
        self.last_saved = self.step if state is not None else None
        self._t0 = time.monotonic()
        self._last_report = (self._t0, self.step)
        self._profile = StepProfile(ctx.bank) if ctx.bank is not None else None

    def done(self) -> bool:
        """Whether the loop should end now (``max_steps`` reached or a stop requested); sets the reason."""
        if self.trainer.max_steps is not None and self.step >= self.trainer.max_steps:
            self.result.reason = "max_steps"
            return True
        if self.ctx.stop.stop_requested():
            self.result.reason = "stopped"
            return True
        return False

    def publish(self) -> ModelVersion:
        """Publish the current model at the current step (and set the bank's step, for the primary trainer)."""
        trainer, ctx = self.trainer, self.ctx
        record = ctx.channel.publish(trainer.publish_state(), step=self.step, producer=trainer.name)
        if ctx.primary and ctx.bank is not None:
            ctx.bank.set_step(self.step)
        self.result.published.append(record)
        self.last_published = self.step
        return record

    def evaluate(self) -> None:
        """Run the trainer's evaluation and report its figures now."""
        self.metrics.update(_numbers(self.trainer.evaluate(), f"{type(self.trainer).__name__}.evaluate"))
        self.last_eval = self.step

    def report(self) -> None:
        """Send the step, the steps per second since the last report and the newest figures."""
        now = time.monotonic()
        t, s = self._last_report
        values = {"step": float(self.step), **self.metrics}
        if now > t and self.step > s:  # no new rate when no step was taken since the last report
            values[STEPS_PER_S] = (self.step - s) / (now - t)
            if self._profile is not None:  # what the steps cost the bank and this process
                values.update(self._profile.stop(self.step - s).as_metrics())
        self.ctx.report(values)
        self._last_report = (now, self.step)

    def checkpoint(self) -> None:
        """Save the trainer's state (the primary trainer then snapshots the bank at the same step)."""
        ctx = self.ctx
        if ctx.checkpoint is None:
            return
        bank = ctx.bank if ctx.primary else None
        ctx.checkpoint.save(self.trainer.name, self.step, self.trainer.state(), bank=bank)
        self.last_saved = self.step

    def advance(self) -> ModelVersion | None:
        """Run one step, then publish, evaluate, report and checkpoint as due; returns the version published."""
        trainer, ctx = self.trainer, self.ctx
        if ctx.bank is not None:  # rows the step's bank layers train record this trainer and step
            ctx.bank.set_writer(trainer.name, self.step)
        self.metrics.update(_numbers(trainer.step(self.step), f"{type(trainer).__name__}.step"))
        self.step += 1
        trainer.start_step = self.step
        published = self.publish() if self.step % self.publish_every == 0 else None
        every = trainer.eval_every
        evaluated = every is not None and (self.step % every == 0 or self.step == trainer.max_steps)
        if evaluated:
            self.evaluate()
        if evaluated or self.step % ctx.metrics_every == 0:
            self.report()
        final = trainer.max_steps is not None and self.step >= trainer.max_steps
        if ctx.checkpoint is not None and ctx.checkpoint.due(self.step) and not final:
            self.checkpoint()
        return published

    def end(self) -> LoopResult:
        """Publish the final model if it was not just published, report, save the final state; the result."""
        trainer, ctx, result = self.trainer, self.ctx, self.result
        if ctx.bank is not None:  # the last step's gradient pushes, held by the layers' queue, land now
            ctx.bank.flush()
        published = self.publish() if self.step != self.last_published and self.step > self.first else None
        if trainer.eval_every and self.last_eval != self.step and self.step > self.first:
            self.evaluate()
        self.result.final_published = published
        result.elapsed = time.monotonic() - self._t0
        result.steps = self.step - self.first
        result.step = self.step
        self.report()
        result.metrics = dict(self.metrics)
        if result.elapsed > 0 and result.steps:
            result.metrics[STEPS_PER_S] = result.steps / result.elapsed
        result.value = trainer.finish()
        if trainer.keep_state or ctx.checkpoint is not None:
            state = trainer.state()
            if trainer.keep_state:
                result.state = state
            if ctx.checkpoint is not None and self.last_saved != self.step:
                ctx.checkpoint.save(trainer.name, self.step, state)
        logger.info("trainer %s ended (%s) after %d steps", trainer.name, result.reason, result.steps)
        return result


class MakerDriver:
    """Runs one :class:`KnowledgeMaker` round by round; see :class:`KnowledgeMaker` for the hook order."""

    def __init__(self, maker: KnowledgeMaker, ctx: LoopContext) -> None:
        self.maker = maker
        self.ctx = ctx
        self.result = LoopResult(maker.name, "maker")
        self.metrics: dict[str, float] = {}
        self.last_version = 0
        self._t0 = 0.0

    @property
    def name(self) -> str:
        """The maker's name."""
        return self.maker.name

    def begin(self) -> None:
        """Set up the maker."""
        self.maker.ctx = self.ctx
        self.maker.setup(self.ctx)
        self._t0 = time.monotonic()

    def rounds_left(self) -> bool:
        """Whether the maker may make another round (``max_rounds`` not reached)."""
        return self.maker.max_rounds is None or len(self.result.rounds) < self.maker.max_rounds

    def make_round(self, version: ModelVersion, state: Mapping[str, Any]) -> None:
        """Load ``state`` (the model of ``version``), make the maker's knowledge and report it."""
        maker, result = self.maker, self.result
        started = time.monotonic()
        maker.load_model(state, version)
        self.metrics.update(_numbers(maker.make(version), f"{type(maker).__name__}.make"))
        staleness = max(0.0, time.time() - version.wall_time)
        result.rounds.append(MakerRound(version.version, version.step, staleness, time.monotonic() - started))
        self.last_version = version.version
        self.ctx.report({"round": float(len(result.rounds)), "version": float(version.version),
                         "model_step": float(version.step), "staleness_s": staleness, **self.metrics})

    def end(self, reason: str) -> LoopResult:
        """The maker's result."""
        result = self.result
        result.reason = reason
        result.elapsed = time.monotonic() - self._t0
        result.steps = len(result.rounds)
        result.metrics = dict(self.metrics)
        result.value = self.maker.finish()
        result.state = self.maker.state() or None
        logger.info("maker %s ended (%s) after %d rounds", self.maker.name, result.reason, result.steps)
        return result


def run_trainer(trainer: Trainer, ctx: LoopContext) -> LoopResult:
    """Run ``trainer`` until ``max_steps`` or a stop; see :class:`Trainer` for the hook order."""
    driver = TrainerDriver(trainer, ctx)
    try:
        driver.begin()
        while not driver.done():
            driver.advance()
        return driver.end()
    finally:
        trainer.teardown()


def run_maker(maker: KnowledgeMaker, ctx: LoopContext) -> LoopResult:
    """Run ``maker`` until ``max_rounds`` or a stop; see :class:`KnowledgeMaker` for the hook order."""
    driver = MakerDriver(maker, ctx)

    def one_round(wait: float) -> bool:
        got = ctx.channel.fetch(newer_than=driver.last_version, timeout=wait)
        if got is None:
            return False
        driver.make_round(*got)
        return True

    try:
        driver.begin()
        while True:
            if not driver.rounds_left():
                return driver.end("max_rounds")
            if ctx.stop.stop_requested():
                if maker.final_pass:
                    one_round(0.0)
                return driver.end("stopped")
            if not one_round(0.0):
                ctx.stop.wait(ctx.poll_interval)
    finally:
        maker.teardown()


def run_loop(obj: Trainer | KnowledgeMaker, ctx: LoopContext) -> LoopResult:
    """Run a trainer or a maker."""
    if isinstance(obj, Trainer):
        return run_trainer(obj, ctx)
    if isinstance(obj, KnowledgeMaker):
        return run_maker(obj, ctx)
    raise TypeError(f"expected a Trainer or a KnowledgeMaker, got {type(obj).__name__}")
