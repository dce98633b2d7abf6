"""What a training step costs the bank and the trainer: messages, bytes, waiting and CPU per step.

:class:`StepProfile` reads a bank object's counters (:class:`~carls_dask.bank.client.BankCounters`: what
this process sent) and this process's CPU time at the start and end of a span of steps and divides by the
steps; with ``shards=True`` it also asks every shard for the CPU time of its process
(:meth:`BankShard.stats <carls_dask.bank.actor.BankShard.stats>`), so a step's cost on the bank's side is
seen beside the trainer's. The runtime reports the trainer's part with every metrics row
(``bank_messages_per_step``, ``bank_kb_per_step``, ``bank_wait_ms_per_step``, ``trainer_cpu_ms_per_step``);
``benchmarks/models.py`` prints the whole profile of each way a model is trained.
"""

from __future__ import annotations

import dataclasses
import time
from typing import TYPE_CHECKING

from carls_dask.storage.runfolder import (
    BANK_KB_PER_STEP,
    BANK_MESSAGES_PER_STEP,
    BANK_WAIT_MS_PER_STEP,
    TRAINER_CPU_MS_PER_STEP,
)

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["StepCost", "StepProfile"]


@dataclasses.dataclass(frozen=True)
class StepCost:
    """The cost of one step, averaged over a span of steps.

    Attributes
    ----------
    steps
        Steps in the span.
    messages
        Messages to shards per step (the shards a send involves; every operation to one shard in a send
        travels in one message).
    sends
        Sends per step (each waits for one round trip, or overlaps the step when prefetched).
    operations
        Bank operations per step (a lookup or a push of one table counts one, over every shard).
    kb
        Kilobytes of arrays sent and received per step.
    wait_ms
        Milliseconds per step the sending threads waited for the bank (in the background for prefetched
        sends: not all of it holds the step up).
    trainer_cpu_ms
        CPU milliseconds per step of this (the trainer's) process, every thread.
    shard_cpu_ms
        CPU milliseconds per step of the shards' processes together (None unless measured).
    wall_ms
        Wall milliseconds per step.
    """

    steps: int
    messages: float
    sends: float
    operations: float
    kb: float
    wait_ms: float
    trainer_cpu_ms: float
    shard_cpu_ms: float | None
    wall_ms: float

    def as_metrics(self) -> dict[str, float]:
        """The trainer's part as the run's metric names."""
        return {BANK_MESSAGES_PER_STEP: self.messages, BANK_KB_PER_STEP: self.kb,
                BANK_WAIT_MS_PER_STEP: self.wait_ms, TRAINER_CPU_MS_PER_STEP: self.trainer_cpu_ms}


class StepProfile:
    """Counts a bank object's traffic and the CPU of this process (and, optionally, of the shards) over steps.

    Parameters
    ----------
    bank
        The :class:`~carls_dask.bank.KnowledgeBank` object the steps use (its counters are this process's).
    shards
        Also read the shards' CPU time at :meth:`start` and :meth:`stop` (one call to every shard each).
    """

    def __init__(self, bank: KnowledgeBank, *, shards: bool = False) -> None:
        self.bank = bank
        self.shards = bool(shards)
        self.start()

    def _shard_cpu(self) -> float | None:
        if not self.shards:
            return None
        return float(sum(float(s.get("process_cpu_s", 0.0)) for s in self.bank.stats()["shards"]))

    def start(self) -> None:
        """Start a span now."""
        self._counters = dataclasses.replace(self.bank.counters)
        self._cpu = time.process_time()
        self._wall = time.perf_counter()
        self._shard = self._shard_cpu()

    def stop(self, steps: int, *, restart: bool = True) -> StepCost:
        """The cost per step of the ``steps`` taken since :meth:`start` (then a new span starts)."""
        c, c0 = self.bank.counters, self._counters
        n = max(int(steps), 1)
        shard = self._shard_cpu()
        cost = StepCost(
            steps=int(steps),
            messages=(c.messages - c0.messages) / n,
            sends=(c.sends - c0.sends) / n,
            operations=(c.operations - c0.operations) / n,
            kb=(c.bytes_sent + c.bytes_received - c0.bytes_sent - c0.bytes_received) / 1024 / n,
            wait_ms=(c.wait_s - c0.wait_s) * 1e3 / n,
            trainer_cpu_ms=(time.process_time() - self._cpu) * 1e3 / n,
            shard_cpu_ms=None if shard is None or self._shard is None else (shard - self._shard) * 1e3 / n,
            wall_ms=(time.perf_counter() - self._wall) * 1e3 / n,
        )
        if restart:
            self.start()
        return cost
