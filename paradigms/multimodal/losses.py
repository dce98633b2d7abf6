"""The contrastive loss with extra (bank) negatives and logQ correction (the concept classifier's sampled
softmax is :func:`carls_dask.nn.sampled_softmax_loss`).

A pure torch function; it knows nothing of Dask or the bank.
"""

from __future__ import annotations

import torch

from carls_dask.errors import InvalidShapeError

__all__ = ["contrastive_loss"]

_NEG_INF = -1e9


def contrastive_loss(query: torch.Tensor, positives: torch.Tensor, scale: torch.Tensor | float,
                     negatives: torch.Tensor | None = None, neg_logq: torch.Tensor | None = None,
                     neg_mask: torch.Tensor | None = None, batch_mask: torch.Tensor | None = None) -> torch.Tensor:
    """InfoNCE of ``query[i]`` against its ``positives[i]``, the other in-batch positives and extra negatives.

    Parameters
    ----------
    query, positives
        ``[B, d]`` unit-norm embeddings; row ``i`` of each is a pair.
    scale
        Logit scale (1 / temperature).
    negatives
        Extra negatives: ``[N, d]`` shared by every query (e.g. sampled from the bank) or
        ``[B, K, d]`` per query (e.g. each query's top-k hard negatives).
    neg_logq
        log of the expected count of each extra negative (``[N]`` or ``[B, K]``), subtracted from
        its logit (logQ correction of sampled softmax); ``None`` for no correction.
    neg_mask
        ``bool`` ``[B, N]`` or ``[B, K]``: True where an extra negative is really the query's positive
        (an accidental hit); those logits are removed.
    batch_mask
        ``bool[B, B]``: True where in-batch positive ``j`` must not count as a negative of query
        ``i`` (e.g. a variant of the same concept); the diagonal is never masked.
    """
    if query.ndim != 2 or positives.shape != query.shape:
        raise InvalidShapeError(f"contrastive_loss: query {tuple(query.shape)} and positives "
                                f"{tuple(positives.shape)}; expected two equal [B, d] shapes")
    logits = scale * query @ positives.T
    if batch_mask is not None:
        off = batch_mask & ~torch.eye(query.shape[0], dtype=torch.bool, device=query.device)
        logits = logits.masked_fill(off, _NEG_INF)
    if negatives is not None:
        if negatives.ndim == 2:
            extra = scale * query @ negatives.T
        elif negatives.ndim == 3 and negatives.shape[0] == query.shape[0]:
            extra = scale * torch.einsum("bd,bkd->bk", query, negatives)
        else:
            raise InvalidShapeError(f"contrastive_loss: negatives {tuple(negatives.shape)}; expected [N, d] or "
                                    f"[{query.shape[0]}, K, d]")
        if neg_logq is not None:
            extra = extra - neg_logq
        if neg_mask is not None:
            extra = extra.masked_fill(neg_mask, _NEG_INF)
        logits = torch.cat([logits, extra], dim=1)
    target = torch.arange(query.shape[0], device=query.device)
    return torch.nn.functional.cross_entropy(logits, target)
