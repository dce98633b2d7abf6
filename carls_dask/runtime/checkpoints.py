"""Step-tied checkpoints of a run: bank snapshots and trainer states, saved together, pruned together.

A :class:`Checkpointer` is small and picklable: the Workbench sends it with each trainer to its
worker (the run folder must be on a file system the workers share, as on one machine or a
cluster's shared disk). Every ``every`` steps each trainer saves its
:meth:`~carls_dask.runtime.trainer.Trainer.state` to ``RUN/checkpoints/<trainer>/step-<step>.pt`` and
the primary trainer then snapshots the bank into ``RUN/bank`` at the same step; the ``keep`` newest of
each are kept. The state comes first, so every bank snapshot of a trainer's step has that trainer's state
beside it: the pair is a consistent cut (:mod:`carls_dask.runtime.durability`). A trainer that starts
with a checkpointer continues from its newest saved state, which is how a trainer whose worker died, or a
run resumed with ``carls-dask run --resume``, comes back.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import pathlib
from typing import TYPE_CHECKING, Any

from carls_dask.storage.runfolder import RunFolder, state_file, state_step

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["Checkpointer"]

logger = logging.getLogger(__name__)

@dataclasses.dataclass(frozen=True)
class Checkpointer:
    """Where and how often a run's trainers save their state and the bank is snapshotted.

    Attributes
    ----------
    run_dir
        The run folder.
    every
        Trainer steps between checkpoints (0: only the one at the end).
    keep
        Newest snapshots and trainer states kept.
    bank_root
        The bank store (``RUN/bank``) when the run has a bank, else ``None``.
    """

    run_dir: str
    every: int
    keep: int
    bank_root: str | None = None

    def state_dir(self, trainer: str) -> pathlib.Path:
        """The folder of ``trainer``'s saved states."""
        return RunFolder(self.run_dir).state_dir(trainer)

    def due(self, step: int) -> bool:
        """Whether a checkpoint is due after ``step`` steps."""
        return self.every > 0 and step > 0 and step % self.every == 0

    def snapshot_bank(self, bank: KnowledgeBank, step: int) -> int:
        """Snapshot ``bank`` at ``step`` into :attr:`bank_root` and prune to :attr:`keep`; returns the version."""
        from carls_dask.storage.bankstore import prune_snapshots

        assert self.bank_root is not None
        version = int(bank.snapshot(self.bank_root, int(step)))
        prune_snapshots(self.bank_root, self.keep)
        logger.info("bank snapshot v%d at step %d", version, step)
        return version

    def save(self, trainer: str, step: int, state: Any, bank: KnowledgeBank | None = None) -> None:
        """Save ``state`` of ``trainer`` at ``step``, then snapshot ``bank`` (when given) at the same step; prune
        old ones.

        The state file is written under a temporary name and renamed, so a reader never sees half a file. It
        is written before the snapshot, so a bank snapshot at a trainer's step always has its state beside it.
        """
        import torch

        folder = self.state_dir(trainer)
        folder.mkdir(parents=True, exist_ok=True)
        final = folder / state_file(step)
        tmp = folder / f".{final.name}.tmp"
        torch.save(state, tmp)
        os.replace(tmp, final)
        for old in self.states(trainer)[:-self.keep]:
            old[1].unlink(missing_ok=True)
        if bank is not None and self.bank_root is not None:
            self.snapshot_bank(bank, step)

    def states(self, trainer: str) -> list[tuple[int, pathlib.Path]]:
        """``trainer``'s saved states as ``(step, file)``, oldest first."""
        folder = self.state_dir(trainer)
        if not folder.is_dir():
            return []
        found = []
        for p in folder.iterdir():
            step = state_step(p.name)
            if step is not None:
                found.append((step, p))
        return sorted(found)

    def newest_step(self, trainer: str) -> int | None:
        """The step of ``trainer``'s newest saved state, or ``None``."""
        states = self.states(trainer)
        return states[-1][0] if states else None

    def newest(self, trainer: str) -> dict[str, Any] | None:
        """``trainer``'s newest saved state, or ``None`` when it has none."""
        import torch

        states = self.states(trainer)
        if not states:
            return None
        step, path = states[-1]
        state: dict[str, Any] = torch.load(path, map_location="cpu", weights_only=False)
        logger.info("trainer %s: continuing from its state at step %d (%s)", trainer, step, path)
        return state
