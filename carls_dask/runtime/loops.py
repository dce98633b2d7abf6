"""The trainer and maker loops. Pure: no Dask here, the context supplies channel, stop and report."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from typing import Any

from carls_dask.runtime.context import LoopContext, LoopResult, MakerRound
from carls_dask.runtime.maker import KnowledgeMaker
from carls_dask.runtime.trainer import Trainer

__all__ = ["run_loop", "run_maker", "run_trainer"]

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


def run_trainer(trainer: Trainer, ctx: LoopContext) -> LoopResult:
    """Run ``trainer`` until ``max_steps`` or a stop; see :class:`Trainer` for the hook order."""
    trainer.ctx = ctx
    result = LoopResult(trainer.name, "trainer")
    publish_every = trainer.publish_every or ctx.publish_every
    try:
        trainer.setup(ctx)
        if trainer.resume_from is not None:
            trainer.load_state(trainer.resume_from)
        step = trainer.start_step
        first = step
        t0 = time.monotonic()
        last_report = t0
        last_step_reported = step
        last_published = None
        metrics: dict[str, float] = {}
        while True:
            if trainer.max_steps is not None and step >= trainer.max_steps:
                result.reason = "max_steps"
                break
            if ctx.stop.stop_requested():
                result.reason = "stopped"
                break
            metrics.update(_numbers(trainer.step(step), f"{type(trainer).__name__}.step"))
            step += 1
            trainer.start_step = step
            if step % publish_every == 0:
                result.published.append(ctx.channel.publish(trainer.publish_state(), step=step, producer=trainer.name))
                last_published = step
            now = time.monotonic()
            if now - last_report >= ctx.report_interval:
                rate = (step - last_step_reported) / (now - last_report)
                ctx.report({"step": float(step), "steps_per_s": rate, **metrics})
                last_report, last_step_reported = now, step
        if step != last_published and step > first:
            result.published.append(ctx.channel.publish(trainer.publish_state(), step=step, producer=trainer.name))
        result.elapsed = time.monotonic() - t0
        result.steps = step - first
        rate = result.steps / result.elapsed if result.elapsed > 0 else math.nan
        ctx.report({"step": float(step), "steps_per_s": rate, **metrics})
        result.metrics = metrics
        result.value = trainer.finish()
        if trainer.keep_state:
            result.state = trainer.state()
        logger.info("trainer %s ended (%s) after %d steps", trainer.name, result.reason, result.steps)
        return result
    finally:
        trainer.teardown()


def run_maker(maker: KnowledgeMaker, ctx: LoopContext) -> LoopResult:
    """Run ``maker`` until ``max_rounds`` or a stop; see :class:`KnowledgeMaker` for the hook order."""
    maker.ctx = ctx
    result = LoopResult(maker.name, "maker")
    try:
        maker.setup(ctx)
        t0 = time.monotonic()
        last = 0
        metrics: dict[str, float] = {}

        def one_round(wait: float) -> bool:
            nonlocal last
            got = ctx.channel.fetch(newer_than=last, timeout=wait)
            if got is None:
                return False
            version, state = got
            started = time.monotonic()
            maker.load_model(state, version)
            metrics.update(_numbers(maker.make(version), f"{type(maker).__name__}.make"))
            done = time.time()
            staleness = max(0.0, done - version.wall_time)
            result.rounds.append(MakerRound(version.version, version.step, staleness, time.monotonic() - started))
            last = version.version
            ctx.report({"round": float(len(result.rounds)), "version": float(version.version),
                        "model_step": float(version.step), "staleness_s": staleness, **metrics})
            return True

        while True:
            if maker.max_rounds is not None and len(result.rounds) >= maker.max_rounds:
                result.reason = "max_rounds"
                break
            if ctx.stop.stop_requested():
                result.reason = "stopped"
                if maker.final_pass:
                    one_round(0.0)
                break
            if not one_round(0.0):
                ctx.stop.wait(ctx.poll_interval)
        result.elapsed = time.monotonic() - t0
        result.steps = len(result.rounds)
        result.metrics = metrics
        result.value = maker.finish()
        state = maker.state()
        result.state = state or None
        logger.info("maker %s ended (%s) after %d rounds", maker.name, result.reason, result.steps)
        return result
    finally:
        maker.teardown()


def run_loop(obj: Trainer | KnowledgeMaker, ctx: LoopContext) -> LoopResult:
    """Run a trainer or a maker."""
    if isinstance(obj, Trainer):
        return run_trainer(obj, ctx)
    if isinstance(obj, KnowledgeMaker):
        return run_maker(obj, ctx)
    raise TypeError(f"expected a Trainer or a KnowledgeMaker, got {type(obj).__name__}")
