"""The layer over a 2-shard bank trains exactly as torch.nn.Embedding(sparse=True) with the torch optimizer of the
same semantics: the same losses and rows step by step.

What the comparisons show about the arithmetic:

- the forward reads the same float32 rows, so with equal rows the losses are bit-equal;
- SGD and Adagrad (torch's ``Adagrad`` with the bank's initial accumulator and ``eps=0``; the bank adds
  no epsilon) compute the same update term; torch adds ``-lr * update`` to the weight with a fused
  multiply-add (one rounding), the bank multiplies and then subtracts (two roundings), so a row differs by
  at most one unit in the last place per step;
- Adam: from the same state, one step agrees to 1e-6 relative (the bank writes the moments as
  ``b1 * m + (1 - b1) * g``, ``SparseAdam`` as ``m + (g - m) * (1 - b1)``), and the two agree on every row
  that is updated at every step. They differ by design on rows updated less often: ``SparseAdam`` keeps one
  step count per tensor and bias-corrects every row with the global step; the bank counts the updates of
  each row and corrects with that count (the correction of lazy Adam per row, which is also what a
  snapshot restores exactly).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch

from carls_dask.bank import KnowledgeBank
from carls_dask.nn import BankEmbedding, initial_rows
from tests.nn.tables import rows_by_key, table

pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")

N, D, B, LR, STEPS = 64, 8, 24, 0.05, 20


class Model(torch.nn.Module):
    """Embedding -> tanh -> linear: the same model over either table."""

    def __init__(self, embedding: torch.nn.Module) -> None:
        super().__init__()
        self.embedding = embedding
        torch.manual_seed(3)
        self.head = torch.nn.Linear(D, 2)

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.embedding(keys)))


def batches(seed: int = 0, kind: str = "duplicates") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Batches of ``B`` keys with duplicates (or ``"unique"`` ones, or ``"every_row"`` once) and their targets."""
    rng = np.random.default_rng(seed)
    while True:
        if kind == "every_row":
            keys = np.arange(N)
        else:
            keys = rng.permutation(N)[:B] if kind == "unique" else rng.integers(0, N, size=B)
        yield torch.from_numpy(keys), torch.from_numpy(rng.standard_normal((keys.shape[0], 2)).astype(np.float32))


def torch_optimizer(kind: str, weight: torch.nn.Parameter) -> torch.optim.Optimizer:
    if kind == "sgd":
        return torch.optim.SGD([weight], lr=LR)
    if kind == "adagrad":
        return torch.optim.Adagrad([weight], lr=LR, initial_accumulator_value=0.1, eps=0.0)
    return torch.optim.SparseAdam([weight], lr=LR)


def pair(kind: str) -> tuple[KnowledgeBank, Model, Model, torch.optim.Optimizer, list[torch.optim.Optimizer]]:
    """The bank model and the in-process model, from the same initial rows and head."""
    bank = KnowledgeBank.local([table("words", kind, lr=LR, adagrad_initial_accumulator=0.1)], n_shards=2)
    ours = Model(BankEmbedding(bank, "words"))
    ref_emb = torch.nn.Embedding(N, D, sparse=True)
    with torch.no_grad():
        ref_emb.weight.copy_(torch.from_numpy(initial_rows(bank.spec("words"), "embedding", np.arange(N))))
    theirs = Model(ref_emb)
    theirs.head.load_state_dict(ours.head.state_dict())
    dense = [torch.optim.SGD(m.head.parameters(), lr=0.1) for m in (ours, theirs)]
    return bank, ours, theirs, torch_optimizer(kind, ref_emb.weight), dense


def step(model: Model, keys: torch.Tensor, target: torch.Tensor, opts: list[Any]) -> float:
    for o in opts:
        o.zero_grad()
    loss = torch.nn.functional.mse_loss(model(keys), target)
    loss.backward()
    for o in opts:
        o.step()
    return float(loss.detach())


def touched_rows(bank: KnowledgeBank) -> np.ndarray:
    return np.sort(bank.keys("words"))


def assert_rel(a: np.ndarray, b: np.ndarray, tol: float = 1e-6) -> None:
    """``max |a - b| <= tol * max |b|`` (float32: equal to ``tol`` relative)."""
    assert np.abs(a - b).max() <= tol * np.abs(b).max(), (np.abs(a - b).max(), np.abs(b).max())


@pytest.mark.parametrize("kind", ["sgd", "adagrad"])
def test_training_follows_the_sparse_torch_embedding_step_by_step(kind: str) -> None:
    bank, ours, theirs, emb_opt, (d1, d2) = pair(kind)
    for i, (keys, target) in zip(range(STEPS), batches(), strict=False):
        la = step(ours, keys, target, [d1])
        lb = step(theirs, keys, target, [d2, emb_opt])
        if i == 0:
            assert la == lb  # the same rows and head: the same float32 loss
        assert abs(la - lb) <= 1e-6 * abs(lb)
        k = touched_rows(bank)
        assert_rel(rows_by_key(bank, "words", k), theirs.embedding.weight.detach().numpy()[k])
        for p, q in zip(ours.head.parameters(), theirs.head.parameters(), strict=True):
            assert_rel(p.detach().numpy(), q.detach().numpy())


def sync(bank: KnowledgeBank, kind: str, theirs: Model, emb_opt: torch.optim.Optimizer, ours: Model,
         global_step: int) -> None:
    """Set the in-process model to the bank's rows and optimizer slots (and the same head)."""
    k = touched_rows(bank)
    w = theirs.embedding.weight
    with torch.no_grad():
        w[torch.from_numpy(k)] = torch.from_numpy(rows_by_key(bank, "words", k))
    theirs.head.load_state_dict(ours.head.state_dict())
    state = emb_opt.state[w]
    if kind == "adagrad" and state:
        state["sum"][torch.from_numpy(k)] = torch.from_numpy(rows_by_key(bank, "words", k, "slot/embedding/accumulator"))
    if kind == "adam" and state:
        state["exp_avg"][torch.from_numpy(k)] = torch.from_numpy(rows_by_key(bank, "words", k, "slot/embedding/m"))
        state["exp_avg_sq"][torch.from_numpy(k)] = torch.from_numpy(rows_by_key(bank, "words", k, "slot/embedding/v"))
        state["step"] = global_step


@pytest.mark.parametrize("kind", ["sgd", "adagrad", "adam"])
def test_each_step_from_the_same_state_gives_the_same_loss_and_rows(kind: str) -> None:
    """Rows and slots copied from the bank before every step: bit-equal losses, rows within one step's rounding.

    Keys are distinct within a batch here, so the gradients are the same numbers (with duplicates the
    bank sums them in batch order and torch in its coalescing order); Adam touches every row every step.
    """
    bank, ours, theirs, emb_opt, (d1, d2) = pair(kind)
    for i, (keys, target) in zip(range(STEPS), batches(1, "every_row" if kind == "adam" else "unique"),
                                 strict=False):
        if i:
            sync(bank, kind, theirs, emb_opt, ours, i)
        la = step(ours, keys, target, [d1])
        lb = step(theirs, keys, target, [d2, emb_opt])
        assert la == lb
        k = touched_rows(bank)
        mine, ref = rows_by_key(bank, "words", k), theirs.embedding.weight.detach().numpy()[k]
        if kind == "adam":
            assert_rel(mine, ref)
        else:  # one rounding apart: the fused multiply-add
            assert np.all(np.abs(mine - ref) <= np.spacing(np.abs(ref))), kind


def lazy_adam_row(w: float, grads: list[float], b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8) -> float:
    """One weight under Adam with the row's own update count as ``t``, in float64.

    The moments use ``1 - beta`` as the bank computes it: ``beta`` rounded to float32 first (``1 - 0.999``
    is then ``0.00100004673``), while the bias correction uses the exact betas, so the bank's first step is
    ``sqrt(0.001 / 0.00100004673)`` (2.3e-5 relative) off Adam's exact arithmetic; ``SparseAdam`` multiplies
    by ``1 - beta`` worked out in double.
    """
    c1 = float(np.float32(1) - np.float32(b1))
    c2 = float(np.float32(1) - np.float32(b2))
    b1_32, b2_32 = float(np.float32(b1)), float(np.float32(b2))
    m = v = 0.0
    for t, g in enumerate(grads, start=1):
        m = b1_32 * m + c1 * g
        v = b2_32 * v + c2 * g * g
        w -= LR * np.sqrt(1 - b2**t) / (1 - b1**t) * m / (np.sqrt(v) + eps)
    return w


def test_adam_corrects_each_row_by_its_own_update_count_where_sparse_adam_uses_the_global_step() -> None:
    bank, ours, theirs, emb_opt, _ = pair("adam")
    hot, rare = 1, 2
    grads: dict[int, list[np.ndarray]] = {hot: [], rare: []}
    w0 = initial_rows(bank.spec("words"), "embedding", np.array([hot, rare])).astype(np.float64)
    for i in range(8):
        keys = torch.tensor([hot, rare] if i in (3, 7) else [hot])
        g = torch.linspace(-1, 1, D) * (i + 1)  # a known gradient for each row
        for model, opts in ((ours, []), (theirs, [emb_opt])):
            (model.embedding(keys) * g).sum().backward()
            for o in opts:
                o.step()
                o.zero_grad()
        for k in keys.tolist():
            grads[k].append(g.numpy().astype(np.float64))
    for row, (key, seen) in enumerate(grads.items()):
        expect = np.array([lazy_adam_row(w0[row, j], [g[j] for g in seen]) for j in range(D)])
        np.testing.assert_allclose(rows_by_key(bank, "words", [key])[0], expect, rtol=1e-6, atol=1e-7)
        assert rows_by_key(bank, "words", [key], "slot/embedding/step")[0] == len(seen)
    sparse_adam = theirs.embedding.weight.detach().numpy()
    mine = rows_by_key(bank, "words", [hot, rare])
    # the hot row is updated at every step, so its count is the global step: only the 1 - beta rounding
    # (at most 2.3e-5 of each step of size LR) separates the two
    assert np.abs(sparse_adam[hot] - mine[0]).max() <= 8 * LR * 3e-5
    # the rare row was corrected with t = 1, 2 in the bank and t = 4, 8 by SparseAdam
    assert np.abs(sparse_adam[rare] - mine[1]).max() > 1e-3
