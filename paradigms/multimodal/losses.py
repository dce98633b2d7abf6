"""Losses: contrastive with extra (bank) negatives, and sampled softmax, both with logQ correction.

Pure torch functions; they know nothing of Dask or the bank.
"""

from __future__ import annotations

import torch

from carls_dask.errors import InvalidShapeError

__all__ = ["contrastive_loss", "sampled_softmax_loss"]

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


def sampled_softmax_loss(query: torch.Tensor, true_weights: torch.Tensor, sampled_weights: torch.Tensor,
                         true_logq: torch.Tensor, sampled_logq: torch.Tensor, accidental: torch.Tensor,
                         scale: float = 1.0) -> torch.Tensor:
    """Sampled softmax (Jean et al. 2015) over the true class and shared sampled classes.

    Parameters
    ----------
    query
        ``[B, d]`` inputs' embeddings.
    true_weights
        ``[B, d]`` the embedding of each input's class.
    sampled_weights
        ``[S, d]`` embeddings of the sampled classes.
    true_logq, sampled_logq
        log expected counts of the true classes ``[B]`` and of the sampled ones ``[S]``.
    accidental
        ``bool[B, S]``: True where a sampled class is the input's own class (removed).
    scale
        Logit scale.
    """
    true_logit = scale * (query * true_weights).sum(-1) - true_logq
    sampled = scale * query @ sampled_weights.T - sampled_logq
    sampled = sampled.masked_fill(accidental, _NEG_INF)
    logits = torch.cat([true_logit[:, None], sampled], dim=1)
    return torch.nn.functional.cross_entropy(logits, torch.zeros(query.shape[0], dtype=torch.long,
                                                                 device=query.device))
