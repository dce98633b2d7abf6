"""The project's exception hierarchy: every error carls-dask raises is one of these classes.

It is a leaf module (it imports nothing of the project), so every layer, ``carls_dask.storage``
included, raises and catches the same types from this one place.

Every class but :class:`RunInterrupted` (a Ctrl-C, not an error) derives from :class:`CarlsError`
and, where it refines a builtin, from that builtin too, so ``except ValueError`` keeps working for
callers that do not know this project.
``tests/test_errors.py`` walks every ``raise`` of the library and fails on one of a class outside
this tree (a re-raise of a caught exception excepted).
"""

from __future__ import annotations

import pathlib

__all__ = [
    "ArgumentTypeError",
    "BankError",
    "CarlsError",
    "ConfigError",
    "ConsumerDetached",
    "CorruptStoreError",
    "DeadlineExceeded",
    "DiskReserveError",
    "HookNotImplementedError",
    "IncompatibleStoreError",
    "InvalidArgumentError",
    "InvalidBatchError",
    "InvalidDTypeError",
    "InvalidShapeError",
    "LifecycleError",
    "LoaderClosed",
    "LoaderError",
    "LoopFailedError",
    "MissingKeyError",
    "ProducerLost",
    "ReportError",
    "RolledBackError",
    "RowIndexError",
    "RunInterrupted",
    "RunStopped",
    "ShardLostError",
    "ShardUnreachableError",
    "StoreError",
    "StoreLockedError",
    "StoreNotFoundError",
    "UnknownAttributeError",
    "UnknownColumnError",
    "UnknownTableError",
]


class CarlsError(Exception):
    """Root of every error raised by carls-dask."""


class ConfigError(CarlsError, ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


class InvalidArgumentError(CarlsError, ValueError):
    """An argument's value is out of range or does not fit the others given with it."""


class ArgumentTypeError(CarlsError, TypeError):
    """An argument, or what a user's hook returned, is of a type the call cannot take."""


class MissingKeyError(CarlsError, KeyError):
    """A mapping given to a call lacks keys the call needs."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class UnknownAttributeError(CarlsError, AttributeError):
    """A package of the project has no attribute of that name."""


class HookNotImplementedError(CarlsError, NotImplementedError):
    """A subclass left a hook of its base class (a trainer's ``step``, a view's ``update``, ...) unimplemented."""


class BankError(CarlsError):
    """Base class for knowledge-bank errors."""


class InvalidBatchError(BankError, ValueError):
    """A batch's values are unusable (empty, NaN/Inf, keys out of range, ...)."""


class InvalidShapeError(InvalidBatchError):
    """A batch has the wrong shape for the table or column it targets."""


class InvalidDTypeError(BankError, TypeError):
    """A batch has a dtype that cannot be safely cast to the column's dtype."""


class UnknownTableError(BankError, KeyError):
    """A table name that the bank does not hold."""

    def __str__(self) -> str:  # KeyError quotes its argument; keep the message readable
        return str(self.args[0]) if self.args else ""


class UnknownColumnError(BankError, KeyError):
    """A column name that the table does not hold."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class RowIndexError(BankError, IndexError):
    """Rows asked of a bank's row store lie outside it, or are not a row selection it takes."""


class ShardLostError(BankError, RuntimeError):
    """A bank shard's worker went away and the shard could not be reached."""


class ShardUnreachableError(ShardLostError, OSError):
    """The connection to a bank shard's worker broke (an ``OSError``, as distributed raises it)."""


class StoreError(CarlsError, OSError):
    """Base class for persistence errors."""


class StoreNotFoundError(StoreError, FileNotFoundError):
    """No store (or no snapshot) at the given path."""


class CorruptStoreError(StoreError, ValueError):
    """A store exists but its contents do not match its manifest."""


class IncompatibleStoreError(StoreError, ValueError):
    """A store was written by an incompatible format version or with other dimensions."""


class StoreLockedError(StoreError, PermissionError):
    """Another writer holds the store (or the shard within it)."""


class LifecycleError(CarlsError, RuntimeError):
    """An operation is not allowed in the object's current lifecycle state."""


class LoopFailedError(CarlsError, RuntimeError):
    """A trainer or knowledge-maker loop raised; the original exception is the ``__cause__``."""


class DeadlineExceeded(CarlsError, TimeoutError):
    """A bounded wait ran past its deadline."""


class DiskReserveError(StoreError):
    """A bank write would take the free space of the store's disk below ``carls.storage.disk-reserve``;
    it was refused before anything was written."""


class RolledBackError(BankError, RuntimeError):
    """A table kept by snapshots alone (durability ``"snapshot"``) was rolled back to its newest snapshot when
    its shard was lost; it takes no writes until its writers roll back to the same step (one consistent cut)."""


class RunStopped(CarlsError, RuntimeError):
    """A run stopped cleanly before its end (e.g. the disk reached its reserve); its newest checkpoint is kept.

    Attributes
    ----------
    run_dir
        The run folder.
    step
        The primary trainer's step when the run stopped.
    checkpoint
        The step of the newest checkpoint kept, or ``None``.
    """

    def __init__(self, message: str, run_dir: object = None, step: int = 0, checkpoint: int | None = None) -> None:
        super().__init__(message)
        self.run_dir = run_dir
        self.step = int(step)
        self.checkpoint = checkpoint


class ReportError(CarlsError, RuntimeError):
    """A static report could not be built as a self-contained page."""


class LoaderError(CarlsError, RuntimeError):
    """A shared loader (:mod:`carls_dask.loading.shared`) could not deliver what was asked."""


class ProducerLost(LoaderError):
    """The loader's producer died, stopped beating or failed."""


class ConsumerDetached(LoaderError):
    """This consumer fell ``slots`` epochs behind a faster one and was detached (its epoch was overwritten)."""


class LoaderClosed(LoaderError):
    """The producer closed the loader; no further epochs come."""


class RunInterrupted(KeyboardInterrupt):
    """A run stopped by Ctrl-C (SIGINT): the step it reached and the checkpoint ``--resume`` continues from.

    A :class:`KeyboardInterrupt` and no :class:`CarlsError` (so no ``except Exception`` swallows it):
    code that stops on Ctrl-C still does; ``str()`` is the one line ``carls-dask`` prints.

    Attributes
    ----------
    run_dir
        The run folder, or ``None`` for a run without one.
    step
        The primary trainer's step when the run stopped.
    checkpoint
        The step of the newest checkpoint kept in the folder, or ``None`` when there is none.
    command
        The ``carls-dask`` command as the user can type it, for the resume line.
    """

    def __init__(self, run_dir: pathlib.Path | None, step: int, checkpoint: int | None,
                 command: str = "carls-dask") -> None:
        super().__init__(run_dir, step, checkpoint, command)
        self.run_dir = run_dir
        self.step = int(step)
        self.checkpoint = checkpoint
        self.command = command

    def __str__(self) -> str:
        if self.run_dir is None:
            return f"interrupted at step {self.step}; the run had no run folder, so nothing was kept"
        if self.checkpoint is None:
            return (f"interrupted at step {self.step}, before the first checkpoint (carls.run.snapshot-every); "
                    f"{self.run_dir} cannot be resumed: start the run again")
        return (f"interrupted at step {self.step}; checkpoint at step {self.checkpoint} kept in {self.run_dir}; "
                f"continue with: {self.command} run --resume {self.run_dir}")
