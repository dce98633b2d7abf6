"""BankEmbedding and BankEmbeddingBag over in-process shards: reads, inserts, gradients, eval, keys, refusals."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from carls_dask.bank import Column, KnowledgeBank, TableSpec
from carls_dask.errors import (
    ConfigError,
    InvalidBatchError,
    InvalidDTypeError,
    InvalidShapeError,
    LifecycleError,
    UnknownColumnError,
    UnknownTableError,
)
from carls_dask.nn import BankEmbedding, BankEmbeddingBag, initial_rows
from tests.bank.banks import assert_same_state, bank_state
from tests.nn.tables import DIM, table

LR = 0.05


@pytest.fixture
def bank() -> KnowledgeBank:
    with KnowledgeBank.local([table(), table("frozen", None),
                              TableSpec("mixed", columns=(Column("embedding", shape=(DIM,)),
                                                          Column("label", "int64", (), ())),
                                        optimizer="sgd", learning_rate=LR)], n_shards=2) as b:
        yield b


def test_forward_reads_the_bank_rows_for_keys_of_any_shape_and_counts_each_occurrence(bank: KnowledgeBank) -> None:
    emb = BankEmbedding(bank, "words")
    keys = torch.tensor([[[3, 1], [4, 1]], [[5, 9], [2, 6]]])
    out = emb(keys)
    assert out.shape == (2, 2, 2, DIM) and out.dtype == torch.float32 and out.requires_grad
    got = bank.lookup("words", keys.reshape(-1).numpy())
    np.testing.assert_array_equal(out.detach().reshape(-1, DIM).numpy(), got.values["embedding"])
    assert got.frequency.tolist() == [1, 2, 1, 2, 1, 1, 1, 1]  # key 1 twice in the batch
    assert list(emb.parameters()) == [] and emb.embedding_dim == DIM


def test_backward_sums_duplicate_keys_and_applies_the_tables_optimizer(bank: KnowledgeBank) -> None:
    emb = BankEmbedding(bank, "words")
    keys = np.array([7, 8, 7, 7])
    out = emb(torch.from_numpy(keys))
    before = out.detach().numpy()[[0, 1]].copy()  # the rows as allocated
    weights = torch.arange(4 * DIM, dtype=torch.float32).reshape(4, DIM) / 10
    (out * weights).sum().backward()
    after = bank.lookup("words", [7, 8]).values["embedding"]
    g7 = (weights[0] + weights[2] + weights[3]).numpy()
    np.testing.assert_allclose(after[0], before[0] - np.float32(LR) * g7, rtol=1e-6)
    np.testing.assert_array_equal(after[1], before[1] - np.float32(LR) * weights[1].numpy())


def test_eval_and_no_grad_read_only_and_unseen_keys_read_their_initial_value(bank: KnowledgeBank) -> None:
    emb = BankEmbedding(bank, "words")
    emb(torch.tensor([1, 2]))
    state = bank_state(bank)
    with torch.no_grad():
        a = emb(torch.tensor([1, 50, 51]))
    with torch.inference_mode():
        b = emb(torch.tensor([1, 50, 51]))
    emb.eval()
    c = emb(torch.tensor([1, 50, 51]))
    assert not a.requires_grad and not c.requires_grad
    assert_same_state(state, bank_state(bank))  # nothing inserted, no frequency counted
    emb.train()
    inserted = emb(torch.tensor([1, 50, 51])).detach()
    for x in (a, b, c):  # unseen keys read exactly what insertion then allocates
        np.testing.assert_array_equal(x.numpy(), inserted.numpy())


@pytest.mark.parametrize("initializer,dtype", [("normal", "float32"), ("uniform", "float32"), ("zeros", "float32"),
                                               ("constant", "float32"), ("normal", "float64"), ("normal", "float16")])
def test_initial_rows_are_the_values_the_bank_allocates(initializer: str, dtype: str) -> None:
    spec = TableSpec("t", columns=(Column("embedding", dtype, (3, 2), ("a", "b")),), optimizer="adagrad", learning_rate=0.1,
                     initializer=initializer, init_scale=0.3, seed=7)
    keys = np.array([0, -5, 2**40, 17], dtype=np.int64)
    with KnowledgeBank.local([spec], n_shards=2) as b:
        allocated = b.lookup("t", keys, insert=True).values["embedding"]
        np.testing.assert_array_equal(initial_rows(b.spec("t"), "embedding", keys), allocated)


def test_string_and_integer_keys_agree_with_bank_lookup(bank: KnowledgeBank) -> None:
    emb = BankEmbedding(bank, "words")
    words = [["cat", "dog"], ["emu", "cat"]]
    by_str = emb(words).detach()
    assert by_str.shape == (2, 2, DIM)
    flat = [w for row in words for w in row]
    np.testing.assert_array_equal(by_str.reshape(-1, DIM).numpy(), bank.lookup("words", flat).values["embedding"])
    np.testing.assert_array_equal(emb(np.array(words)).detach().numpy(), by_str.numpy())
    hashed = bank.lookup("words", flat)  # the bank's own hashing: the same rows by their int64 keys
    from carls_dask.bank import to_int64_keys

    ints = torch.from_numpy(to_int64_keys(flat).reshape(2, 2))
    np.testing.assert_array_equal(emb(ints).detach().reshape(-1, DIM).numpy(), hashed.values["embedding"])
    assert bank.lookup("words", ["cat"]).frequency[0] == 2 + 2 + 2  # twice in each of the three training reads


def test_padding_key_reads_zeros_is_never_inserted_and_gets_no_gradient(bank: KnowledgeBank) -> None:
    emb = BankEmbedding(bank, "words", padding_key="")
    out = emb([["a", ""], ["", "b"]])
    assert torch.count_nonzero(out[0, 1]) == 0 and torch.count_nonzero(out[1, 0]) == 0
    out.sum().backward()
    assert not bank.contains("words", [""])[0] and bank.size("words") == 2
    pad_only = BankEmbedding(bank, "words", padding_key=4)(torch.tensor([4, 4]))
    assert torch.count_nonzero(pad_only) == 0 and not bank.contains("words", [4])[0]


def test_modules_follow_torch_conventions(bank: KnowledgeBank) -> None:
    emb = BankEmbedding(bank, "words", learning_rate=0.5)
    assert repr(emb) == "BankEmbedding(table='words', column='embedding', embedding_dim=8, optimizer='sgd', " \
                        "learning_rate=0.5)"
    bag = BankEmbeddingBag(bank, "words", mode="max", padding_key=0)
    assert "mode='max'" in repr(bag) and "padding_key=0" in repr(bag)
    model = torch.nn.Sequential(emb, torch.nn.Linear(DIM, 1)).double()
    assert model[0](torch.tensor([1])).dtype == torch.float64 and "_anchor" not in model.state_dict()
    before = bank.lookup("words", [1]).values["embedding"].copy()
    model(torch.tensor([1])).sum().backward()  # float64 gradients reach the float32 table
    assert not np.array_equal(bank.lookup("words", [1]).values["embedding"], before)
    frozen = BankEmbedding(bank, "frozen", trainable=False)
    assert not frozen(torch.tensor([1])).requires_grad


def _dense(bank: KnowledgeBank, keys: np.ndarray) -> torch.nn.Parameter:
    return torch.nn.Parameter(torch.from_numpy(bank.lookup("words", keys).values["embedding"].copy()))


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_bag_pools_and_back_propagates_as_torch_embedding_bag(bank: KnowledgeBank, mode: str) -> None:
    keys = np.array([3, 5, 3, 9, 0, 5, 11, 0], dtype=np.int64)
    offsets = torch.tensor([0, 3, 3, 6])  # bags [3 5 3] [] [9 0 5] [11 0]; key 0 is padding
    bag = BankEmbeddingBag(bank, "words", mode=mode, padding_key=0)
    bag.eval()
    with torch.no_grad():
        bag(torch.from_numpy(keys), offsets)  # a read: nothing is inserted
    assert bank.size("words") == 0
    bag.train()
    out = bag(torch.from_numpy(keys), offsets)
    uniq = np.array([3, 5, 9, 11])
    weight = _dense(bank, uniq)
    idx = torch.from_numpy(np.searchsorted(uniq, np.where(keys == 0, 3, keys)))
    pad_pos = torch.from_numpy(keys == 0)
    ref_weight = torch.cat([weight, torch.zeros(1, DIM)])
    ref = torch.nn.functional.embedding_bag(torch.where(pad_pos, 4, idx), ref_weight, offsets, mode=mode,
                                           padding_idx=4)
    np.testing.assert_array_equal(out.detach().numpy(), ref.detach().numpy())
    target = torch.randn(4, DIM, generator=torch.Generator().manual_seed(0))
    (out * target).sum().backward()
    (ref * target).sum().backward()
    expect = weight.detach().numpy() - np.float32(LR) * weight.grad.numpy()
    np.testing.assert_allclose(bank.lookup("words", uniq).values["embedding"], expect, rtol=1e-6, atol=1e-7)
    assert not bank.contains("words", [0])[0]


def test_bag_takes_2d_input_per_sample_weights_and_include_last_offset(bank: KnowledgeBank) -> None:
    bag = BankEmbeddingBag(bank, "words", mode="sum")
    two_d = bag(torch.tensor([[1, 2], [3, 4]]), per_sample_weights=torch.tensor([[1.0, 2.0], [0.5, 0.0]]))
    rows = bank.lookup("words", [1, 2, 3, 4]).values["embedding"]
    np.testing.assert_allclose(two_d.detach().numpy(), [rows[0] + 2 * rows[1], 0.5 * rows[2]], rtol=1e-6)
    last = BankEmbeddingBag(bank, "words", mode="sum", include_last_offset=True)
    same = last(torch.tensor([1, 2, 3, 4]), torch.tensor([0, 2, 4]),
                per_sample_weights=torch.tensor([1.0, 2.0, 0.5, 0.0]))
    np.testing.assert_array_equal(same.detach().numpy(), two_d.detach().numpy())


BAD_FORWARDS = {
    "float keys": (lambda b: BankEmbedding(b, "words")(torch.tensor([1.0, 2.0])), InvalidDTypeError, "float32"),
    "bool keys": (lambda b: BankEmbedding(b, "words")(torch.tensor([True])), InvalidDTypeError, "bool"),
    "mixed keys": (lambda b: BankEmbedding(b, "words")([1, "a"]), InvalidDTypeError, "all integers or all strings"),
    "ragged keys": (lambda b: BankEmbedding(b, "words")([[1, 2], [3]]), InvalidShapeError, "ragged"),
    "one string": (lambda b: BankEmbedding(b, "words")("cat"), InvalidShapeError, "a single str"),
    "huge key": (lambda b: BankEmbedding(b, "words")(np.array([2**63], dtype=np.uint64)), InvalidBatchError,
                 "int64 range"),
    "no offsets": (lambda b: BankEmbeddingBag(b, "words")(torch.tensor([1, 2])), InvalidShapeError, "offsets"),
    "offsets not at 0": (lambda b: BankEmbeddingBag(b, "words")(torch.tensor([1, 2]), torch.tensor([1])),
                         InvalidBatchError, "offsets[0] == 0"),
    "offsets past the end": (lambda b: BankEmbeddingBag(b, "words")(torch.tensor([1, 2]), torch.tensor([0, 3])),
                             InvalidBatchError, "within [0, 2]"),
    "offsets decreasing": (lambda b: BankEmbeddingBag(b, "words")(torch.tensor([1, 2, 3]), torch.tensor([0, 2, 1])),
                           InvalidBatchError, "non-decreasing"),
    "offsets with 2-D input": (lambda b: BankEmbeddingBag(b, "words")(torch.tensor([[1, 2]]), torch.tensor([0])),
                               InvalidShapeError, "offsets=None"),
    "last offset": (lambda b: BankEmbeddingBag(b, "words", include_last_offset=True)(
        torch.tensor([1, 2]), torch.tensor([0, 1])), InvalidBatchError, "last offset"),
    "weights with mean": (lambda b: BankEmbeddingBag(b, "words")(torch.tensor([[1, 2]]),
                                                                 per_sample_weights=torch.ones(1, 2)),
                          ConfigError, "mode='sum'"),
    "weights of another shape": (lambda b: BankEmbeddingBag(b, "words", mode="sum")(
        torch.tensor([[1, 2]]), per_sample_weights=torch.ones(2)), InvalidShapeError, "per_sample_weights"),
}


@pytest.mark.parametrize("case", sorted(BAD_FORWARDS))
def test_bad_input_is_refused_before_anything_is_inserted_or_updated(bank: KnowledgeBank, case: str) -> None:
    BankEmbedding(bank, "words")(torch.tensor([1, 2, 3])).sum().backward()
    state = bank_state(bank)
    call, error, needle = BAD_FORWARDS[case]
    with pytest.raises(error, match="words") as info:
        call(bank)
    assert needle in str(info.value)
    assert_same_state(state, bank_state(bank))


def test_bad_layers_are_refused_when_built(bank: KnowledgeBank) -> None:
    with pytest.raises(UnknownTableError, match="nope"):
        BankEmbedding(bank, "nope")
    with pytest.raises(UnknownColumnError, match="its columns are"):
        BankEmbedding(bank, "words", "weights")
    with pytest.raises(InvalidDTypeError, match="expected a float column"):
        BankEmbedding(bank, "mixed", "label")
    with pytest.raises(InvalidBatchError, match="has no optimizer"):
        BankEmbedding(bank, "frozen")
    with pytest.raises(ConfigError, match="mode='median'"):
        BankEmbeddingBag(bank, "words", mode="median")
    with pytest.raises(ConfigError, match="staleness=-1"):
        BankEmbedding(bank, "words", staleness=-1)
    with pytest.raises(InvalidDTypeError, match="padding_key"):
        BankEmbedding(bank, "words", padding_key=1.5)  # type: ignore[arg-type]


def test_a_closed_bank_is_refused_and_a_local_bank_does_not_pickle() -> None:
    import pickle

    b = KnowledgeBank.local([table()], n_shards=2)
    emb = BankEmbedding(b, "words")
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(emb)
    b.close()
    with pytest.raises(LifecycleError, match="closed"):
        emb(torch.tensor([1]))
