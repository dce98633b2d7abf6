"""Collections over bank tables: every table in one message per shard, trained as torch's bags, input as TorchRec's.

A model of three tables (one serving two features) trains the same through a collection and through
``torch.nn.EmbeddingBag(sparse=True)`` with torch's Adagrad; what travels is counted by
the bank's counters on a 2-shard Dask bank: one message per shard per step, whatever the number of tables.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch

from carls_dask.bank import KnowledgeBank
from carls_dask.errors import ConfigError, InvalidBatchError
from carls_dask.nn import (
    BankEmbeddingBag,
    BankEmbeddingBagCollection,
    BankEmbeddingCollection,
    BankTableConfig,
    JaggedTensor,
    KeyedJaggedTensor,
    initial_rows,
)
from tests.nn.tables import rows_by_key, table

pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")

N, D, B, STEPS = 50, 4, 16, 8
TABLES = ("users", "items", "tags")


def specs() -> list[Any]:
    return [table(t, "adagrad", dim=D, lr=0.1, adagrad_initial_accumulator=0.1) for t in TABLES]


def configs() -> list[BankTableConfig]:
    return [BankTableConfig("users"), BankTableConfig("items", feature_names=("item", "history"), pooling="mean"),
            BankTableConfig("tags", pooling="sum")]


def batches(seed: int = 0) -> list[dict[str, torch.Tensor]]:
    rng = np.random.default_rng(seed)
    return [{"users": torch.from_numpy(rng.integers(0, N, B)), "item": torch.from_numpy(rng.integers(0, N, B)),
             "history": torch.from_numpy(rng.integers(0, N, (B, 3))),
             "tags": torch.from_numpy(rng.integers(0, N, (B, 2)))} for _ in range(STEPS)]


class Head(torch.nn.Module):
    """Four pooled features to one number."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.lin = torch.nn.Linear(4 * D, 1)

    def forward(self, blocks: list[torch.Tensor]) -> torch.Tensor:
        return self.lin(torch.tanh(torch.cat(blocks, dim=1))).squeeze(1)


def train_collection(ebc: BankEmbeddingBagCollection, data: list[dict[str, torch.Tensor]],
                     prefetch: bool = False) -> list[float]:
    head = Head()
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    losses = []
    for i, b in enumerate(data):
        if prefetch and i + 1 < len(data):
            ebc.prefetch(data[i + 1])
        kt = ebc(b)
        loss = ((head([kt[f] for f in ("users", "item", "history", "tags")]) - 1.0) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    ebc.flush()
    return losses


def train_layers(layers: dict[str, torch.nn.Module], data: list[dict[str, torch.Tensor]]) -> list[float]:
    """The same model with one bag per feature (the in-process one sharing a bag between item and history)."""
    head = Head()
    opt = torch.optim.SGD(head.parameters(), lr=0.1)
    dense_opt = [o for o in layers.get("_opt", [])]  # type: ignore[attr-defined]
    losses = []
    for b in data:
        blocks = [layers["users"](b["users"][:, None]), layers["items"](b["item"][:, None]),
                  layers["items"](b["history"]), layers["tags"](b["tags"])]
        loss = ((head(blocks) - 1.0) ** 2).mean()
        opt.zero_grad()
        for o in dense_opt:
            o.zero_grad()
        loss.backward()
        opt.step()
        for o in dense_opt:
            o.step()
        losses.append(float(loss.detach()))
    return losses


def bank_rows(bank: KnowledgeBank) -> dict[str, np.ndarray]:
    """Every table's keys and rows (slots included), in key order."""
    out = {}
    for t in TABLES:
        keys = np.sort(bank.keys(t))
        out[t] = np.concatenate([keys[:, None].astype(np.float64), rows_by_key(bank, t, keys),
                                 rows_by_key(bank, t, keys, "slot/embedding/accumulator")], axis=1)
    return out


def test_a_collection_and_separate_layers_train_as_torch_embedding_bags() -> None:
    """Two features of one table are pooled from one read and their gradients pushed as one (summed), as torch
    sums the gradients of a bag used twice before its optimizer steps; separate layers, one of them called
    twice a step, push that table's gradients as one update too."""
    data = batches()
    with KnowledgeBank.local(specs(), n_shards=2) as bank:
        losses = train_collection(BankEmbeddingBagCollection(bank, configs()), data)
        bank.lookup("users", np.arange(N), insert=True)  # every row present for the comparison
        ours = {t: bank.lookup(t, np.arange(N)).values["embedding"] for t in TABLES}
        spec = {t: bank.spec(t) for t in TABLES}
    with KnowledgeBank.local(specs(), n_shards=2) as bank:  # separate layers, "items" used twice a step
        layers = {"users": BankEmbeddingBag(bank, "users", mode="sum"),
                  "items": BankEmbeddingBag(bank, "items", mode="mean"),
                  "tags": BankEmbeddingBag(bank, "tags", mode="sum")}
        np.testing.assert_allclose(train_layers(layers, data), losses, rtol=1e-6)
        bank.lookup("users", np.arange(N), insert=True)
        for t in TABLES:  # the two pushes of "items" in a step went as one update, as the collection's
            np.testing.assert_allclose(bank.lookup(t, np.arange(N)).values["embedding"], ours[t], rtol=1e-6,
                                       atol=1e-7)
    # in-process torch bags from the same initial rows, trained by torch's Adagrad of the same semantics
    bags = {}
    for t, mode in (("users", "sum"), ("items", "mean"), ("tags", "sum")):
        bag = torch.nn.EmbeddingBag(N, D, mode=mode, sparse=True)
        with torch.no_grad():
            bag.weight.copy_(torch.from_numpy(initial_rows(spec[t], "embedding", np.arange(N))))
        bags[t] = bag
    torch_layers: dict[str, Any] = dict(bags)
    torch_layers["_opt"] = [torch.optim.Adagrad([b.weight for b in bags.values()], lr=0.1,
                                                initial_accumulator_value=0.1, eps=0.0)]
    ref = train_layers(torch_layers, data)
    np.testing.assert_allclose(losses, ref, rtol=1e-5)
    for t in TABLES:
        np.testing.assert_allclose(ours[t], bags[t].weight.detach().numpy(), rtol=1e-5, atol=1e-6)


def test_a_keyed_jagged_input_reads_as_the_dict_it_stands_for() -> None:
    with KnowledgeBank.local(specs(), n_shards=2) as bank:
        ebc = BankEmbeddingBagCollection(bank, configs()).eval()
        b = batches(1)[0]
        lengths = torch.cat([torch.ones(B, dtype=torch.int64), torch.ones(B, dtype=torch.int64),
                             torch.full((B,), 3), torch.full((B,), 2)])
        values = torch.cat([b["users"], b["item"], b["history"].reshape(-1), b["tags"].reshape(-1)])
        kjt = KeyedJaggedTensor.from_lengths_sync(["users", "item", "history", "tags"], values, lengths)
        with torch.no_grad():
            a, c = ebc(b), ebc(kjt)
        assert a.keys() == c.keys() == ["users", "item", "history", "tags"] and a.values().shape == (B, 4 * D)
        torch.testing.assert_close(a.values(), c.values(), rtol=0, atol=0)
        # unpooled: the rows of every key, shaped as the keys (or jagged as the input)
        ec = BankEmbeddingCollection(bank, configs()).eval()
        with torch.no_grad():
            rows = ec(b)
            jag = ec(kjt)
        assert rows["history"].shape == (B, 3, D) and isinstance(jag["history"], JaggedTensor)
        torch.testing.assert_close(jag["history"].values(), rows["history"].reshape(-1, D), rtol=0, atol=0)
        torch.testing.assert_close(rows["history"].mean(dim=1), a["history"], rtol=1e-6, atol=1e-7)
        assert bank.size() == 0  # evaluation inserts nothing


def test_bad_collections_and_inputs_are_refused_before_anything_is_inserted() -> None:
    with KnowledgeBank.local(specs(), n_shards=2) as bank:
        with pytest.raises(ConfigError, match=r"features .* repeat"):
            BankEmbeddingBagCollection(bank, [BankTableConfig("users"), BankTableConfig("items",
                                                                                       feature_names=("users",))])
        with pytest.raises(ConfigError, match="repeat"):
            BankEmbeddingBagCollection(bank, [BankTableConfig("users"), BankTableConfig("users")])
        ebc = BankEmbeddingBagCollection(bank, configs())
        b = batches()[0]
        with pytest.raises(InvalidBatchError, match=r"no feature \['tags'\]"):
            ebc({k: v for k, v in b.items() if k != "tags"})
        with pytest.raises(InvalidBatchError, match="one batch"):
            ebc({**b, "tags": b["tags"][:3]})
        with pytest.raises(InvalidBatchError, match="expected a KeyedJaggedTensor"):
            ebc([b["users"]])
        assert bank.size() == 0


@pytest.mark.parametrize("prefetch", [False, True])
def test_a_step_of_any_number_of_tables_sends_one_message_per_shard(client: Any, prefetch: bool) -> None:
    """Counted by the bank: reads of three tables and the previous step's pushes travel together."""
    data = batches(2)
    with KnowledgeBank.create(client, specs(), n_shards=2) as bank:
        ebc = BankEmbeddingBagCollection(bank, configs(), staleness=1)
        losses = train_collection(ebc, data, prefetch=prefetch)
        c = bank.counters
        # STEPS sends of one message to each shard, and the last step's pushes sent by flush()
        assert (c.sends, c.messages) == (STEPS + 1, 2 * (STEPS + 1))
        assert c.operations == 3 * STEPS + 3 * STEPS  # every table read and pushed at every step
        rows = bank_rows(bank)
    with KnowledgeBank.local(specs(), n_shards=2) as ref:
        ref_losses = train_collection(BankEmbeddingBagCollection(ref, configs(), staleness=1), data, prefetch=prefetch)
        assert losses == ref_losses
        for t, r in bank_rows(ref).items():
            np.testing.assert_array_equal(rows[t], r)


def test_separate_layers_share_a_step_s_message_when_prefetched(client: Any) -> None:
    data = batches(3)
    with KnowledgeBank.create(client, specs(), n_shards=2) as bank:
        layers = {"users": BankEmbeddingBag(bank, "users", mode="sum"),
                  "items": BankEmbeddingBag(bank, "items", mode="mean"),
                  "tags": BankEmbeddingBag(bank, "tags", mode="sum")}
        head = Head()
        for i, b in enumerate(data):
            if i + 1 < STEPS:  # the documented loop: the next batch's rows first
                nb = data[i + 1]
                layers["users"].prefetch(nb["users"][:, None])
                layers["items"].prefetch(nb["item"][:, None])
                layers["items"].prefetch(nb["history"])
                layers["tags"].prefetch(nb["tags"])
            blocks = [layers["users"](b["users"][:, None]), layers["items"](b["item"][:, None]),
                      layers["items"](b["history"]), layers["tags"](b["tags"])]
            head(blocks).sum().backward()
        layers["tags"].flush()
        # the first step reads four times (nothing prefetched yet); every later step sends one message per shard
        assert bank.counters.messages == 2 * (4 + (STEPS - 1) + 1)


def test_rows_a_layer_trains_carry_the_trainer_s_name_and_step() -> None:
    with KnowledgeBank.local(specs(), n_shards=2) as bank:
        ebc = BankEmbeddingBagCollection(bank, configs())
        b = batches(4)[0]
        bank.set_writer("recommender", 41)
        ebc(b).values().sum().backward()
        ebc.flush()
        got = bank.lookup("tags", b["tags"].reshape(-1).numpy())
        assert set(got.model_step.tolist()) == {41}
        state = [s for s in bank.export_state() if len(s["tables"]["tags"]["keys"])]
        makers = {s["meta"]["makers"][c] for s in state for c in s["tables"]["tags"]["prov/maker"]}
        assert makers == {"recommender"}
        bank.set_writer(None)
        ebc(b).values().sum().backward()
        ebc.flush()
        assert set(bank.lookup("tags", b["tags"].reshape(-1).numpy()).model_step.tolist()) == {41}  # kept
