"""The layer over a Dask bank on a real LocalCluster: pickled into a task, pipelined, errors surfacing; CUDA.

A trainer on a worker and one in this process over in-process shards take the same steps in the same
order, so their losses and rows are bit-equal; so are a pipelined run with ``staleness=0`` and a plain
one. A prefetching run is compared with the same schedule over in-process shards, where the pipeline
runs inline in submission order: the worker thread keeps that order exactly.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch

from carls_dask.bank import KnowledgeBank
from carls_dask.errors import InvalidBatchError
from carls_dask.nn import BankEmbedding, BankEmbeddingBag
from tests.nn.tables import DIM, table

STEPS = 12


def model_over(bank: KnowledgeBank, **layer: Any) -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(BankEmbeddingBag(bank, "words", mode="mean", **layer), torch.nn.Linear(DIM, 1))


def key_batches(seed: int = 0) -> list[torch.Tensor]:
    rng = np.random.default_rng(seed)
    return [torch.from_numpy(rng.zipf(1.3, size=(32, 4)) % 500) for _ in range(STEPS)]


def train(model: torch.nn.Module, batches: list[torch.Tensor], prefetch: bool = False) -> list[float]:
    """Plain steps (or, ``prefetch``, asking for the next batch's rows before each step)."""
    opt = torch.optim.SGD(model[1].parameters(), lr=0.1)
    losses = []
    for i, keys in enumerate(batches):
        if prefetch and i + 1 < len(batches):
            model[0].prefetch(batches[i + 1])
        loss = ((model(keys) - 1.0) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model[0].flush()
    return losses


def rows(bank: KnowledgeBank) -> tuple[np.ndarray, np.ndarray]:
    keys = np.sort(bank.keys("words"))
    got = bank.lookup("words", keys)
    return keys, got.values["embedding"]


def on_worker(model: torch.nn.Module, batches: list[torch.Tensor],
              prefetch: bool = False) -> tuple[list[float], dict[str, float]]:
    """A trainer's steps run as a task: the model (and its bank) arrive pickled."""
    losses = train(model, batches, prefetch)
    stats = model[0].pipeline_stats().as_metrics()
    model[0].close()
    return losses, stats


@pytest.fixture
def dask_bank(client: Any) -> KnowledgeBank:
    with KnowledgeBank.create(client, [table("words", "adagrad", lr=0.1)], n_shards=2) as b:
        yield b


def local_run(run: Callable[[torch.nn.Module], list[float]], **layer: Any) -> tuple[list[float], np.ndarray,
                                                                                      np.ndarray]:
    with KnowledgeBank.local([table("words", "adagrad", lr=0.1)], n_shards=2) as b:
        losses = run(model_over(b, **layer))
        return (losses, *rows(b))


def test_a_trainer_task_on_a_worker_trains_the_dask_bank_as_in_process_shards(client: Any,
                                                                               dask_bank: KnowledgeBank) -> None:
    batches = key_batches()
    model = model_over(dask_bank)
    pickle.loads(pickle.dumps(model))  # the model travels with its bank
    losses, stats = client.submit(on_worker, model, batches, pure=False).result(timeout=120)
    ref_losses, ref_keys, ref_rows = local_run(lambda m: train(m, batches))
    assert losses == ref_losses and stats["reads"] == STEPS and stats["pushes"] == STEPS
    keys, got = rows(dask_bank)
    np.testing.assert_array_equal(keys, ref_keys)
    np.testing.assert_array_equal(got, ref_rows)


def test_a_pipelined_trainer_task_reaches_the_bank_from_its_worker_thread(client: Any,
                                                                          dask_bank: KnowledgeBank) -> None:
    """The layer's worker thread inside a task finds the task's Dask worker (its calls run in the task's context)."""
    batches = key_batches(4)
    model = model_over(dask_bank, pipeline=True, staleness=1)
    losses, stats = client.submit(on_worker, model, batches, True, pure=False).result(timeout=120)
    ref: dict[str, Any] = {}

    def run(m: torch.nn.Module) -> list[float]:
        out = train(m, batches, prefetch=True)
        ref["stale"] = m[0].pipeline_stats().stale_rows
        return out

    ref_losses, _, ref_rows = local_run(run, pipeline=True, staleness=1)
    assert losses == ref_losses and stats["stale_rows"] == ref["stale"] > 0
    np.testing.assert_array_equal(rows(dask_bank)[1], ref_rows)


def test_pipelined_with_staleness_0_is_the_exact_order(dask_bank: KnowledgeBank) -> None:
    batches = key_batches(1)
    model = model_over(dask_bank, pipeline=True, staleness=0)
    losses = train(model, batches, prefetch=True)
    stats = model[0].pipeline_stats()
    ref_losses, _, ref_rows = local_run(lambda m: train(m, batches))
    assert losses == ref_losses
    np.testing.assert_array_equal(rows(dask_bank)[1], ref_rows)
    assert stats.prefetched == STEPS - 1 and stats.max_staleness == 0 and stats.refetched_rows > 0
    model[0].close()


def test_pipelined_with_staleness_1_misses_at_most_one_update_per_row_as_counted(dask_bank: KnowledgeBank) -> None:
    batches = key_batches(2)
    model = model_over(dask_bank, pipeline=True, staleness=1)
    losses = train(model, batches, prefetch=True)
    stats = model[0].pipeline_stats()
    assert stats.max_staleness == 1 and 0 < stats.stale_rows < stats.rows and stats.refetched_rows == 0
    assert model[0].rows.pending() == 0
    # the same schedule over in-process shards (run inline, in submission order) gives the same numbers
    ref: dict[str, Any] = {}

    def run(m: torch.nn.Module) -> list[float]:
        out = train(m, batches, prefetch=True)
        ref["stats"] = m[0].pipeline_stats()
        return out

    ref_losses, _, ref_rows = local_run(run, pipeline=True, staleness=1)
    assert losses == ref_losses and stats.stale_rows == ref["stats"].stale_rows
    np.testing.assert_array_equal(rows(dask_bank)[1], ref_rows)
    plain_losses, _, _ = local_run(lambda m: train(m, batches))
    assert losses != plain_losses  # the missed updates are real
    model[0].close()


def test_a_bad_gradient_is_refused_in_backward_before_anything_is_sent(dask_bank: KnowledgeBank) -> None:
    emb = BankEmbedding(dask_bank, "words", pipeline=True)
    out = emb(torch.tensor([1, 2]))
    before = dask_bank.lookup("words", [1, 2]).values["embedding"]
    with pytest.raises(InvalidBatchError, match="NaN or Inf"):
        (out * float("inf")).sum().backward()  # the bank refuses non-finite gradients: checked as the push is held
    emb.flush()
    np.testing.assert_array_equal(dask_bank.lookup("words", [1, 2]).values["embedding"], before)
    emb.close()


def test_a_push_the_shard_refuses_surfaces_at_the_next_call(client: Any) -> None:
    """A push the client accepts but the shard's optimizer refuses (its step would overflow) fails at the next call."""
    with KnowledgeBank.create(client, [table("huge", "sgd", lr=1e38)], n_shards=2) as bank:
        emb = BankEmbedding(bank, "huge", pipeline=True)
        before = bank.lookup("huge", [1, 2], insert=True).values["embedding"]
        (emb(torch.tensor([1, 2])) * 100.0).sum().backward()  # held, not sent
        with pytest.raises(InvalidBatchError, match="non-finite"):
            emb(torch.tensor([3]))  # the push travels with this read and fails on the shard
        np.testing.assert_array_equal(bank.lookup("huge", [1, 2]).values["embedding"], before)
        emb(torch.tensor([3]))  # raised once
        emb.close()


@pytest.mark.gpu
def test_a_cuda_model_moves_rows_to_the_device_and_gradients_back() -> None:
    batches = [b.cuda() for b in key_batches(3)]
    with KnowledgeBank.local([table("words", "adagrad", lr=0.1)], n_shards=2) as b:
        model = model_over(b).cuda()
        assert model[0](batches[0]).device.type == "cuda"
        losses = train(model, batches)
        gpu_rows = rows(b)[1]
    ref_losses, _, ref_rows = local_run(lambda m: train(m, [x.cpu() for x in batches]))
    np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
    np.testing.assert_allclose(gpu_rows, ref_rows, rtol=1e-5, atol=1e-6)
