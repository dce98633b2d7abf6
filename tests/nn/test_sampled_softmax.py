"""Sampled softmax over a bank table against a direct dense computation; the full softmax as its limit; learning."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from carls_dask.bank import Column, KnowledgeBank, TableSpec
from carls_dask.errors import ConfigError, InvalidShapeError
from carls_dask.nn import BankEmbedding, SampledSoftmaxLoss, sampled_softmax_loss, top_k_classes
from tests.bank.banks import assert_same_state, bank_state

C, D, B, LR = 30, 4, 6, 0.5


def classes_table(name: str = "classes") -> TableSpec:
    return TableSpec(name, columns=(Column("embedding", shape=(D,)), Column("bias", shape=(1,))), optimizer="sgd",
                     learning_rate=LR, initializer="normal", init_scale=0.5)


@pytest.fixture
def bank() -> KnowledgeBank:
    with KnowledgeBank.local([classes_table()], n_shards=2) as b:
        emb = BankEmbedding(b, "classes")
        rng = np.random.default_rng(0)
        emb(torch.from_numpy(rng.zipf(1.5, size=400) % C))  # every class seen, Zipf-like frequencies
        yield b


def dense_reference(bank: KnowledgeBank, x: torch.Tensor, labels: np.ndarray, sample: object,
                    with_bias: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, np.ndarray]:
    """TF's sampled softmax written out over dense tensors: loss, and the leaf weights and biases it used."""
    keys = np.concatenate([labels.reshape(-1), sample.keys])  # type: ignore[attr-defined]
    uniq, inv = np.unique(keys, return_inverse=True)
    got = bank.lookup("classes", uniq)
    w = torch.tensor(got.values["embedding"], requires_grad=True)
    b = torch.tensor(got.values["bias"][:, 0], requires_grad=True)
    t = labels.shape[1]
    wt, ws = w[inv[: labels.size]].reshape(B, t, D), w[inv[labels.size:]]
    true = (x[:, None, :] * wt).sum(-1) - torch.from_numpy(np.log(sample.true_expected_count)).float().reshape(B, t)  # type: ignore[attr-defined]
    samp = x @ ws.T - torch.from_numpy(np.log(sample.expected_count)).float()  # type: ignore[attr-defined]
    if with_bias:
        true = true + b[inv[: labels.size]].reshape(B, t)
        samp = samp + b[inv[labels.size:]]
    hit = torch.from_numpy((sample.keys[None, None, :] == labels[:, :, None]).any(1))  # type: ignore[attr-defined]
    samp = torch.where(hit, samp - torch.finfo(torch.float32).max, samp)
    logits = torch.cat([true, samp], 1)
    target = torch.cat([torch.full((B, t), 1.0 / t), torch.zeros_like(samp)], 1)
    loss = -(target * torch.log_softmax(logits, 1)).sum(1).mean()
    return loss, w, b, uniq


@pytest.mark.parametrize("num_true,with_bias", [(1, False), (2, False), (1, True)])
def test_loss_and_bank_updates_match_a_dense_computation(bank: KnowledgeBank, num_true: int, with_bias: bool) -> None:
    weights = BankEmbedding(bank, "classes")
    biases = BankEmbedding(bank, "classes", "bias") if with_bias else None
    rng = np.random.default_rng(1)
    labels = rng.integers(0, C, size=(B, num_true))
    labels[0, 0] = 0  # the most frequent class: certainly among the candidates, an accidental hit
    x = torch.from_numpy(rng.standard_normal((B, D)).astype(np.float32))
    sample = bank.sample_negatives("classes", 12, sampler="log_uniform", true_keys=labels.reshape(-1), seed=3)
    assert np.isin(sample.keys, labels).any()
    loss_ref, w, b, uniq = dense_reference(bank, x, labels, sample, with_bias)
    loss = sampled_softmax_loss(weights, x, labels if num_true > 1 else labels[:, 0], 12, biases=biases,
                                num_true=num_true, sampled_values=sample)
    assert abs(loss.item() - loss_ref.item()) <= 1e-6 * abs(loss_ref.item())
    loss.backward()
    loss_ref.backward()
    got = bank.lookup("classes", uniq)
    np.testing.assert_allclose(got.values["embedding"], (w - LR * w.grad).detach().numpy(), rtol=1e-6, atol=1e-7)
    if with_bias:
        np.testing.assert_allclose(got.values["bias"][:, 0], (b - LR * b.grad).detach().numpy(), rtol=1e-6,
                                   atol=1e-7)


def test_every_class_sampled_without_correction_is_the_full_softmax(bank: KnowledgeBank) -> None:
    weights = BankEmbedding(bank, "classes")
    rng = np.random.default_rng(2)
    labels = rng.integers(0, C, size=B)
    x = torch.from_numpy(rng.standard_normal((B, D)).astype(np.float32))
    loss = sampled_softmax_loss(weights, x, labels, C, sampler="uniform", subtract_log_q=False, seed=0)
    every = np.arange(C)
    w = torch.from_numpy(bank.lookup("classes", every).values["embedding"])
    full = torch.nn.functional.cross_entropy(x @ w.T, torch.from_numpy(labels))
    assert abs(loss.item() - full.item()) <= 1e-6 * full.item()


def test_a_classifier_trained_with_bank_candidates_ranks_the_true_class_first() -> None:
    """200 classes, 16 candidates a step: the full evaluation through top_k finds the class far above chance."""
    n_classes, dim = 200, 16
    spec = TableSpec("classes", columns=(Column("embedding", shape=(dim,)),), optimizer="adagrad", learning_rate=0.3,
                     initializer="normal", init_scale=0.1)
    with KnowledgeBank.local([spec], n_shards=2) as b:
        rng = np.random.default_rng(0)
        protos = rng.standard_normal((n_classes, 32)).astype(np.float32)
        torch.manual_seed(0)
        model = torch.nn.Linear(32, dim)
        loss_fn = SampledSoftmaxLoss(BankEmbedding(b, "classes"), 16, seed=0)
        opt = torch.optim.Adam(model.parameters(), lr=0.02)

        def accuracy() -> float:
            y = rng.integers(0, n_classes, size=500)
            x = torch.from_numpy(protos[y] + 0.3 * rng.standard_normal((500, 32)).astype(np.float32))
            with torch.no_grad():
                keys, _ = top_k_classes(loss_fn.weights, model(x), 1)
            return float((keys[:, 0] == y).mean())

        loss_fn.weights(torch.arange(n_classes))  # every class in the table before the first evaluation
        before = accuracy()
        for _ in range(300):
            y = rng.integers(0, n_classes, size=64)
            x = torch.from_numpy(protos[y] + 0.3 * rng.standard_normal((64, 32)).astype(np.float32))
            loss = loss_fn(model(x), torch.from_numpy(y))
            opt.zero_grad()
            loss.backward()
            opt.step()
        after = accuracy()
    assert before < 0.05 and after > 0.8, (before, after)


def test_eval_reads_only_and_a_seeded_loss_module_repeats(bank: KnowledgeBank) -> None:
    weights = BankEmbedding(bank, "classes")
    x = torch.ones(2, D)
    state = bank_state(bank)
    weights.eval()
    with torch.no_grad():
        a = SampledSoftmaxLoss(weights, 5, seed=4)(x, torch.tensor([1, 77]))  # 77 is not a class yet
        b = SampledSoftmaxLoss(weights, 5, seed=4)(x, torch.tensor([1, 77]))
    assert float(a) == float(b) and np.isfinite(float(a))
    assert_same_state(state, bank_state(bank))
    assert repr(SampledSoftmaxLoss(weights, 5, seed=4, sampler="uniform")).startswith(
        "SampledSoftmaxLoss(\n  num_sampled=5, seed=4, sampler='uniform'")


def test_bad_arguments_are_refused_before_the_bank_is_touched(bank: KnowledgeBank) -> None:
    weights = BankEmbedding(bank, "classes")
    state = bank_state(bank)
    with pytest.raises(InvalidShapeError, match=r"expected a \[batch, 4\] tensor"):
        sampled_softmax_loss(weights, torch.ones(3, 5), [1, 2, 3], 4)
    with pytest.raises(InvalidShapeError, match="labels of shape"):
        sampled_softmax_loss(weights, torch.ones(3, D), [1, 2], 4)
    with pytest.raises(ConfigError, match="sampler='zipf'"):
        sampled_softmax_loss(weights, torch.ones(3, D), [1, 2, 3], 4, sampler="zipf")
    with pytest.raises(ConfigError, match="num_sampled=0"):
        sampled_softmax_loss(weights, torch.ones(3, D), [1, 2, 3], 0)
    with pytest.raises(InvalidShapeError, match="biases rows have 4 elements"):
        sampled_softmax_loss(weights, torch.ones(3, D), [1, 2, 3], 4, biases=weights)
    with pytest.raises(ConfigError, match="reduction='avg'"):
        sampled_softmax_loss(weights, torch.ones(3, D), [1, 2, 3], 4, reduction="avg")
    assert_same_state(state, bank_state(bank))
