"""How node embeddings are judged, as the literature does (pure NumPy and scikit-learn).

- :func:`link_auc`: node2vec's link prediction: Hadamard products of the two endpoints' embeddings, a
  logistic regression fitted on training edges against sampled non-edges, AUC on the held-out edges
  against as many other non-edges;
- :func:`probe_accuracy`: node classification by a linear probe (multinomial logistic regression on the
  standardised embeddings; its regularisation picked on the validation nodes) on the semi-supervised
  paradigm's labels and split;
- :func:`reconstruction`: Nickel & Kiela's reconstruction of the noun hierarchy: for each (synset,
  ancestor) pair of the closure, the rank of the ancestor among the synset's non-ancestors by the model's
  score, and the mean average precision of each synset's ranking of all nodes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

__all__ = ["PROBE_C", "link_auc", "probe_accuracy", "reconstruction", "reconstruction_sources"]

#: Inverse regularisation strengths the probe chooses among on the validation nodes.
PROBE_C = (0.01, 0.1, 1.0, 10.0)


def _hadamard(emb: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    return emb[pairs[0]] * emb[pairs[1]]


def link_auc(emb: np.ndarray, fit: np.ndarray, fit_non: np.ndarray, test: np.ndarray, test_non: np.ndarray,
             seed: int = 0) -> float:
    """AUC of held-out edges against non-edges by a logistic regression on Hadamard edge features."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.metrics import roc_auc_score

    x = np.concatenate([_hadamard(emb, fit), _hadamard(emb, fit_non)])
    y = np.concatenate([np.ones(fit.shape[1]), np.zeros(fit_non.shape[1])])
    scale = float(np.abs(x).mean()) or 1.0  # features of embeddings of any norm on one scale
    clf = LogisticRegression(max_iter=1000, random_state=seed).fit(x / scale, y)
    xt = np.concatenate([_hadamard(emb, test), _hadamard(emb, test_non)]) / scale
    yt = np.concatenate([np.ones(test.shape[1]), np.zeros(test_non.shape[1])])
    return float(roc_auc_score(yt, clf.decision_function(xt)))


def probe_accuracy(emb: np.ndarray, labels: np.ndarray, train: np.ndarray, val: np.ndarray, test: np.ndarray,
                   seed: int = 0) -> tuple[float, float]:
    """``(val_acc, test_acc)`` of a linear probe fitted on ``train`` (C chosen on ``val`` from :data:`PROBE_C`)."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    scaler = StandardScaler().fit(emb[train])
    xs = {k: scaler.transform(emb[idx]) for k, idx in (("train", train), ("val", val), ("test", test))}
    best: tuple[float, float] = (-1.0, 0.0)
    for c in PROBE_C:
        clf = LogisticRegression(C=c, max_iter=2000, random_state=seed).fit(xs["train"], labels[train])
        v = float((clf.predict(xs["val"]) == labels[val]).mean())
        if v > best[0]:
            best = (v, float((clf.predict(xs["test"]) == labels[test]).mean()))
    return best


def reconstruction_sources(closure: np.ndarray, count: int, seed: int = 0) -> np.ndarray:
    """A fixed sample of ``count`` synsets that have ancestors (all of them when ``count`` is larger)."""
    have = np.unique(closure[0])
    if count >= have.shape[0]:
        return have
    return np.sort(np.random.default_rng(seed).choice(have, size=count, replace=False))


def reconstruction(scores_of: Callable[[np.ndarray], np.ndarray], closure: np.ndarray, sources: np.ndarray,
                   chunk: int = 256) -> tuple[float, float]:
    """``(mean_rank, map)`` of the closure pairs of ``sources`` (Nickel & Kiela 2017, Table 1's protocol).

    Parameters
    ----------
    scores_of
        ``scores_of(nodes)`` gives ``[len(nodes), n]`` scores of every node for each of ``nodes``
        (higher: more likely an ancestor).
    closure
        ``int64[2, C]`` (synset, ancestor) pairs.
    sources
        The synsets whose pairs are ranked.

    Notes
    -----
    The rank of ancestor ``o`` of ``s`` is one plus the number of non-ancestors ``w != s`` scored above
    it (other ancestors do not count against it); the average precision of ``s`` ranks every node but
    ``s`` with its ancestors as the positives. Ties count as scikit-learn's ``average_precision_score``
    counts them (a threshold holds every node at its score), and a non-ancestor level with ``o`` as half
    a place above it, so untrained vectors that score everything alike get a chance rank, not the best.
    """
    order = np.argsort(closure[0], kind="stable")
    src, anc = closure[0][order], closure[1][order]
    starts = np.searchsorted(src, sources)
    ends = np.searchsorted(src, sources, side="right")
    ranks: list[np.ndarray] = []
    aps: list[float] = []
    for c0 in range(0, sources.shape[0], chunk):
        block = sources[c0:c0 + chunk]
        scores = np.asarray(scores_of(block), dtype=np.float64)
        for r, s in enumerate(block):
            pos = anc[starts[c0 + r]:ends[c0 + r]]
            row = scores[r].copy()
            row[s] = -np.inf
            ps = row[pos]
            above = (row[None, :] > ps[:, None]).sum(1)           # every node scored above each ancestor
            tied = (row[None, :] == ps[:, None]).sum(1)           # ... and level with it (itself included)
            above_pos = (ps[None, :] > ps[:, None]).sum(1)        # ... of which ancestors
            tied_pos = (ps[None, :] == ps[:, None]).sum(1)
            ranks.append(1.0 + (above - above_pos) + 0.5 * (tied - tied_pos))
            aps.append(float(((above_pos + tied_pos) / (above + tied)).mean()))
    return float(np.concatenate(ranks).mean()), float(np.mean(aps))
