"""The skip-gram model, over node tables held in the bank or in the trainer.

Each node has an input vector (table ``nodes``) and a context vector (table ``contexts``), as in word2vec;
a (center, context) pair scores ``u . v`` (:mod:`~carls_dask.paradigms.node_embeddings.tables` says why two
tables). One set of negatives is drawn for the whole batch
(the bank's sampler: ``log_uniform`` over frequency rank, or ``uniform``) and the pairs are trained with
one of two losses:

- ``"sgns"``, word2vec's negative sampling: every pair is pushed away from all the negatives with weight
  ``negatives_per_pair / len(negatives)`` (the expectation of drawing ``negatives_per_pair`` per pair from
  the same distribution); a negative equal to the pair's context is left out;
- ``"softmax"``, sampled softmax (TensorFlow's ``sampled_softmax_loss``: logQ correction with the
  sampler's expected counts, accidental hits removed): an estimate of the softmax of the context over
  every node, which ranks a node's true contexts above all others (Nickel & Kiela's reconstruction).

Two interchangeable table holders, the same arithmetic:

- :class:`BankTables`: the bank tables ``nodes`` and ``contexts``, read and trained through
  :class:`~carls_dask.nn.BankEmbedding` layers (Adagrad on the shards), negatives drawn by the bank;
- :class:`InProcessTables`: two ``torch.nn.Embedding(sparse=True)`` with ``torch.optim.Adagrad`` of the
  same semantics (the table's initial accumulator, no epsilon), started from the rows the bank's
  initializer gives, negatives drawn by the bank's sampler code over frequencies counted as the bank
  counts them (one bank shard's ranking, where the bank mixes its shards' rankings).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from carls_dask.bank import TableSpec
from carls_dask.bank.sampling import order_by_frequency, sample_candidates
from carls_dask.nn import BankEmbedding, initial_rows, sampled_softmax_loss
from carls_dask.paradigms.node_embeddings.tables import CONTEXTS, TABLE

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["BankTables", "InProcessTables", "accidental_hits", "sgns_loss", "softmax_loss"]

def sgns_loss(u: torch.Tensor, v: torch.Tensor, neg: torch.Tensor, negatives_per_pair: float,
              hits: tuple[np.ndarray, np.ndarray] | None = None) -> torch.Tensor:
    """Skip-gram negative-sampling loss of pairs ``(u[i], v[i])`` against shared negatives ``neg``, summed over pairs.

    Summed, as word2vec steps once per pair: a row's gradient is then the sum of its pairs' gradients
    whatever the batch size (a mean would shrink every row's step by the batch size). ``hits``
    (``(pairs, negatives)`` index arrays) are negatives that are the pair's own context: their terms
    are taken out again (they are few, so this costs less than masking the whole ``[B, S]`` matrix).
    """
    pos = torch.nn.functional.logsigmoid((u * v).sum(-1)).sum()
    negs = torch.nn.functional.logsigmoid(-(u @ neg.T)).sum()
    if hits is not None and hits[0].size:
        i, j = torch.from_numpy(hits[0]), torch.from_numpy(hits[1])
        negs = negs - torch.nn.functional.logsigmoid(-(u[i] * neg[j]).sum(-1)).sum()
    return -(pos + negatives_per_pair / neg.shape[0] * negs)


def softmax_loss(u: torch.Tensor, v: torch.Tensor, neg: torch.Tensor, true_logq: torch.Tensor,
                 neg_logq: torch.Tensor, hits: tuple[np.ndarray, np.ndarray] | None = None) -> torch.Tensor:
    """Sampled softmax of each pair's context against shared negatives, summed over pairs.

    ``true_logq`` (``[B]``) and ``neg_logq`` (``[S]``) are the log expected counts subtracted from the
    logits; a negative that is the pair's own context (``hits``) gets ``-FLOAT_MAX`` added, as TensorFlow does.
    """
    true = (u * v).sum(-1) - true_logq
    sampled = u @ neg.T - neg_logq[None, :]
    if hits is not None and hits[0].size:
        i, j = torch.from_numpy(hits[0]), torch.from_numpy(hits[1])
        sampled = sampled.index_put((i, j), torch.full((i.shape[0],), -torch.finfo(sampled.dtype).max,
                                                       dtype=sampled.dtype), accumulate=True)
    return -(true - torch.logsumexp(torch.cat([true[:, None], sampled], 1), 1)).sum()


def accidental_hits(contexts: np.ndarray, negatives: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(pair, negative)`` indices where a shared negative is the pair's own context."""
    order = np.argsort(negatives, kind="stable")
    pos = np.searchsorted(negatives[order], contexts)
    pos = np.minimum(pos, negatives.shape[0] - 1)
    hit = negatives[order][pos] == contexts  # the sampler's negatives are distinct
    return np.flatnonzero(hit), order[pos[hit]]


class BankTables:
    """The node vectors in the bank's ``nodes`` table, trained through two layers.

    Parameters
    ----------
    bank
        The run's bank.
    pipeline, staleness
        The layers' pipelining (see :class:`~carls_dask.nn.BankLayer`).
    sampler
        The bank's negative sampler.
    """

    def __init__(self, bank: KnowledgeBank, *, pipeline: bool, staleness: int, sampler: str) -> None:
        self.bank = bank
        self.inputs = BankEmbedding(bank, TABLE, pipeline=pipeline, staleness=staleness)
        self.contexts = BankEmbedding(bank, CONTEXTS, pipeline=pipeline, staleness=staleness)
        self.sampler = sampler

    def loss(self, kind: str, centers: np.ndarray, contexts: np.ndarray, n_neg: int, negatives_per_pair: float,
             seed: int) -> torch.Tensor:
        """The batch's loss (summed over pairs); backward pushes the rows' gradients to the bank.

        Centers and contexts are read with insert, the negatives drawn by the bank and read without;
        context and negative rows go back as one push. ``"softmax"`` is :func:`carls_dask.nn.sampled_softmax_loss`
        over the context table.
        """
        u = self.inputs(torch.from_numpy(centers))
        ctx = self.contexts
        if kind == "softmax":
            return sampled_softmax_loss(ctx, u, contexts, n_neg, sampler=self.sampler, seed=seed, reduction="sum")
        v = ctx.read(contexts, ctx.inserting())
        neg_keys = self.bank.sample_negatives(CONTEXTS, n_neg, sampler=self.sampler, seed=seed).keys
        both = ctx.track(np.concatenate([contexts, neg_keys]), torch.cat([v, ctx.read(neg_keys, False)]))
        return sgns_loss(u, both[: contexts.shape[0]], both[contexts.shape[0]:], negatives_per_pair,
                         accidental_hits(contexts, neg_keys))

    def prefetch(self, centers: np.ndarray, contexts: np.ndarray) -> None:
        """Start reading the next batch's rows (see :meth:`~carls_dask.nn.BankLayer.prefetch`)."""
        self.inputs.prefetch(centers)
        self.contexts.prefetch(contexts)

    def step(self) -> None:
        """Nothing: the layers pushed their gradients in backward."""

    def vectors(self, nodes: np.ndarray, table: str = TABLE) -> np.ndarray:
        """``[len(nodes), d]`` vectors of ``table`` (a read: unseen nodes read their initial value)."""
        layer = self.inputs if table == TABLE else self.contexts
        layer.flush()
        with torch.no_grad():
            out: np.ndarray = layer.lookup(nodes, insert=False).numpy()
        return out

    def state_dict(self) -> dict[str, Any]:
        """For a checkpoint: waits for every push (the bank's snapshot, taken next, then holds them all) and
        returns the prefetched rows not used yet, so a resumed run reads what an uninterrupted one reads."""
        for layer in (self.inputs, self.contexts):
            layer.flush()
        return {"inputs": self.inputs.prefetch_state(), "contexts": self.contexts.prefetch_state()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.inputs.load_prefetch_state(list(state.get("inputs", [])))
        self.contexts.load_prefetch_state(list(state.get("contexts", [])))

    def stats(self) -> dict[str, float]:
        """The input layer's pipeline counters (staleness of the rows read, waits)."""
        st = self.inputs.pipeline_stats().as_metrics("pipeline_")
        return {k: v for k, v in st.items() if k.endswith(("stale_row_fraction", "max_staleness", "wait_s"))}

    def close(self) -> None:
        self.inputs.close()
        self.contexts.close()


class InProcessTables:
    """The same model with both tables in the trainer: sparse embeddings and torch's Adagrad.

    Parameters
    ----------
    specs
        The ``nodes`` and ``contexts`` table specs (initializers, learning rate, accumulator of the bank's version).
    n
        Nodes.
    sampler
        The negative sampler (the bank's code and distribution).
    """

    def __init__(self, specs: tuple[TableSpec, TableSpec], n: int, *, sampler: str) -> None:
        keys = np.arange(n, dtype=np.int64)
        spec, ctx_spec = specs
        dim = spec.column("embedding").shape[0]
        self.inputs = torch.nn.Embedding(n, dim, sparse=True)
        self.contexts = torch.nn.Embedding(n, dim, sparse=True)
        with torch.no_grad():
            self.inputs.weight.copy_(torch.from_numpy(initial_rows(spec, "embedding", keys)))
            self.contexts.weight.copy_(torch.from_numpy(initial_rows(ctx_spec, "embedding", keys)))
        params = [self.inputs.weight, self.contexts.weight]
        lr = float(spec.learning_rate or 0.0)
        self.optimizer: torch.optim.Optimizer = (
            torch.optim.SGD(params, lr=lr) if spec.optimizer == "sgd" else
            torch.optim.Adagrad(params, lr=lr, initial_accumulator_value=spec.adagrad_initial_accumulator, eps=0.0))
        self.keys = keys
        self.frequency = np.ones(n, dtype=np.int64)  # as the contexts table after the initial insert of every node
        self.sampler = sampler

    def loss(self, kind: str, centers: np.ndarray, contexts: np.ndarray, n_neg: int, negatives_per_pair: float,
             seed: int) -> torch.Tensor:
        """As :meth:`BankTables.loss`, with the frequencies counted and the negatives drawn here."""
        n = self.keys.shape[0]
        self.frequency += np.bincount(contexts, minlength=n)  # the contexts table's counts
        sample = sample_candidates(CONTEXTS, order_by_frequency(self.keys, self.frequency), n_neg, sampler=self.sampler,
                                   unique=True, true_keys=contexts if kind == "softmax" else None,
                                   rng=np.random.default_rng(seed))
        neg_keys = sample.keys
        both = self.contexts(torch.from_numpy(np.concatenate([contexts, neg_keys])))
        u, v, neg = self.inputs(torch.from_numpy(centers)), both[: contexts.shape[0]], both[contexts.shape[0]:]
        hits = accidental_hits(contexts, neg_keys)
        if kind == "softmax":
            return softmax_loss(u, v, neg, torch.from_numpy(np.log(sample.true_expected_count)).to(u.dtype),
                                torch.from_numpy(np.log(sample.expected_count)).to(u.dtype), hits)
        return sgns_loss(u, v, neg, negatives_per_pair, hits)

    def prefetch(self, centers: np.ndarray, contexts: np.ndarray) -> None:
        """Nothing to fetch: the tables are here."""

    def step(self) -> None:
        """Apply the sparse Adagrad step (and clear the gradients)."""
        self.optimizer.step()
        self.optimizer.zero_grad()

    def vectors(self, nodes: np.ndarray, table: str = TABLE) -> np.ndarray:
        weight = (self.inputs if table == TABLE else self.contexts).weight
        return weight.detach()[torch.from_numpy(np.asarray(nodes))].numpy().copy()

    def stats(self) -> dict[str, float]:
        return {}

    def state_dict(self) -> dict[str, Any]:
        """The tables, their optimizer and the frequencies (what the next steps depend on)."""
        return {"inputs": self.inputs.state_dict(), "contexts": self.contexts.state_dict(),
                "optimizer": self.optimizer.state_dict(), "frequency": self.frequency.copy()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.inputs.load_state_dict(state["inputs"])
        self.contexts.load_state_dict(state["contexts"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.frequency = np.asarray(state["frequency"], dtype=np.int64).copy()

    def close(self) -> None:
        """Nothing to release."""
