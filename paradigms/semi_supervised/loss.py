"""The graph-regularization term and the pseudo-label term of the loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from carls_dask.errors import ConfigError

__all__ = ["DISTANCES", "graph_regularization", "pseudo_label_loss", "soft_target_loss"]

DISTANCES = ("kl", "l2")


def graph_regularization(
    logits: torch.Tensor, neighbour_logits: torch.Tensor, weights: torch.Tensor, distance: str = "kl"
) -> torch.Tensor:
    """Weighted distance between each node's output and its neighbours' outputs.

    Per node, the distances to its ``K`` neighbours are averaged with the slot weights; the result
    is the mean over the nodes that have at least one weighted neighbour (0 when none has), so the
    term does not grow with ``K``.

    Parameters
    ----------
    logits
        ``[B, C]`` the trainer's logits for its batch (carries the gradient).
    neighbour_logits
        ``[B, K, C]`` logits of each node's neighbours (from the bank, or a fresh forward pass).
    weights
        ``[B, K]`` slot weights; 0 marks an empty or unknown neighbour.
    distance
        ``"kl"``: KL(softmax(neighbour) || softmax(node)); ``"l2"``: squared distance of the
        probability vectors.
    """
    if logits.ndim != 2 or neighbour_logits.shape[:1] != logits.shape[:1] or neighbour_logits.shape[2:] != logits.shape[1:]:
        raise ConfigError(
            f"graph_regularization: logits {tuple(logits.shape)} and neighbour_logits "
            f"{tuple(neighbour_logits.shape)} must be [B, C] and [B, K, C]"
        )
    if weights.shape != neighbour_logits.shape[:2]:
        raise ConfigError(f"graph_regularization: weights {tuple(weights.shape)}, expected {tuple(neighbour_logits.shape[:2])}")
    if distance not in DISTANCES:
        raise ConfigError(f"graph_regularization: distance {distance!r}, expected one of {DISTANCES}")
    total = weights.sum(1)
    has = total > 0
    if not bool(has.any()):
        return logits.new_zeros(())
    log_p = F.log_softmax(logits, dim=-1)  # [B, C]
    # the neighbours' softmax by hand: F.log_softmax over a last axis of a few classes on [B, K, C]
    # is several times slower than these element-wise steps, and this part is the one that grows with K
    z = neighbour_logits - neighbour_logits.amax(-1, keepdim=True)
    e = z.exp()
    s = e.sum(-1, keepdim=True)
    wq = weights.unsqueeze(-1) * (e / s)  # [B, K, C] slot-weighted neighbour distributions
    if distance == "kl":
        # sum_k w_k KL(q_k || p) = sum_k w_k sum_c q_k log q_k - sum_c (sum_k w_k q_k) log p: only a
        # [B, C] product touches the node's own output
        weighted = (wq * (z - s.log())).sum((1, 2)) - (wq.sum(1) * log_p).sum(-1)
    else:
        # sum_k w_k |p - q_k|^2 = W |p|^2 - 2 p . (sum_k w_k q_k) + sum_k w_k |q_k|^2
        p = log_p.exp()
        weighted = total * p.pow(2).sum(-1) - 2 * (p * wq.sum(1)).sum(-1) + (wq * (e / s)).sum((1, 2))
    return (weighted[has] / total[has]).mean()


def pseudo_label_loss(logits: torch.Tensor, labels: torch.Tensor, confidence: torch.Tensor) -> torch.Tensor:
    """Confidence-weighted cross-entropy on pseudo-labelled nodes; rows with ``labels < 0`` are ignored."""
    mask = labels >= 0
    if not bool(mask.any()):
        return logits.new_zeros(())
    ce = F.cross_entropy(logits[mask], labels[mask], reduction="none")
    w = confidence[mask]
    return (w * ce).sum() / w.sum().clamp_min(1e-12)


def soft_target_loss(logits: torch.Tensor, targets: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """Weighted cross-entropy against soft targets (distillation); rows of weight 0 are ignored.

    ``sum_i w_i * (-sum_c t_ic log softmax(logits)_ic) / sum_i w_i``: the KL divergence to the
    targets up to their (constant) entropy.

    Parameters
    ----------
    logits
        ``[B, C]`` the model's logits.
    targets
        ``[B, C]`` class distributions (rows of a node without a target are ignored through ``weights``).
    weights
        ``[B]`` per-node weights, 0 for nodes without a target.
    """
    if logits.ndim != 2 or targets.shape != logits.shape or weights.shape != logits.shape[:1]:
        raise ConfigError(
            f"soft_target_loss: logits {tuple(logits.shape)}, targets {tuple(targets.shape)} and weights "
            f"{tuple(weights.shape)} must be [B, C], [B, C] and [B]"
        )
    mask = weights > 0
    if not bool(mask.any()):
        return logits.new_zeros(())
    ce = -(targets[mask] * F.log_softmax(logits[mask], dim=-1)).sum(-1)
    w = weights[mask]
    return (w * ce).sum() / w.sum().clamp_min(1e-12)
