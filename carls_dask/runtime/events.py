"""How a :class:`~carls_dask.runtime.Workbench` learns that a worker running one of its loops was removed.

Each Workbench registers one :class:`WorkerLossWatch` on the scheduler, named after the Workbench
(:func:`watch_name`), and subscribes its client to one topic of its own (:func:`loss_topic`). The
plugin watches only the Workbench's loop keys (those ending in ``-<workbench id>``) and, when the
scheduler removes a worker that was running or had been assigned one of them, logs a
:class:`LostLoops` message on that topic. The Workbench reads nothing else: it never subscribes to
the scheduler's cluster-wide topics, so a handler a user set on any other topic of the same client
keeps working, and at close it unsubscribes its topic and unregisters the plugin.

How the lost keys are found
---------------------------
Only the arguments of public :class:`distributed.diagnostics.plugin.SchedulerPlugin` hooks are used:

- ``transition(key, start, finish, *, stimulus_id, **kwargs)``: a watched key that leaves the
  ``processing`` state (running or assigned on a worker) is remembered under the ``stimulus_id``
  of the transition;
- ``remove_worker(scheduler, worker, *, stimulus_id, **kwargs)``: the keys remembered under the
  ``stimulus_id`` of the removal are the ones that left ``processing`` because of it.
  ``Scheduler.remove_worker`` releases the removed worker's processing tasks with that stimulus id
  and then runs the synchronous ``remove_worker`` hooks without yielding to the event loop (the
  order of distributed 2026.8, the oldest version this project supports; pinned by
  ``tests/runtime/test_worker_loss.py``), so nothing else can interleave.

A task released with its worker may already be processing on another worker when the hook runs
(the scheduler reschedules it in the same step); it is reported all the same. Work stealing moves a
task between workers without a transition, which is why the worker is not recorded per key but
taken from the removal itself.

Distributed APIs relied on (distributed >= 2026.8, the version ``pyproject.toml`` requires):

- :class:`~distributed.diagnostics.plugin.SchedulerPlugin` hooks ``transition``, ``remove_worker``
  and ``restart``, and its ``idempotent`` attribute;
- :meth:`distributed.Scheduler.log_event` (from the plugin) to publish on the Workbench's topic;
- :meth:`distributed.Client.register_plugin`, :meth:`~distributed.Client.unregister_scheduler_plugin`,
  :meth:`~distributed.Client.subscribe_topic` and :meth:`~distributed.Client.unsubscribe_topic` (from
  the Workbench).

The plugin is pickled by reference, so ``carls_dask`` must be importable where the scheduler runs
(it is for the clusters a Workbench starts, whose scheduler runs in the Workbench's process).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

from distributed.diagnostics.plugin import SchedulerPlugin

__all__ = ["LostLoops", "WorkerLossWatch", "loss_topic", "watch_name"]

logger = logging.getLogger(__name__)

#: Stimulus ids remembered at most (a removal's hook reads its own right after its transitions).
MAX_PENDING = 64


def loss_topic(workbench: str) -> str:
    """The event topic on which the watch of Workbench ``workbench`` (its id) reports lost loops."""
    return f"{workbench}-worker-loss"


def watch_name(workbench: str) -> str:
    """The name under which the watch of Workbench ``workbench`` is registered on the scheduler."""
    return f"{workbench}-worker-loss-watch"


@dataclasses.dataclass(frozen=True)
class LostLoops:
    """One worker removal that took some of a Workbench's loop tasks with it.

    Attributes
    ----------
    workbench
        The Workbench's id.
    worker
        Address of the removed worker.
    keys
        Keys of the Workbench's tasks that were running or assigned on that worker.
    time
        Unix time of the removal (0 when unknown).
    """

    workbench: str
    worker: str
    keys: tuple[str, ...]
    time: float = 0.0

    def to_msg(self) -> dict[str, Any]:
        """The event message (msgpack-serialisable)."""
        return {"workbench": self.workbench, "worker": self.worker, "keys": list(self.keys), "time": self.time}

    @classmethod
    def from_msg(cls, msg: Any) -> LostLoops | None:
        """Parse an event message; ``None`` when it is not one of :meth:`to_msg`'s."""
        if not isinstance(msg, dict):
            return None
        keys, workbench, worker = msg.get("keys"), msg.get("workbench"), msg.get("worker")
        if not isinstance(workbench, str) or not isinstance(keys, (list, tuple)):
            return None
        when = msg.get("time")
        return cls(workbench, str(worker), tuple(str(k) for k in keys),
                   float(when) if isinstance(when, int | float) and not isinstance(when, bool) else 0.0)


class WorkerLossWatch(SchedulerPlugin):
    """Scheduler plugin: reports the loop keys of one Workbench that a worker removal took away.

    Parameters
    ----------
    workbench
        The Workbench's id; its loop keys end with ``-<workbench>``.
    topic
        The topic the reports are logged on (default :func:`loss_topic`).
    """

    idempotent = True  # registering again under the same name keeps the running watch

    def __init__(self, workbench: str, topic: str | None = None) -> None:
        self.workbench = workbench
        self.topic = topic or loss_topic(workbench)
        self.suffix = f"-{workbench}"
        self._left: dict[str, list[str]] = {}  # stimulus id -> watched keys that left processing under it

    def watches(self, key: Any) -> bool:
        """Whether ``key`` is one of the Workbench's loop keys."""
        return isinstance(key, str) and key.endswith(self.suffix)

    def transition(self, key: Any, start: str, finish: str, *args: Any, stimulus_id: str = "",
                   **kwargs: Any) -> None:
        """Remember a watched key that left ``processing``, under the transition's stimulus id."""
        if start != "processing" or finish == "processing" or not self.watches(key):
            return
        self._left.setdefault(stimulus_id, []).append(key)
        while len(self._left) > MAX_PENDING:
            self._left.pop(next(iter(self._left)))

    def remove_worker(self, scheduler: Any, worker: str, *, stimulus_id: str = "", **kwargs: Any) -> None:
        """Log the watched keys the removal of ``worker`` released on the Workbench's topic."""
        keys = self._left.pop(stimulus_id, None)
        if not keys:
            return
        report = LostLoops(self.workbench, worker, tuple(dict.fromkeys(keys)), time.time())
        logger.info("worker %s removed while running %s (stimulus %s)", worker, list(report.keys), stimulus_id)
        scheduler.log_event(self.topic, report.to_msg())

    def restart(self, scheduler: Any) -> None:
        """Forget what was remembered: a restart releases every task."""
        self._left.clear()
