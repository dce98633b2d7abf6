"""A PyTorch batch sampler that follows a pacing function over the bank's current difficulty scores."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
from torch.utils.data import Sampler

from carls_dask.errors import ConfigError, InvalidShapeError
from carls_dask.paradigms.curriculum.pacing import FractionPacing, Pacing
from carls_dask.storage.runfolder import ADMITTED_FRACTION, PACING, SAMPLED_FRACTION

__all__ = ["CurriculumSampler"]


class CurriculumSampler(Sampler[list[int]]):
    """Yields batches of example indices drawn uniformly from the examples the pacing admits.

    Use it as a ``batch_sampler`` of a :class:`torch.utils.data.DataLoader` (with ``num_workers=0``,
    so that score and step updates reach it at once). It never ends: a trainer takes one batch
    per step. Between batches the trainer calls :meth:`set_step` and, when new scores arrive,
    :meth:`set_difficulty`; examples with weight 0 (:meth:`set_excluded`) are never drawn.

    Parameters
    ----------
    n
        Number of training examples.
    batch_size
        Examples per batch (drawn without replacement while the admitted set is large enough).
    pacing
        The pacing function.
    seed
        Seed of the draws; equal seeds, steps and scores give equal batches.

    Attributes
    ----------
    last
        What the last batch realised: ``pacing`` (planned fraction), ``admitted_fraction``,
        ``sampled_fraction`` (distinct examples drawn so far / n) and ``batch_rank`` (mean difficulty
        percentile of the batch among the scored examples, 0 = easiest; NaN before any scores).
    """

    def __init__(self, n: int, batch_size: int, pacing: Pacing, seed: int = 0) -> None:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"CurriculumSampler: n={n!r}; expected a positive number of examples")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"CurriculumSampler: batch_size={batch_size!r}; expected a positive int")
        if not isinstance(pacing, Pacing):
            raise ConfigError(f"CurriculumSampler: pacing must be a Pacing, got {type(pacing).__name__}")
        self.n = n
        self.batch_size = batch_size
        self.pacing = pacing
        self.step = 0
        self.rng = np.random.default_rng(seed)
        self.difficulty = np.full(n, np.nan, dtype=np.float64)
        self.rank = np.full(n, np.nan, dtype=np.float64)
        self.excluded = np.zeros(n, dtype=bool)
        self.groups: np.ndarray | None = None
        self.limit = 1.0
        self.seen = np.zeros(n, dtype=bool)
        self.last: dict[str, float] = {}
        self._order: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None

    def set_step(self, step: int) -> None:
        """The trainer step the next batch is for."""
        self.step = int(step)

    def set_difficulty(self, difficulty: np.ndarray) -> None:
        """New scores, ``float[n]`` (NaN for examples not scored yet)."""
        d = np.asarray(difficulty, dtype=np.float64)
        if d.shape != (self.n,):
            raise InvalidShapeError(f"CurriculumSampler.set_difficulty: got shape {d.shape}; expected ({self.n},)")
        self.difficulty = d.copy()
        finite = np.isfinite(d)
        self.rank = np.full(self.n, np.nan)
        if finite.any():
            order = np.argsort(np.where(finite, d, np.inf), kind="stable")
            k = int(finite.sum())
            self.rank[order[:k]] = np.arange(k) / max(k - 1, 1)
        self._order = None

    def set_excluded(self, excluded: np.ndarray) -> None:
        """``bool[n]``: examples never to draw (e.g. loss weight 0)."""
        e = np.asarray(excluded, dtype=bool)
        if e.shape != (self.n,):
            raise InvalidShapeError(f"CurriculumSampler.set_excluded: got shape {e.shape}; expected ({self.n},)")
        self.excluded = e.copy()

    def set_groups(self, groups: np.ndarray | None) -> None:
        """``int[n]`` group of every example (e.g. its label): the pacing then admits the easiest share
        of each group, so a curriculum keeps every class; ``None`` ranks all examples together."""
        if groups is None:
            self.groups = None
            return
        g = np.asarray(groups)
        if g.shape != (self.n,) or g.dtype.kind not in "iu":
            raise InvalidShapeError(f"CurriculumSampler.set_groups: got {g.dtype}{list(g.shape)}; expected int[{self.n}]")
        self.groups = g.astype(np.int64)
        self._order = None

    def set_limit(self, limit: float) -> None:
        """Admit at most the easiest ``limit`` share of each group, whatever the pacing plans (small-loss
        selection: e.g. ``1 -`` the estimated noise rate). Applies once scores exist and the warm-up is over."""
        if not 0.0 < float(limit) <= 1.0:
            raise ConfigError(f"CurriculumSampler.set_limit: limit={limit!r}; expected a fraction in (0, 1]")
        self.limit = float(limit)

    def _ranks(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per example: its group's index and its rank (0 = easiest) within the group; and the group sizes.

        Ties are broken by index and unscored examples rank last, as in the pacing's own ordering.
        """
        if self._order is None:
            groups = np.zeros(self.n, dtype=np.int64) if self.groups is None else self.groups
            _, gi, sizes = np.unique(groups, return_inverse=True, return_counts=True)
            gi = gi.reshape(-1)
            order = np.argsort(np.where(np.isfinite(self.difficulty), self.difficulty, np.inf), kind="stable")
            rank = np.empty(self.n, dtype=np.int64)
            g_sorted = gi[order]
            for g in range(sizes.shape[0]):
                members = order[g_sorted == g]
                rank[members] = np.arange(members.shape[0])
            self._order = (gi, rank, sizes)
        return self._order

    def _easiest_share(self, share: float) -> np.ndarray:
        gi, rank, sizes = self._ranks()
        counts = np.maximum(1, np.ceil(share * sizes - 1e-9)).astype(np.int64)
        out: np.ndarray = rank < counts[gi]
        return out

    def admitted(self) -> np.ndarray:
        """``bool[n]``: the examples the pacing admits at the current step, less the excluded ones."""
        p = self.pacing
        scored = bool(np.isfinite(self.difficulty).any())
        paced = scored and self.step >= p.warmup_steps
        if isinstance(p, FractionPacing) and p.schedule != "uniform":
            # the easiest share of each group, from ranks computed once per set of scores
            mask = (self._easiest_share(min(p.planned(self.step), self.limit)) if paced
                    else np.ones(self.n, dtype=bool))
        else:
            if self.groups is None:
                mask = p.admit(self.difficulty, self.step)
            else:
                mask = np.zeros(self.n, dtype=bool)
                for g in np.unique(self.groups):
                    members = np.flatnonzero(self.groups == g)
                    mask[members] = p.admit(self.difficulty[members], self.step)
            if paced and self.limit < 1.0:
                mask &= self._easiest_share(self.limit)
        mask &= ~self.excluded
        if not mask.any():  # everything admitted is excluded: fall back to what is not excluded
            mask = ~self.excluded if (~self.excluded).any() else np.ones(self.n, dtype=bool)
        return mask

    def next_batch(self) -> np.ndarray:
        """Draw one batch (``int64[batch_size]``) and record what it realised in :attr:`last`."""
        mask = self.admitted()
        pool = np.flatnonzero(mask)
        batch = self.rng.choice(pool, size=self.batch_size, replace=pool.size < self.batch_size)
        self.seen[batch] = True
        ranks = self.rank[batch]
        self.last = {
            PACING: self.pacing.planned(self.step),
            ADMITTED_FRACTION: float(pool.size / self.n),
            SAMPLED_FRACTION: float(self.seen.mean()),
            "batch_rank": float(np.nanmean(ranks)) if np.isfinite(ranks).any() else float("nan"),
        }
        return batch.astype(np.int64)

    def __iter__(self) -> Iterator[list[int]]:
        while True:
            yield self.next_batch().tolist()

    def state_dict(self) -> dict[str, Any]:
        """What :meth:`load_state_dict` needs to continue with the same draws."""
        return {"step": self.step, "rng": self.rng.bit_generator.state, "seen": self.seen.copy(),
                "difficulty": self.difficulty.copy(), "excluded": self.excluded.copy(),
                "groups": None if self.groups is None else self.groups.copy(), "limit": self.limit}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a :meth:`state_dict`."""
        self.step = int(state["step"])
        self.rng.bit_generator.state = state["rng"]
        self.seen = np.asarray(state["seen"], dtype=bool).copy()
        self.set_difficulty(state["difficulty"])
        self.set_excluded(state["excluded"])
        self.set_groups(state.get("groups"))
        self.set_limit(float(state.get("limit", 1.0)))
