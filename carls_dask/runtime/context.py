"""What a running loop sees: its :class:`LoopContext`, and the results loops return."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from carls_dask.errors import HookNotImplementedError, LifecycleError
from carls_dask.runtime.channel import ModelChannelLike

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["LoopContext", "LoopResult", "LoopSettings", "MakerRound", "StopControl", "ThreadStop", "pick_device"]


def pick_device() -> str:
    """``"cuda"`` when :func:`torch.cuda.is_available`, else ``"cpu"``, for loops run in this process.

    Loops a Workbench runs on workers get a device of their own instead: ``"cuda:<i>"``, the
    worker process's CUDA devices taken round-robin (:func:`~carls_dask.runtime.placement.device_for`).
    """
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


class StopControl:
    """How a loop learns it should stop. Subclasses back it with a thread or a Dask event."""

    def stop_requested(self) -> bool:
        """True once a stop was asked for. Cheap enough to call every step."""
        raise HookNotImplementedError(f"{type(self).__name__} must implement stop_requested()")

    def wait(self, seconds: float) -> bool:
        """Sleep up to ``seconds``, waking early on a stop; return :meth:`stop_requested`."""
        raise HookNotImplementedError(f"{type(self).__name__} must implement wait()")


class ThreadStop(StopControl):
    """A :class:`StopControl` backed by a :class:`threading.Event` (loops run in-process)."""

    def __init__(self, event: threading.Event | None = None) -> None:
        self.event = event if event is not None else threading.Event()

    def stop_requested(self) -> bool:
        return self.event.is_set()

    def wait(self, seconds: float) -> bool:
        return self.event.wait(max(0.0, seconds))

    def set(self) -> None:
        """Ask the loop to stop."""
        self.event.set()


@dataclasses.dataclass(kw_only=True)
class LoopSettings:
    """How a loop runs: the one description the Workbench sends with a loop and the loop then sees.

    :class:`~carls_dask.runtime.tasks.LoopSpec` (what a Workbench submits) and :class:`LoopContext`
    (what the hooks see) both are these settings plus what is their own; :meth:`loop_settings` gives
    them over from one to the other.

    Attributes
    ----------
    bank
        The knowledge bank the Workbench created, or ``None``.
    config
        The resolved ``carls`` configuration namespace.
    publish_every
        Trainer steps between published versions.
    poll_interval
        Seconds between a maker's checks for a new version.
    report_interval
        Seconds between a maker's progress reports while it waits (trainers report by step).
    metrics_every
        Trainer steps between progress reports (also after every evaluation).
    checkpoint
        The run's :class:`~carls_dask.runtime.checkpoints.Checkpointer`, or ``None``: a trainer then
        saves no state and starts from ``resume_from``.
    primary
        Whether this is the run's primary trainer: its published step becomes the bank's step, and
        it snapshots the bank with its checkpoints.
    """

    bank: KnowledgeBank | None = None
    config: dict[str, Any] = dataclasses.field(default_factory=dict)
    publish_every: int = 50
    poll_interval: float = 0.5
    report_interval: float = 0.5
    metrics_every: int = 10
    checkpoint: Any = None
    primary: bool = False

    @property
    def the_bank(self) -> KnowledgeBank:
        """The bank, for a loop that needs one (raises :class:`~carls_dask.errors.LifecycleError` when it runs
        without)."""
        if self.bank is None:
            raise LifecycleError(f"{type(self).__name__}: this loop runs without a knowledge bank; expected one "
                                 "(give the Workbench or the runner tables, or use ctx.bank, which may be None)")
        return self.bank

    def loop_settings(self) -> dict[str, Any]:
        """These settings by name (no copies: the bank handle and config are passed on as they are)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(LoopSettings)}


@dataclasses.dataclass
class LoopContext(LoopSettings):
    """Everything a trainer's or maker's hooks may use while it runs: the :class:`LoopSettings` (keywords
    only) and the following.

    Attributes
    ----------
    name
        The loop's name (the trainer's or maker's ``name``).
    kind
        ``"trainer"`` or ``"maker"``.
    device
        Torch device string the loop should use: on a worker ``"cuda:<i>"`` (loops of one worker
        process take its CUDA devices round-robin) where CUDA is available, else ``"cpu"``.
    channel
        The model channel: trainers publish to it, makers read the newest version from it.
    stop
        The loop's stop control.
    report
        Sends a dict of numbers to the Workbench's progress display and metric store.
    """

    name: str
    kind: str
    device: str
    channel: ModelChannelLike
    stop: StopControl
    report: Callable[[Mapping[str, float]], None] = lambda values: None


@dataclasses.dataclass(frozen=True)
class MakerRound:
    """One round of a knowledge maker: the version it used and how stale that version was.

    Attributes
    ----------
    version
        The channel version number the round used.
    model_step
        The trainer step of that version.
    staleness
        Seconds from the version's publication until the round finished writing its knowledge.
    seconds
        How long the round took (load + make).
    """

    version: int
    model_step: int
    staleness: float
    seconds: float


@dataclasses.dataclass
class LoopResult:
    """What a loop's future returns.

    Attributes
    ----------
    name, kind
        The loop's name and kind (``"trainer"`` or ``"maker"``).
    steps
        Trainer steps taken, or maker rounds made.
    elapsed
        Seconds the loop ran (after set-up).
    reason
        Why it ended: ``"max_steps"``, ``"max_rounds"``, ``"stopped"``, or :data:`ROLLED_BACK` (a table it wrote
        was rolled back with a lost bank shard; ``value`` says which; the Workbench runs it again after the cut).
    published
        For trainers: the records of the versions it published.
    rounds
        For makers: one :class:`MakerRound` per model version it used.
    metrics
        The last value of every metric the hooks returned.
    value
        What the ``finish`` hook returned.
    state
        The ``state`` hook's checkpoint at the end, when the loop keeps one.
    step
        For trainers: the step the loop ended at.
    resumed_at
        For trainers: the step of the saved state it started from, or ``None`` when it started afresh.
    final_published
        For trainers: the version published when the loop ended, if it was not published just before.
    """

    name: str
    kind: str
    steps: int = 0
    elapsed: float = 0.0
    reason: str = ""
    published: list[Any] = dataclasses.field(default_factory=list)
    rounds: list[MakerRound] = dataclasses.field(default_factory=list)
    metrics: dict[str, float] = dataclasses.field(default_factory=dict)
    value: Any = None
    state: dict[str, Any] | None = None
    step: int = 0
    resumed_at: int | None = None
    final_published: Any = None

    @property
    def versions(self) -> list[int]:
        """Channel version numbers published (trainers) or used (makers), in order."""
        if self.kind == "trainer":
            return [int(v.version) for v in self.published]
        return [r.version for r in self.rounds]


def monotonic() -> float:
    """Indirection over :func:`time.monotonic` (one place to read the clock)."""
    return time.monotonic()
