"""The Dask shell of the loops: the function a long-lived future runs on a worker."""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Mapping
from typing import Any

from carls_dask.runtime.channel import ModelChannel
from carls_dask.runtime.context import LoopContext, LoopResult, LoopSettings, StopControl
from carls_dask.runtime.durability import rolled_back
from carls_dask.runtime.loops import run_loop
from carls_dask.runtime.maker import KnowledgeMaker
from carls_dask.runtime.placement import device_for
from carls_dask.runtime.trainer import Trainer

__all__ = ["ROLLED_BACK", "STARTED", "DaskStop", "LoopSpec", "run_loop_task"]

#: The ``event`` of the message a loop task sends on its progress topic when it starts.
STARTED = "started"
#: The ``reason`` of a loop that ended because a table it wrote was rolled back with a lost bank shard.
ROLLED_BACK = "rolled back"

logger = logging.getLogger(__name__)


class DaskStop(StopControl):
    """A :class:`StopControl` backed by a :class:`distributed.Event`.

    Each ``is_set`` is a scheduler round trip (~1 ms), so :meth:`stop_requested` asks the
    scheduler at most once per ``check_interval`` seconds and otherwise answers from its cache.
    """

    def __init__(self, event_name: str, check_interval: float) -> None:
        from distributed import Event, get_client

        self._event = Event(event_name, client=get_client())
        self._interval = check_interval
        self._next = 0.0
        self._stopped = False

    def stop_requested(self) -> bool:
        if self._stopped:
            return True
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self._interval
            self._stopped = bool(self._event.is_set())
        return self._stopped

    def wait(self, seconds: float) -> bool:
        if not self._stopped and seconds > 0:
            self._stopped = bool(self._event.wait(timeout=seconds))
        return self.stop_requested()


@dataclasses.dataclass
class LoopSpec(LoopSettings):
    """What the Workbench sends with a loop: the loop, the names of its cluster objects, and the
    :class:`~carls_dask.runtime.context.LoopSettings` its context is built with (keywords only).

    Attributes
    ----------
    obj
        The trainer or maker to run.
    channel
        Its model channel.
    stop_event
        Name of the :class:`distributed.Event` that stops it.
    topic
        The event topic its progress reports go to.
    """

    obj: Trainer | KnowledgeMaker
    channel: ModelChannel
    stop_event: str
    topic: str


def _reporter(topic: str, name: str, kind: str) -> Any:
    from distributed import get_worker

    worker = get_worker()

    def report(values: Mapping[str, float]) -> None:
        msg = {"loop": name, "kind": kind, "time": time.time()}
        for key, value in values.items():
            v = float(value)
            msg[key] = None if math.isnan(v) else v
        worker.log_event(topic, msg)

    return report


_slot_lock = threading.Lock()
_next_slot = 0


def _take_device() -> str:
    """The device of the next loop started in this worker process: CUDA devices round-robin, else ``"cpu"``.

    Each loop takes a slot from a per-process counter (thread-safe: loops start in worker threads),
    so loops sharing a multi-GPU worker spread over its devices (see
    :func:`~carls_dask.runtime.placement.device_for`).
    """
    global _next_slot
    import torch

    n_devices = int(torch.cuda.device_count()) if torch.cuda.is_available() else 0
    with _slot_lock:
        slot = _next_slot
        _next_slot += 1
    return device_for(slot, n_devices)


def run_loop_task(spec: LoopSpec) -> LoopResult:
    """Run one trainer or maker on this worker until it ends or the Workbench stops it.

    It secedes from the worker's thread pool first, so short tasks on the same worker keep
    running beside it. Its torch device is the next of this process's CUDA devices, round-robin
    (``"cpu"`` without CUDA). An exception propagates unchanged: the future fails with the original
    traceback; except one raised because a table the loop wrote was rolled back with a lost bank shard
    (:class:`~carls_dask.errors.RolledBackError`), which ends the loop with reason :data:`ROLLED_BACK`.
    """
    from distributed import get_worker, secede

    secede()
    obj = spec.obj
    worker = get_worker()  # tells the Workbench where (again) the loop runs: a restart's one line names it
    worker.log_event(spec.topic, {"loop": obj.name, "kind": obj.kind, "event": STARTED, "worker": worker.address,
                                  "time": time.time()})
    ctx = LoopContext(
        name=obj.name,
        kind=obj.kind,
        device=_take_device(),
        channel=spec.channel,
        stop=DaskStop(spec.stop_event, check_interval=min(spec.poll_interval, 0.25)),
        report=_reporter(spec.topic, obj.name, obj.kind),
        **spec.loop_settings(),
    )
    logger.info("%s %s starting on %s", obj.kind, obj.name, ctx.device)
    try:
        return run_loop(obj, ctx)
    except Exception as exc:
        if not rolled_back(exc):
            raise
        # not a failure: the Workbench rolls the bank and this loop back to one checkpoint and runs it again
        logger.info("%s %s: %s", obj.kind, obj.name, exc)
        return LoopResult(obj.name, obj.kind, reason=ROLLED_BACK, value=str(exc))
