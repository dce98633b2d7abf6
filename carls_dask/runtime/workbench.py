"""The :class:`Workbench`: a cluster, a knowledge bank, and trainers and makers as long-lived futures.

Typical use::

    with Workbench(run_dir="runs/demo") as wb:
        bank = wb.create_bank([TableSpec("nodes", columns=(Column("embedding", shape=(32,)),))])
        wb.submit_trainer(MyTrainer("trainer", max_steps=2000))
        wb.submit_maker(MyMaker("maker"))
        wb.wait(timeout=600)              # until the trainers end; raises if any loop failed
        results = wb.stop(timeout=30)     # stop the makers, collect every loop's LoopResult

With a ``run_dir`` the Workbench writes the run folder a paradigm run writes (``docs/runs.md`` compares
the two): ``RUN/metrics.zarr``, ``RUN/run.json``, and, with no ``checkpointer`` given, a checkpointer of
its own (``carls.run.snapshot-every``, ``carls.storage.keep-snapshots``): a bank made by
:meth:`Workbench.create_bank` logs to ``RUN/bank``, the primary trainer snapshots it and every trainer
saves its state to ``RUN/checkpoints/`` every ``carls.run.snapshot-every`` steps; :meth:`Workbench.stop`
(or the end of the ``with`` block) snapshots the bank at the primary trainer's last step and writes
``RUN/result.json`` (the loops' results, the primary trainer's ``finish()`` figures, the snapshots).

Lifecycle: ``created -> running`` (:meth:`start`, or entering the ``with`` block) ``-> stopping``
(:meth:`stop`) ``-> closed`` (:meth:`close`, or leaving the block). A loop that raises fails its
future with the original traceback; the Workbench then moves to ``failed``, stops every other
loop, and the next :meth:`wait`, :meth:`stop`, :meth:`results` or the end of the ``with`` block
raises :class:`~carls_dask.errors.LoopFailedError` whose ``__cause__`` is the loop's exception.

Worker loss: the Workbench registers a scheduler plugin of its own
(:class:`~carls_dask.runtime.events.WorkerLossWatch`, public ``SchedulerPlugin`` hooks) that reports
on the Workbench's own event topic which of its loop tasks were on a removed worker; the client
subscribes to that topic only, and the plugin is unregistered at close. See
:mod:`carls_dask.runtime.events` for the distributed APIs this relies on.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
import pathlib
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from carls_dask import config
from carls_dask.errors import (
    ArgumentTypeError,
    CarlsError,
    ConfigError,
    DeadlineExceeded,
    LifecycleError,
    LoopFailedError,
    RolledBackError,
)
from carls_dask.runtime.channel import ModelChannel, unique_prefix
from carls_dask.runtime.clusters import make_security, start_cluster
from carls_dask.runtime.context import LoopResult
from carls_dask.runtime.durability import cut_line, drop_states_after, newest_cut, snapshot_kept
from carls_dask.runtime.events import LostLoops, WorkerLossWatch, loss_topic, watch_name
from carls_dask.runtime.lifecycle import Lifecycle, State
from carls_dask.runtime.maker import KnowledgeMaker
from carls_dask.runtime.placement import BANK, loop_resources, resources_for, worker_resources, workers_with
from carls_dask.runtime.progress import ProgressBook, ProgressSink
from carls_dask.runtime.tasks import ROLLED_BACK, STARTED, LoopSpec, run_loop_task
from carls_dask.runtime.trainer import Trainer
from carls_dask.storage.runfolder import RunFolder

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["LoopHandle", "LoopStatus", "Workbench"]

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class LoopStatus:
    """A snapshot of one loop, as :meth:`Workbench.status` reports it.

    Attributes
    ----------
    name, kind
        The loop's name and ``"trainer"`` or ``"maker"``.
    state
        ``"running"``, ``"stopping"``, ``"closed"`` (ended normally) or ``"failed"``.
    future
        The Dask future's status (``"pending"``, ``"finished"``, ``"error"``, ``"cancelled"``).
    progress
        The loop's newest reported numbers (step, steps_per_s, version, staleness_s, ...).
    error
        ``repr`` of the loop's exception when it failed.
    restarts
        Times the loop was run again because its worker died.
    """

    name: str
    kind: str
    state: str
    future: str
    progress: dict[str, float]
    error: str | None = None
    restarts: int = 0


class LoopHandle:
    """The Workbench's record of one submitted loop."""

    def __init__(self, name: str, kind: str, future: Any, obj: Trainer | KnowledgeMaker) -> None:
        self.name = name
        self.kind = kind
        self.future = future
        self.cls = f"{type(obj).__module__}.{type(obj).__qualname__}"
        self.life = Lifecycle(f"{kind} {name!r}")
        self.life.to(State.RUNNING)
        self.error: BaseException | None = None
        self.result: LoopResult | None = None
        self.restarts = 0
        #: How the loop was submitted (its spec and ``Client.submit`` keywords), to submit it again after a cut.
        self.submitted: tuple[Any, dict[str, Any]] | None = None
        #: A restart under way: when the fault happened (unix time) and what the one line reporting it says so far.
        self.recovering: tuple[float, str] | None = None

    def __repr__(self) -> str:
        return f"<LoopHandle {self.kind} {self.name!r} {self.life.state.value}>"


class Workbench:
    """Starts or connects to a Dask cluster and runs a bank, trainers and makers on it.

    Parameters
    ----------
    cluster
        ``None`` to follow ``carls.cluster.kind`` (a LocalCluster by default); a scheduler address
        string; a running cluster object; or a :class:`distributed.Client`. Objects passed in are
        not closed by the Workbench; clusters it starts are.
    run_dir
        Folder of the run: ``RUN/metrics.zarr`` (progress metrics), ``RUN/run.json`` (what ran), and without
        a ``checkpointer`` the bank store, trainer states and ``RUN/result.json`` (see the module notes).
        ``None`` writes nothing.
    name
        Name of the run (default: the run folder's name, else ``"run"``).
    progress
        Show a terminal progress bar; default ``carls.runtime.progress``.
    stop_timeout
        Seconds :meth:`stop` and :meth:`close` wait for loops; default ``carls.runtime.stop-timeout``.
    cluster_options
        Keyword arguments for the cluster the Workbench starts (e.g. ``n_workers`` or SLURMCluster's
        ``cores``, ``memory``, ``queue``).
    security
        TLS of the cluster the Workbench starts (and of its client): a
        :class:`distributed.security.Security`, ``"temporary"`` (self-signed certificates made at
        start), ``"files"`` (``carls.cluster.tls``) or ``"none"``; default ``carls.cluster.security``.
        With a scheduler address (``tls://...``) it is the client's certificate.
    checkpointer
        A :class:`~carls_dask.runtime.checkpoints.Checkpointer`: trainers then save their state (and
        the primary trainer snapshots the bank) every ``checkpointer.every`` steps, start from their
        newest saved state, and a trainer whose worker died is run again on a live worker from it
        (up to ``carls.runtime.trainer-restarts`` times). ``None``: with a ``run_dir``, the Workbench's
        own (see the module notes; its bank snapshots go to ``RUN/bank`` once :meth:`create_bank` made the
        bank log there); without one, no checkpoints, and a trainer whose worker died fails the run.
    run_id
        The run's identity stored with its metrics (default: ``name``); a metric store of another run
        is refused. :func:`~carls_dask.runtime.runner.run_paradigm` passes the ``run_id`` of
        ``request.json``, so a moved or copied run folder keeps writing to its own store.
    """

    def __init__(self, cluster: Any = None, *, run_dir: str | pathlib.Path | None = None, name: str | None = None,
                 progress: bool | None = None, stop_timeout: float | str | None = None,
                 cluster_options: dict[str, Any] | None = None, security: Any = None,
                 checkpointer: Any = None, run_id: str | None = None) -> None:
        self._cluster_arg = cluster
        self.run_dir = pathlib.Path(run_dir) if run_dir is not None else None
        self.name = name or (self.run_dir.name if self.run_dir is not None else "run")
        self.run_id = run_id or self.name
        self.progress = bool(config.get("runtime.progress", progress))
        self.stop_timeout = config.get_seconds("runtime.stop-timeout", stop_timeout)
        self.poll_interval = config.get_seconds("runtime.poll-interval")
        self.report_interval = config.get_seconds("runtime.report-interval")
        self.start_timeout = config.get_seconds("cluster.start-timeout")
        self.cluster_options = dict(cluster_options or {})
        self.security = make_security(security)
        self._life = Lifecycle(f"Workbench {self.name!r}")
        self.prefix = unique_prefix()
        self.stop_event_name = f"{self.prefix}-stop"
        self.topic = f"{self.prefix}-progress"
        self.loss_topic = loss_topic(self.prefix)
        self.cluster: Any = None
        self.client: Any = None
        self.bank: KnowledgeBank | None = None
        self._own_cluster = False
        self._own_client = False
        self._watching = False
        self._loops: dict[str, LoopHandle] = {}
        self._channels: dict[str, ModelChannel] = {}
        self._home_worker: str | None = None
        self._placement = str(config.get("bank.placement"))
        self._events: collections.deque[Any] = collections.deque()
        self._rehomings: collections.deque[tuple[str, dict[str, Any]]] = collections.deque()
        self._rehome_topic: str | None = None
        self._loss_reports: collections.deque[Any] = collections.deque()
        self.maker_restarts = int(config.get("runtime.maker-restarts"))
        self.trainer_restarts = int(config.get("runtime.trainer-restarts"))
        self.metrics_every = int(config.get("run.metrics-every"))
        #: Whether the Workbench keeps the run folder itself (a run_dir and no checkpointer given): it then
        #: snapshots the bank at the end and writes ``RUN/result.json``.
        self.owns_run = self.run_dir is not None and checkpointer is None
        if self.owns_run:
            from carls_dask.runtime.checkpoints import Checkpointer

            checkpointer = Checkpointer(str(self.run_dir), int(config.get("run.snapshot-every")),
                                        int(config.get("storage.keep-snapshots")))
        self.checkpointer = checkpointer
        self._wrapped = False
        self.book = ProgressBook()
        self._sink: ProgressSink | None = None
        self._monitor: threading.Thread | None = None
        self._monitor_stop = threading.Event()
        self._failure: tuple[str, BaseException] | None = None
        self._cut_lock = threading.RLock()
        self._seen_finished: set[str] = set()  # loop futures whose result was read for a rollback
        self._failure_raised = False
        self._stop_event: Any = None
        self._started_at = 0.0

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def state(self) -> State:
        """The Workbench's lifecycle state."""
        return self._life.state

    def start(self) -> Workbench:
        """Start or connect to the cluster, then start progress reporting. Returns ``self``."""
        from distributed import Client, Event

        self._life.require(State.CREATED, action="start")
        try:
            self._connect(Client)
            self._stop_event = Event(self.stop_event_name, client=self.client)
            self.client.subscribe_topic(self.topic, self._events.append)
            self._watch_worker_loss()
            metrics = None
            if self.run_dir is not None:
                self.run_dir.mkdir(parents=True, exist_ok=True)
                metrics = RunFolder(self.run_dir).metrics
            self._sink = ProgressSink(self.book, show=self.progress, metrics_path=metrics, run=self.run_id,
                                      desc=self.name)
            self._monitor = threading.Thread(target=self._watch, name=f"carls-workbench-{self.name}", daemon=True)
            self._monitor.start()
        except BaseException:
            self._life.to(State.FAILED)
            self._teardown()
            raise
        self._started_at = time.time()
        self._life.to(State.RUNNING)
        logger.info("Workbench %s running on %s", self.name, self.client.scheduler.address)
        return self

    def progress_from(self, step: int) -> None:
        """Start the progress bar at ``step``: the run continues a checkpoint saved there."""
        if self._sink is not None:
            self._sink.start_at(step)

    def _watch_worker_loss(self) -> None:
        """Register the Workbench's :class:`WorkerLossWatch` and subscribe to its topic."""
        self.client.subscribe_topic(self.loss_topic, self._loss_reports.append)
        try:
            self.client.register_plugin(WorkerLossWatch(self.prefix, self.loss_topic), name=watch_name(self.prefix))
        except Exception as exc:
            raise LifecycleError(f"Workbench {self.name!r}: could not register its worker-loss watch on the "
                                 f"scheduler at {self.client.scheduler.address} ({type(exc).__name__}: {exc}); "
                                 "carls_dask must be importable where the scheduler runs") from exc
        self._watching = True

    def _connect(self, client_cls: Any) -> None:
        arg = self._cluster_arg
        if arg is not None and isinstance(arg, client_cls):
            self.client = arg
            return
        n_wait = 1
        if arg is None:
            self.cluster, address = start_cluster(**self.cluster_options,
                                                         security=self.security if self.security is not None else False)
            self._own_cluster = self.cluster is not None
            target: Any = self.cluster if self.cluster is not None else address
            if self._own_cluster:
                n_wait = max(1, len(getattr(self.cluster, "worker_spec", {})) or 1)
        elif isinstance(arg, str):
            target = arg
        else:
            self.cluster = target = arg
        sec = {"security": self.security} if self.security is not None and isinstance(target, str) else {}
        self.client = client_cls(target, timeout=self.start_timeout, **sec)
        self._own_client = True
        try:
            self.client.wait_for_workers(n_wait, timeout=self.start_timeout)
        except TimeoutError as exc:
            raise DeadlineExceeded(f"Workbench {self.name!r}: no {n_wait} worker(s) joined the scheduler at "
                                   f"{self.client.scheduler.address} within {self.start_timeout:g}s "
                                   "(carls.cluster.start-timeout)") from exc

    def __enter__(self) -> Workbench:
        if self.state is State.CREATED:
            self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: Any) -> None:
        if exc_type is not None:
            self._wrapped = True  # a block that raised leaves no final snapshot or result.json
        try:
            self.close()
        except CarlsError:
            if exc_type is None:
                raise
            logger.exception("Workbench %s: error while closing after %s", self.name, exc_type.__name__)

    # -- bank --------------------------------------------------------------------------------
    def _workers(self) -> list[str]:
        return sorted(self.client.scheduler_info(n_workers=-1).get("workers", {}))

    def home_worker(self) -> str:
        """The worker the first trainer runs on (and co-located bank shards live on).

        The first (by address) of the workers with the resources ``carls.placement.trainer`` asks
        for, else of all workers.
        """
        if self._home_worker is None:
            have = worker_resources(self.client)
            candidates = workers_with(resources_for("trainer", None, have), have) or self._workers()
            if not candidates:
                raise LifecycleError(f"Workbench {self.name!r}: the cluster has no workers")
            self._home_worker = candidates[0]
        return self._home_worker

    @property
    def the_bank(self) -> KnowledgeBank:
        """The Workbench's bank (raises :class:`~carls_dask.errors.LifecycleError` before one was created or
        restored)."""
        if self.bank is None:
            raise LifecycleError("Workbench: no bank yet; expected create_bank(tables) or restore_bank(root) first")
        return self.bank

    def create_bank(self, tables: Sequence[Any], *, n_shards: int | None = None, buckets: int | None = None,
                    placement: str | None = None, name: str | None = None, log_root: str | None = None) -> Any:
        """Create the run's :class:`~carls_dask.bank.KnowledgeBank` (one actor per shard).

        Parameters
        ----------
        tables
            The :class:`~carls_dask.bank.TableSpec` of each table.
        n_shards, buckets
            Default ``carls.bank.shards`` and ``carls.bank.buckets``.
        placement
            ``"spread"`` places shards round-robin over the workers that may hold shards;
            ``"colocate"`` puts every shard on the first trainer's worker (the fast path for one
            trainer). Default ``carls.bank.placement``. Only workers that advertise the resources of
            ``carls.placement.shard`` (or ``carls.placement.names.bank``) may hold shards.
        log_root
            Bank store folder: every mutating batch is appended to its delta log before the call
            returns (see :meth:`KnowledgeBank.create`). Default: ``RUN/bank`` when the Workbench keeps
            its run folder itself (see :attr:`owns_run`), which the checkpoints then snapshot; else none.

        Raises
        ------
        ConfigError
            For an unknown ``placement``, or when no worker (with ``"colocate"``: not the first
            trainer's worker) advertises the resources shards need.
        """
        from carls_dask.bank.client import KnowledgeBank

        self._life.require(State.RUNNING, action="create a bank")
        if self.bank is not None:
            raise LifecycleError(f"Workbench {self.name!r}: a bank was already created; one bank per Workbench")
        placement = str(config.get("bank.placement", placement))
        if placement not in ("spread", "colocate"):
            raise ConfigError(f"Workbench {self.name!r}: placement {placement!r}; expected 'spread' or 'colocate'")
        self._placement = placement
        workers = self._shard_workers(placement)
        if log_root is None and self.owns_run and self.checkpointer is not None:
            assert self.run_dir is not None
            log_root = str(RunFolder(self.run_dir).bank)
            self.checkpointer = dataclasses.replace(self.checkpointer, bank_root=log_root)
        self.bank = KnowledgeBank.create(self.client, tables, n_shards=n_shards, buckets=buckets, workers=workers,
                                         name=name or f"{self.prefix}-bank", log_root=log_root)
        self._relay_rehomings()
        return self.bank

    def restore_bank(self, root: str, *, n_shards: int | None = None, version: int | None = None) -> Any:
        """Start the run's bank from snapshot ``version`` (newest by default) of ``root`` plus its delta log.

        The restored bank keeps logging into ``root``, so the run goes on where it was (``carls-dask
        run --resume``). Shards are placed as :meth:`create_bank` places them.
        """
        from carls_dask.bank.client import KnowledgeBank

        self._life.require(State.RUNNING, action="restore a bank")
        if self.bank is not None:
            raise LifecycleError(f"Workbench {self.name!r}: a bank was already created; one bank per Workbench")
        workers = self._shard_workers(self._placement)
        self.bank = KnowledgeBank.restore(self.client, root, n_shards=n_shards, version=version, workers=workers,
                                          log_root=root)
        self._relay_rehomings()
        return self.bank

    def _relay_rehomings(self) -> None:
        """Log, in this process, the one line of each re-homing of the bank's shards that a task's copy did
        (its own line stays in the worker's log); the monitor drains them."""
        from carls_dask.bank.rehoming import process_id, rehome_topic

        here, bank = process_id(), self.the_bank.name

        def relay(event: Any) -> None:
            _, msg = event
            if isinstance(msg, dict) and msg.get("by") != here:
                self._rehomings.append((bank, msg))

        self._rehome_topic = rehome_topic(bank)
        self.client.subscribe_topic(self._rehome_topic, relay)

    def _shard_workers(self, placement: str) -> list[str]:
        """The workers bank shards go on: those with the shard resources (``carls.placement``)."""
        have = worker_resources(self.client)
        need = resources_for("shard", BANK, have)
        allowed = workers_with(need, have)
        if not allowed:
            raise ConfigError(f"Workbench {self.name!r}: bank shards need workers with resources {need} "
                              f"(carls.placement.shard or carls.placement.names.bank) but no worker advertises "
                              f"them; the workers advertise {dict(sorted(have.items()))}")
        if placement != "colocate":
            return allowed
        home = self.home_worker()
        if home not in allowed:
            raise ConfigError(f"Workbench {self.name!r}: placement 'colocate' puts the shards on the first "
                              f"trainer's worker {home}, which lacks the shard resources {need} "
                              f"(carls.placement.shard); it advertises {have.get(home, {})}. Expected a trainer "
                              "worker that also advertises them, or placement 'spread'")
        return [home]

    # -- loops -------------------------------------------------------------------------------
    def submit_trainer(self, trainer: Trainer, *, workers: Sequence[str] | None = None,
                       primary: bool | None = None) -> LoopHandle:
        """Run ``trainer`` as a long-lived future; returns its handle.

        ``primary`` (default: the first trainer submitted) makes the trainer's published step the
        bank's step and its checkpoints snapshot the bank.
        """
        if not isinstance(trainer, Trainer):
            raise ArgumentTypeError(f"submit_trainer: expected a Trainer, got {type(trainer).__name__}")
        if primary is None:
            primary = not any(h.kind == "trainer" for h in self._loops.values())
        return self._submit(trainer, workers, primary=primary)

    def submit_maker(self, maker: KnowledgeMaker, *, workers: Sequence[str] | None = None) -> LoopHandle:
        """Run ``maker`` as a long-lived future reading ``maker.source``'s versions; returns its handle.

        ``workers`` are preferred, not required: when the maker's worker dies the scheduler runs it
        again on a live worker (up to ``carls.runtime.maker-restarts`` times).
        """
        if not isinstance(maker, KnowledgeMaker):
            raise ArgumentTypeError(f"submit_maker: expected a KnowledgeMaker, got {type(maker).__name__}")
        return self._submit(maker, workers)

    def _source_of(self, maker: KnowledgeMaker) -> str:
        trainers = [h.name for h in self._loops.values() if h.kind == "trainer"]
        if maker.source is not None:
            return maker.source
        if len(trainers) == 1:
            return trainers[0]
        raise ConfigError(f"maker {maker.name!r}: source=None needs exactly one submitted trainer, found "
                          f"{trainers or 'none'}; submit the trainer first or pass source='<trainer name>'")

    def _submit(self, obj: Trainer | KnowledgeMaker, workers: Sequence[str] | None, *,
                primary: bool = False) -> LoopHandle:
        self._life.require(State.RUNNING, action=f"submit {obj.kind} {obj.name!r}")
        if obj.name in self._loops:
            raise ConfigError(f"Workbench {self.name!r}: a loop named {obj.name!r} was already submitted; "
                              "loop names must be unique")
        source = obj.name if isinstance(obj, Trainer) else self._source_of(obj)
        channel = self._channels.get(source)
        if channel is None:
            channel = self._channels[source] = ModelChannel(source, prefix=self.prefix)
            channel.open()
        spec = LoopSpec(
            obj=obj, channel=channel, stop_event=self.stop_event_name, topic=self.topic, bank=self.bank,
            config=config.resolved(), publish_every=int(config.get("runtime.publish-every")),
            poll_interval=self.poll_interval, report_interval=self.report_interval,
            metrics_every=self.metrics_every, checkpoint=self.checkpointer if isinstance(obj, Trainer) else None,
            primary=primary,
        )
        resources = loop_resources(self.client, obj.kind, obj.name)
        first_trainer = isinstance(obj, Trainer) and not any(h.kind == "trainer" for h in self._loops.values())
        if workers is None and first_trainer and self._placement == "colocate":
            workers = [self.home_worker()]
        # a maker only prefers its workers: after its worker died it is run again on a live one
        kwargs = {"pure": False, "resources": resources, "workers": list(workers) if workers else None,
                  "retries": 0, "allow_other_workers": bool(workers) and (isinstance(obj, KnowledgeMaker)
                                                                          or self.checkpointer is not None)}
        future = self.client.submit(run_loop_task, spec, key=f"{obj.kind}-{obj.name}-{self.prefix}", **kwargs)
        handle = LoopHandle(obj.name, obj.kind, future, obj)
        handle.submitted = (spec, kwargs)
        self._loops[obj.name] = handle
        if primary:
            self.book.primary = obj.name  # the bar counts the primary trainer's steps, to its max_steps
            if self._sink is not None and isinstance(obj, Trainer) and obj.max_steps is not None:
                self._sink.set_total(obj.max_steps)
        logger.info("submitted %s %s (resources=%s)", obj.kind, obj.name, resources)
        return handle

    @property
    def loops(self) -> dict[str, LoopHandle]:
        """The submitted loops by name."""
        return dict(self._loops)

    # -- monitoring --------------------------------------------------------------------------
    def _drain(self) -> None:
        from carls_dask.bank.rehoming import rehome_line

        while self._rehomings:
            bank, event = self._rehomings.popleft()
            logger.warning("%s", rehome_line(bank, event))
        while self._events:
            _, msg = self._events.popleft()
            if isinstance(msg, dict) and msg.get("event") == STARTED:
                self._loop_started(msg)
            elif isinstance(msg, dict):
                self.book.update(msg)
                if self._sink is not None and msg.get("kind") == "trainer":
                    self._sink.record()  # a metric row per trainer report

    def _loop_started(self, msg: dict[str, Any]) -> None:
        """A loop task started: when it runs again after a fault, log the fault's one line (what was lost, what
        took over, how long it took)."""
        handle = self._loops.get(str(msg.get("loop")))
        if handle is None or handle.recovering is None:
            return
        t0, line = handle.recovering
        handle.recovering = None
        when = msg.get("time")
        took = (float(when) if isinstance(when, int | float) else time.time()) - t0
        logger.warning("%s; running again on %s %.1fs after the fault", line, msg.get("worker"), max(took, 0.0))

    def _check_lost_workers(self) -> None:
        """React to workers that were removed while running a loop (reports of the Workbench's watch).

        Dask runs a task whose worker died again on a live worker. For a maker that is the restart
        (up to ``carls.runtime.maker-restarts`` times). A trainer is restarted the same way when the
        Workbench has a :attr:`checkpointer`: the new run of its task continues from its newest saved
        state (up to ``carls.runtime.trainer-restarts`` times); without one its model and optimizer
        state died with the worker, so the run fails clearly. Restarts are counted, logged and
        reported as the loop's ``restarts`` metric. Dask itself fails a task whose workers died more
        than ``distributed.scheduler.allowed-failures`` times (``KilledWorker``), which bounds the
        restarts too. The reports come from the Workbench's
        :class:`~carls_dask.runtime.events.WorkerLossWatch` on its own topic.
        """
        while self._loss_reports:
            _, msg = self._loss_reports.popleft()
            report = LostLoops.from_msg(msg)
            if report is None or report.workbench != self.prefix:
                continue
            lost, worker = set(report.keys), report.worker
            for handle in self._loops.values():
                if handle.future is None or str(handle.future.key) not in lost:
                    continue
                if handle.error is not None or handle.life.state in (State.CLOSED, State.FAILED):
                    continue
                limit = self.maker_restarts if handle.kind == "maker" else self.trainer_restarts
                setting = f"carls.runtime.{handle.kind}-restarts"
                restartable = handle.kind == "maker" or self.checkpointer is not None
                if restartable and handle.restarts < limit:
                    handle.restarts += 1
                    start = ""
                    if handle.kind == "trainer":
                        step = self.checkpointer.newest_step(handle.name)
                        start = f" from its state at step {step}" if step is not None else " from its first step"
                    line = (f"{handle.kind} {handle.name}: its worker {worker} died; run again{start} (restart "
                            f"{handle.restarts} of {limit}, {setting})")
                    logger.info("%s", line)
                    handle.recovering = (report.time or time.time(), line)
                    self.book.update({"loop": handle.name, "kind": handle.kind, "restarts": handle.restarts})
                    continue
                if restartable:
                    reason = (f"{handle.kind} {handle.name!r}: its worker {worker} died after {handle.restarts} "
                              f"restarts ({setting} = {limit})")
                else:
                    reason = (f"trainer {handle.name!r}: its worker {worker} died; a trainer is restarted only from "
                              "saved state (give the Workbench a checkpointer, as carls-dask run does) or "
                              "continued with Trainer(resume_from=<a checkpoint>)")
                logger.error("%s", reason)
                self._fail(handle, LifecycleError(reason))  # recorded before the cancel: a wait() sees the failure
                handle.future.cancel()

    def _check_loops(self) -> None:
        self._check_lost_workers()
        with self._cut_lock:  # the monitor thread and wait() both check
            cut = []
            for handle in list(self._loops.values()):
                if handle.error is not None or handle.life.state in (State.CLOSED, State.FAILED):
                    continue
                if handle.future.status == "error":
                    self._fail(handle, handle.future.exception(timeout=self.start_timeout))
                elif handle.future.status == "finished" and handle.future.key not in self._seen_finished:
                    self._seen_finished.add(handle.future.key)
                    result = handle.future.result(timeout=self.start_timeout)
                    if result.reason != ROLLED_BACK:
                        handle.result = result  # read once
                    elif not self._can_cut(handle):
                        self._fail(handle, RolledBackError(f"{handle.kind} {handle.name!r}: {result.value}"))
                    else:
                        cut.append(handle)
            if cut:
                self._cut(cut)

    def _can_cut(self, handle: LoopHandle) -> bool:
        """Whether ``handle``'s loop, ended on a table rolled back with a lost shard, can be run again after a
        consistent cut (the run keeps checkpoints, the bank a store, and the loop has restarts left)."""
        limit = self.maker_restarts if handle.kind == "maker" else self.trainer_restarts
        return (self.bank is not None and self.checkpointer is not None and self.checkpointer.bank_root is not None
                and handle.restarts < limit and handle.submitted is not None and self.state is State.RUNNING)

    def _cut(self, handles: list[LoopHandle]) -> None:
        """Roll the bank's snapshot-kept tables back to the newest checkpoint and run ``handles`` again from it.

        A shard holding tables kept by snapshots alone was lost: its replacement holds them as of the newest
        snapshot and refuses their writes, and the loops that wrote them failed on that. Every shard takes
        those tables back to the snapshot whose step the primary trainer saved a state at (one consistent
        cut), the primary trainer's states past it are dropped, and the failed loops are submitted again: a
        trainer continues from its newest saved state, a maker from the newest model.
        """
        t0 = time.monotonic()
        ckpt = self.checkpointer
        root = str(ckpt.bank_root)
        version, step = newest_cut(root, [st for st, _ in ckpt.states(self.book.primary or handles[0].name)])
        bank = self.the_bank
        tables = snapshot_kept(bank.tables.values())
        bank.rollback(root, -1 if version is None else version, tables)  # -1: empty, before any snapshot
        if self.book.primary:
            drop_states_after(ckpt, self.book.primary, step)
        events = bank.stats()["rehoming"].get("events") or []
        lost = (f"bank shard {events[-1]['shard']} (worker {events[-1]['from']})" if events else "a bank shard")
        when = float(events[-1]["time"]) - float(events[-1]["rehome_s"]) if events else time.time()
        line = cut_line([f"{h.kind} {h.name}" for h in handles], version, step, tables, time.monotonic() - t0,
                        f"{lost} lost")
        logger.info("%s", line)
        for h in handles:
            h.restarts += 1
            spec, kwargs = h.submitted  # type: ignore[misc]
            h.recovering = (when, line)
            h.future = self.client.submit(run_loop_task, spec, key=f"{h.kind}-{h.name}-r{h.restarts}-{self.prefix}",
                                          **kwargs)
            self.book.update({"loop": h.name, "kind": h.kind, "restarts": h.restarts})

    def _fail(self, handle: LoopHandle, exc: BaseException) -> None:
        handle.error = exc
        if handle.life.state is not State.FAILED:
            handle.life.to(State.FAILED)
        if self._failure is None:
            self._failure = (handle.name, exc)
            logger.error("%s %s failed: %r; stopping the other loops", handle.kind, handle.name, exc)
            if self.state in (State.RUNNING, State.STOPPING):
                self._life.to(State.FAILED)
            self._request_stop()

    def _request_stop(self) -> None:
        if self._stop_event is not None:
            try:
                self._stop_event.set()
            except Exception:
                logger.warning("Workbench %s: could not set the stop event", self.name, exc_info=True)

    def _watch(self) -> None:
        interval = max(0.05, min(self.report_interval, 0.5))
        while not self._monitor_stop.wait(interval):
            try:
                self._check_lost_workers()  # before the progress events: a restarted loop's start then finds its fault
                self._drain()
                if self._sink is not None:
                    self._sink.flush()
                self._check_loops()
            except Exception:
                logger.warning("Workbench %s: progress monitor error", self.name, exc_info=True)

    def status(self) -> dict[str, LoopStatus]:
        """The state, future status and newest progress of every loop."""
        self._drain()
        out = {}
        for name, h in self._loops.items():
            fstatus = h.future.status if h.future is not None else "released"
            state = h.life.state.value
            if fstatus == "error" and h.life.state is not State.FAILED:
                state = State.FAILED.value
            elif fstatus == "finished" and h.life.state in (State.RUNNING, State.STOPPING):
                state = State.CLOSED.value
            out[name] = LoopStatus(name, h.kind, state, fstatus, dict(self.book.loops.get(name, {})),
                                   repr(h.error) if h.error is not None else None, h.restarts)
        return out

    def _raise_failure(self, *, again: bool = False) -> None:
        if self._failure is not None and (again or not self._failure_raised):
            name, exc = self._failure
            self._failure_raised = True
            kind = self._loops[name].kind
            raise LoopFailedError(f"{kind} {name!r} failed with {type(exc).__name__}: {exc}; "
                                  "the other loops were stopped") from exc

    # -- waiting, stopping, results -------------------------------------------------------------
    def wait(self, timeout: float | str | None = None) -> None:
        """Block until every trainer has ended (every loop, when no trainer runs).

        ``timeout`` (seconds or a Dask time string) defaults to ``carls.runtime.wait-timeout``.

        Raises
        ------
        LoopFailedError
            When a loop failed; the other loops are stopped first and ``__cause__`` is the
            original exception with its traceback.
        DeadlineExceeded
            When ``timeout`` seconds passed first; the loops keep running.
        """
        self._life.require(State.RUNNING, State.FAILED, action="wait")
        targets = [h for h in self._loops.values() if h.kind == "trainer"] or list(self._loops.values())
        seconds = config.get_seconds("runtime.wait-timeout", timeout)
        deadline = time.monotonic() + seconds
        while True:
            self._check_loops()
            if self._failure is not None:
                self._finish(self.stop_timeout, raise_failure=False)
                self._raise_failure(again=True)
            if all(h.future.done() for h in targets):
                self._check_loops()
                if self._failure is None and all(h.future.done() for h in targets):
                    return
                continue  # a target failed (the branch above stops the others and raises) or runs again after a cut
            if time.monotonic() >= deadline:
                left = [h.name for h in targets if not h.future.done()]
                raise DeadlineExceeded(f"Workbench {self.name!r}: {left} still running after {seconds:g}s "
                                       "(the loops keep running; stop() ends them)")
            time.sleep(0.05)

    def stop(self, timeout: float | str | None = None) -> dict[str, LoopResult]:
        """Ask every loop to stop, wait up to ``timeout`` seconds, and return their results.

        Raises
        ------
        DeadlineExceeded
            When loops did not end in time; they are cancelled and marked failed.
        LoopFailedError
            When a loop failed (now or before); ``__cause__`` is its exception.
        """
        self._life.require(State.RUNNING, State.STOPPING, State.FAILED, action="stop")
        seconds = config.get_seconds("runtime.stop-timeout", timeout)
        results = self._finish(seconds, raise_failure=True)
        self._wrap_up(results)
        return results

    def _wrap_up(self, results: dict[str, LoopResult]) -> None:
        """For a run folder the Workbench keeps itself: snapshot the bank at the primary trainer's last step
        and write ``RUN/result.json`` (once, after the loops ended without failure)."""
        if not self.owns_run or self._wrapped or self._failure is not None or self.run_dir is None:
            return
        self._wrapped = True
        from carls_dask.runtime.results import workbench_result

        primary = self.book.primary or next((n for n, h in self._loops.items() if h.kind == "trainer"), "")
        trainers = [r for r in results.values() if r.kind == "trainer"]
        step = results[primary].step if primary in results else max((r.step for r in trainers), default=0)
        bank_root = self.checkpointer.bank_root if self.checkpointer is not None else None
        if self.bank is not None and bank_root is not None:
            self.checkpointer.snapshot_bank(self.bank, step)
        workbench_result(self.run_dir, results, {n: h.restarts for n, h in self._loops.items()}, primary=primary,
                         started=self._started_at, run_id=self.run_id, bank_root=bank_root)

    def _finish(self, seconds: float, *, raise_failure: bool) -> dict[str, LoopResult]:
        from distributed import wait as dask_wait

        if self.state is State.RUNNING:
            self._life.to(State.STOPPING)
        self._request_stop()
        pending = [h for h in self._loops.values() if h.life.state is State.RUNNING]
        for h in pending:
            h.life.to(State.STOPPING)
        futures = [h.future for h in self._loops.values() if h.life.state is State.STOPPING]
        if futures:
            try:
                dask_wait(futures, timeout=seconds)
            except TimeoutError:
                pass
            except Exception:  # a cancelled future: handled per loop below
                logger.debug("waiting for loops", exc_info=True)
        late = []
        for h in self._loops.values():
            if h.life.state in (State.CLOSED, State.FAILED):
                continue
            if not h.future.done():
                late.append(h.name)
                h.future.cancel()
                h.error = DeadlineExceeded(f"{h.kind} {h.name!r} did not stop within {seconds:g}s")
                h.life.to(State.FAILED)
            elif h.future.status == "error":
                self._fail(h, h.future.exception(timeout=seconds))
            elif h.future.status == "finished":
                if h.result is None:
                    h.result = h.future.result(timeout=seconds)
                if h.result.reason == ROLLED_BACK:  # no cut while stopping: the table it wrote is behind the loop
                    self._fail(h, RolledBackError(f"{h.kind} {h.name!r}: {h.result.value}"))
                    h.result = None
                    continue
                h.life.to(State.CLOSED)
                if h.kind == "trainer":  # its last report may still be on the way: the bar ends complete
                    self.book.update({"loop": h.name, "kind": h.kind, "step": h.result.step})
            else:  # cancelled
                h.error = LifecycleError(f"{h.kind} {h.name!r} was cancelled")
                h.life.to(State.FAILED)
        self._drain()
        if late:
            raise DeadlineExceeded(f"Workbench {self.name!r}: {late} did not stop within {seconds:g}s "
                                   "(carls.runtime.stop-timeout); they were cancelled")
        if raise_failure:
            self._raise_failure()
        return {name: h.result for name, h in self._loops.items() if h.result is not None}

    def results(self) -> dict[str, LoopResult]:
        """The results of the loops that have ended, by name.

        Raises
        ------
        LoopFailedError
            If a loop failed (once; later calls return the results of the others).
        """
        self._check_loops()
        for h in self._loops.values():
            if h.result is None and h.future is not None and h.future.status == "finished":
                h.result = h.future.result()
                if h.life.state in (State.RUNNING, State.STOPPING):
                    h.life.to(State.CLOSED)
        self._raise_failure()
        return {name: h.result for name, h in self._loops.items() if h.result is not None}

    # -- closing ------------------------------------------------------------------------------
    def close(self, timeout: float | str | None = None) -> None:
        """Stop every loop (bounded by ``timeout``), then release the bank, client and cluster.

        Safe to call more than once. Raises what :meth:`stop` raises, after everything was released.
        """
        if self.state is State.CLOSED:
            return
        try:
            if self.state in (State.RUNNING, State.STOPPING, State.FAILED) and self.client is not None:
                results = self._finish(config.get_seconds("runtime.stop-timeout", timeout), raise_failure=True)
                if self._loops:
                    self._wrap_up(results)
        finally:
            try:
                self._write_run_record()
                self._teardown()
            finally:
                self._life.to(State.CLOSED)

    def _unwatch_worker_loss(self) -> None:
        """Unsubscribe from the watch's topic and unregister the watch (best effort: the cluster may be gone)."""
        try:
            self.client.unsubscribe_topic(self.loss_topic)
        except Exception:
            logger.debug("unsubscribe failed", exc_info=True)
        if self._watching:
            self._watching = False
            try:
                self.client.unregister_scheduler_plugin(watch_name(self.prefix))
            except Exception:
                logger.warning("Workbench %s: could not unregister its worker-loss watch", self.name, exc_info=True)

    def _write_run_record(self) -> None:
        if self.run_dir is None:
            return
        record = {
            "name": self.name,
            "started": self._started_at,
            "ended": time.time(),
            "state": "failed" if self._failure is not None else "closed",
            "loops": {n: {"kind": h.kind, "class": h.cls, "state": h.life.state.value,
                          "steps": h.result.steps if h.result is not None else None,
                          "restarts": h.restarts,
                          "error": repr(h.error) if h.error is not None else None}
                      for n, h in self._loops.items()},
            "config": config.resolved(),
        }
        try:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            RunFolder(self.run_dir).run_record.write_text(json.dumps(record, indent=2, default=str))
        except OSError:
            logger.warning("Workbench %s: could not write run.json", self.name, exc_info=True)

    def _teardown(self) -> None:
        self._monitor_stop.set()
        if self._monitor is not None:
            self._monitor.join(timeout=10)
            self._monitor = None
        self._drain()
        if self._sink is not None:
            try:
                self._sink.close()
            except Exception:
                logger.warning("Workbench %s: could not close the progress sink", self.name, exc_info=True)
            self._sink = None
        if self.bank is not None:
            try:
                self.bank.close()
            except Exception:
                logger.warning("Workbench %s: could not close the bank", self.name, exc_info=True)
        if self.client is not None:
            for channel in self._channels.values():
                channel.delete()
            for topic in (self.topic, self._rehome_topic):
                if topic is None:
                    continue
                try:
                    self.client.unsubscribe_topic(topic)
                except Exception:
                    logger.debug("unsubscribe failed", exc_info=True)
            self._unwatch_worker_loss()
        for h in self._loops.values():
            h.future = _Released(h.future)
        if self._own_client and self.client is not None:
            self.client.close(timeout=self.stop_timeout)
        if self._own_cluster and self.cluster is not None:
            self.cluster.close(timeout=self.stop_timeout)


class _Released:
    """Stands in for a loop's future after the Workbench closed (keeps its final status)."""

    def __init__(self, future: Any) -> None:
        self.status = getattr(future, "status", "released")

    def done(self) -> bool:
        return True

    def cancel(self) -> None:
        return None
