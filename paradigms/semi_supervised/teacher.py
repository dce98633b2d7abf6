"""A graph teacher for the pseudo-label maker: random propagation with consistency regularisation.

The maker's default teacher is the student itself, corrected and smoothed over the graph
(:func:`~carls_dask.paradigms.semi_supervised.pseudo_labels.correct_probabilities`). The graph teacher
is a separate model the maker trains once from the labelled nodes and the graph, in the manner of
GRAND (Feng et al. 2020, arXiv 2005.11079): each step drops whole nodes at random (DropNode), averages
the features propagated over ``0..order`` hops, classifies them with a small MLP, and adds to the
cross-entropy of the labelled nodes a consistency term that pulls the class distributions of several
such random views of every node towards their sharpened mean. The student stays an MLP at inference:
it only distils the teacher's class distributions, which the maker writes to the bank.

The first layer is linear and DropNode scales rows, so ``propagate(dropnode(X)) @ W`` equals
``propagate(dropnode(X @ W))``: the features are projected once per step and only the
``hidden``-wide projections are propagated (the bias is added after propagation).
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import numpy as np

from carls_dask.errors import InvalidShapeError
from carls_dask.paradigms.semi_supervised.pseudo_labels import normalized_adjacency
from carls_dask.runtime.settings import check_settings

__all__ = ["GraphTeacherSettings", "train_graph_teacher"]

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class GraphTeacherSettings:
    """Settings of :func:`train_graph_teacher` (defaults chosen on CiteSeer's validation split).

    Attributes
    ----------
    order
        Hops the graph teacher's propagation averages (0 to order).
    hidden
        Width of the graph teacher's hidden layer.
    dropnode
        Probability that a node's features are dropped in one of the graph teacher's random views.
    views
        Random views per graph-teacher step.
    consistency
        Weight of the graph teacher's consistency term.
    temperature
        Sharpening temperature of the mean distribution of the graph teacher's views.
    dropout
        Dropout of the graph teacher's hidden layer.
    epochs
        Full-graph training steps of the graph teacher; the weights with the best validation accuracy are kept.
    lr
        Learning rate of the graph teacher's Adam optimizer.
    weight_decay
        Weight decay of the graph teacher's Adam optimizer.
    """

    order: int = 2
    hidden: int = 32
    dropnode: float = 0.5
    views: int = 2
    consistency: float = 0.7
    temperature: float = 0.3
    dropout: float = 0.2
    epochs: int = 400
    lr: float = 0.01
    weight_decay: float = 5e-4

    def __post_init__(self) -> None:
        check_settings("graph teacher", (
            (int(self.order) >= 0, f"order {self.order!r}, expected an integer >= 0"),
            (int(self.hidden) >= 1, f"hidden {self.hidden!r}, expected an integer >= 1"),
            (0.0 <= self.dropnode < 1.0, f"dropnode {self.dropnode!r}, expected a value in [0, 1)"),
            (int(self.views) >= 1, f"views {self.views!r}, expected an integer >= 1"),
            (self.consistency >= 0, f"consistency {self.consistency!r}, expected >= 0"),
            (self.temperature > 0, f"temperature {self.temperature!r}, expected > 0"),
            (0.0 <= self.dropout < 1.0, f"dropout {self.dropout!r}, expected a value in [0, 1)"),
            (int(self.epochs) >= 1, f"epochs {self.epochs!r}, expected an integer >= 1"),
            (self.lr > 0, f"lr {self.lr!r}, expected > 0"),
            (self.weight_decay >= 0, f"weight_decay {self.weight_decay!r}, expected >= 0"),
        ))


def _torch_adjacency(edges: np.ndarray, n_nodes: int) -> Any:
    """``D^-1/2 (A + I) D^-1/2`` (:func:`normalized_adjacency` with self loops) as a torch sparse tensor."""
    import torch

    a = normalized_adjacency(edges, n_nodes, self_loops=True).tocoo()
    idx = torch.from_numpy(np.stack([a.row, a.col]).astype(np.int64))
    return torch.sparse_coo_tensor(idx, torch.from_numpy(a.data.astype(np.float32)), (n_nodes, n_nodes),
                                   check_invariants=True).coalesce()


def train_graph_teacher(features: np.ndarray, edges: np.ndarray, train: np.ndarray, labels: np.ndarray,
                        val: np.ndarray, settings: GraphTeacherSettings | None = None, *,
                        seed: int = 0) -> tuple[np.ndarray, dict[str, float]]:
    """Train the graph teacher and return its class probabilities of every node.

    Parameters
    ----------
    features
        ``float32[n, F]`` node features.
    edges
        ``int64[2, m]`` undirected edges.
    train
        ``int64`` labelled-train nodes (their labels are the only ones trained on).
    labels
        ``int64[n]`` labels; only ``labels[train]`` and ``labels[val]`` are read.
    val
        ``int64`` validation nodes: the step with the best accuracy on them gives the returned weights.
    settings
        :class:`GraphTeacherSettings`; the defaults when ``None``.
    seed
        Seed of the initialisation and the random views.

    Returns
    -------
    probs, info
        ``float32[n, C]`` class probabilities (the deterministic full-graph propagation, no node
        dropped) and ``{"val_acc", "best_epoch"}``.

    Raises
    ------
    InvalidShapeError
        When the shapes do not fit together or a node id is out of range.
    """
    import torch
    import torch.nn.functional as F

    s = settings or GraphTeacherSettings()
    x = np.asarray(features, dtype=np.float32)
    if x.ndim != 2:
        raise InvalidShapeError(f"graph teacher: features must be [n, F], got shape {x.shape}")
    n = x.shape[0]
    edges = np.asarray(edges, dtype=np.int64)
    if edges.ndim != 2 or edges.shape[0] != 2 or (edges.size and (edges.min() < 0 or edges.max() >= n)):
        raise InvalidShapeError(f"graph teacher: edges must be [2, m] node ids in [0, {n}), got shape {edges.shape}")
    labels = np.asarray(labels, dtype=np.int64)
    train, val = np.asarray(train, dtype=np.int64), np.asarray(val, dtype=np.int64)
    if labels.shape != (n,) or not len(train) or any(a.size and (a.min() < 0 or a.max() >= n) for a in (train, val)):
        raise InvalidShapeError(f"graph teacher: labels must be [{n}] and train/val non-empty node ids in [0, {n})")
    n_classes = int(labels[np.concatenate([train, val])].max()) + 1
    gen = torch.Generator().manual_seed(int(seed))
    torch.manual_seed(int(seed))
    adj = _torch_adjacency(edges, n)
    xt = torch.from_numpy(x)
    if (x == 0).mean() > 0.9:  # bag-of-words features: project them as a sparse matrix
        xt = xt.to_sparse()
    proj = torch.nn.Linear(x.shape[1], int(s.hidden), bias=False)
    bias = torch.nn.Parameter(torch.zeros(int(s.hidden)))
    head = torch.nn.Linear(int(s.hidden), n_classes)
    params = [*proj.parameters(), bias, *head.parameters()]
    opt = torch.optim.Adam(params, lr=float(s.lr), weight_decay=float(s.weight_decay))
    y_train, y_val = torch.from_numpy(labels[train]), labels[val]
    t_train = torch.from_numpy(train)

    def project() -> Any:
        return torch.sparse.mm(xt, proj.weight.T) if xt.is_sparse else proj(xt)

    def propagate(h: Any) -> Any:
        out = h
        for _ in range(int(s.order)):
            h = torch.sparse.mm(adj, h)
            out = out + h
        return out / (int(s.order) + 1)

    def classify(h: Any, training: bool) -> Any:
        h = torch.relu(propagate(h) + bias)
        return head(F.dropout(h, float(s.dropout), training))

    best: tuple[float, int, np.ndarray | None] = (-1.0, -1, None)
    keep = 1.0 - float(s.dropnode)
    for epoch in range(int(s.epochs)):
        z = project()
        views = []
        for _ in range(int(s.views)):
            mask = torch.bernoulli(torch.full((n, 1), keep), generator=gen) / keep
            views.append(F.log_softmax(classify(z * mask, True), dim=1))
        loss = torch.stack([F.nll_loss(v[t_train], y_train) for v in views]).mean()
        if float(s.consistency) > 0:
            probs = torch.stack([v.exp() for v in views])  # [views, n, C]
            sharp = probs.mean(0).pow(1.0 / float(s.temperature))
            sharp = (sharp / sharp.sum(1, keepdim=True)).detach()
            loss = loss + float(s.consistency) * ((probs - sharp) ** 2).sum(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with torch.no_grad():
            out = torch.softmax(classify(project(), False), dim=1)
        acc = float((out[torch.from_numpy(val)].argmax(1).numpy() == y_val).mean()) if len(val) else 0.0
        if acc >= best[0]:
            best = (acc, epoch, out.numpy().astype(np.float32))
    log.info("graph teacher: best validation accuracy %.4f at epoch %d of %d", best[0], best[1], int(s.epochs))
    assert best[2] is not None
    return best[2], {"val_acc": best[0], "best_epoch": float(best[1])}
