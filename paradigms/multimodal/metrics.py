"""Retrieval metrics."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["recall_at_k", "retrieval_report"]


def recall_at_k(scores: np.ndarray, ks: Sequence[int] = (1, 5)) -> dict[int, float]:
    """Recall@k of a square score matrix whose right answer for row ``i`` is column ``i``.

    Ties count against the query (a right answer tied with a wrong one is ranked after it).
    """
    s = np.asarray(scores, dtype=np.float64)
    right = np.diag(s)
    rank = (s > right[:, None]).sum(1) + (s == right[:, None]).sum(1) - 1
    return {k: float((rank < k).mean()) for k in ks}


def retrieval_report(image_emb: np.ndarray, text_emb: np.ndarray, ks: Sequence[int] = (1, 5)) -> dict[str, float]:
    """``i2t_r@k`` and ``t2i_r@k`` for paired unit-norm embeddings (row ``i`` of each is a pair)."""
    s = np.asarray(image_emb) @ np.asarray(text_emb).T
    out = {f"i2t_r@{k}": v for k, v in recall_at_k(s, ks).items()}
    out.update({f"t2i_r@{k}": v for k, v in recall_at_k(s.T, ks).items()})
    return out
