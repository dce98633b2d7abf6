"""The project's exception hierarchy: every error carls-dask raises is one of these classes.

It is a leaf module (it imports nothing of the project), so every layer, ``carls_dask.storage``
included, raises and catches the same types from this one place.

Every class derives from :class:`CarlsError` and, where it refines a builtin, from that builtin
too, so ``except ValueError`` keeps working for callers that do not know this project.
"""

from __future__ import annotations

__all__ = [
    "BankError",
    "CarlsError",
    "ConfigError",
    "CorruptStoreError",
    "DeadlineExceeded",
    "DiskReserveError",
    "IncompatibleStoreError",
    "InvalidBatchError",
    "InvalidDTypeError",
    "InvalidShapeError",
    "LifecycleError",
    "LoopFailedError",
    "RolledBackError",
    "RunStopped",
    "ShardLostError",
    "StoreError",
    "StoreLockedError",
    "StoreNotFoundError",
    "UnknownColumnError",
    "UnknownTableError",
]


class CarlsError(Exception):
    """Root of every error raised by carls-dask."""


class ConfigError(CarlsError, ValueError):
    """A configuration value is missing, of the wrong type or out of range."""


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


class ShardLostError(BankError, RuntimeError):
    """A bank shard's worker went away and the shard could not be reached."""


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
