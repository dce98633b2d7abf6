"""A model's checkpoint and its bank as one pair (carls_dask.nn.checkpoint), and a bank whose client was closed."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from carls_dask.bank import KnowledgeBank
from carls_dask.errors import ConfigError, LifecycleError
from carls_dask.nn import BankEmbedding
from carls_dask.nn.checkpoint import (
    checkpoint_state,
    load_checkpoint,
    load_state,
    restore_bank,
    save_checkpoint,
    snapshot_of,
)
from tests.nn.tables import table

KEYS = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])


class Tower(torch.nn.Module):
    """Dense weights around a bank layer: what a checkpoint has to keep in step with the bank."""

    def __init__(self, bank: KnowledgeBank) -> None:
        super().__init__()
        self.dense = torch.nn.Linear(8, 8)
        self.emb = BankEmbedding(bank, "words")
        self.head = torch.nn.Linear(8, 1)

    def forward(self, keys: torch.Tensor) -> torch.Tensor:
        return self.head(self.dense(self.emb(keys))).square().mean()


def _train(model: Tower, steps: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        opt.zero_grad()
        model(KEYS).backward()
        opt.step()


def _rows(bank: KnowledgeBank) -> np.ndarray:
    return np.asarray(bank.lookup("words", KEYS.numpy()).values["embedding"]).copy()


def test_a_checkpoint_restores_dense_weights_and_bank_rows_of_the_same_step(tmp_path: pathlib.Path) -> None:
    torch.manual_seed(0)
    root = tmp_path / "bank"
    bank = KnowledgeBank.local([table()], n_shards=2, log_root=str(root))
    model = Tower(bank)
    _train(model, 3)
    written = save_checkpoint(model, tmp_path / "model.pt", root, step=3)
    rows_at_3 = _rows(bank)
    dense_at_3 = {k: v.clone() for k, v in model.state_dict().items() if isinstance(v, torch.Tensor)}
    record = written["model"]["emb._extra_state"]
    assert record["snapshot"] == {"root": str(root.resolve()), "version": 1, "step": 3}
    assert (record["table"], record["column"], record["lineage"]) == ("words", "embedding", bank.lineage)
    assert model.state_dict()["emb._extra_state"]["snapshot"] is None  # a plain state_dict names no snapshot

    _train(model, 3)  # the bank and the dense weights move on
    rows_at_6, head_at_6 = _rows(bank), model.head.weight.detach().clone()
    assert not np.allclose(rows_at_6, rows_at_3)
    with pytest.raises(LifecycleError, match=r"BankEmbedding\(table 'words'\): this checkpoint's rows are bank snapshot "
                                             r"v1 \(step 3\) of .*, but the layer's bank .* was not restored from it"):
        load_state(model, written)
    assert not torch.equal(model.dense.weight, dense_at_3["dense.weight"])  # refused before any tensor was loaded
    bank.close()

    state = load_checkpoint(tmp_path / "model.pt")
    assert snapshot_of(state) == record["snapshot"] and state["step"] == 3
    restored = restore_bank(state)  # in this process: exactly the snapshot, not the log written after it
    again = Tower(restored)
    load_state(again, state)
    np.testing.assert_array_equal(_rows(restored), rows_at_3)
    for name, value in dense_at_3.items():
        assert torch.equal(again.state_dict()[name], value), name
    # The restored pair trains on as the original did from step 3 (same rows, same weights, same batches).
    _train(again, 3)
    np.testing.assert_allclose(_rows(restored), rows_at_6, rtol=1e-6)
    torch.testing.assert_close(again.head.weight.detach(), head_at_6)
    restored.close()


def test_plain_and_older_state_dicts_still_load(tmp_path: pathlib.Path) -> None:
    bank = KnowledgeBank.local([table()], n_shards=1)
    model = Tower(bank)
    state = model.state_dict()
    other = Tower(bank)
    other.load_state_dict(state)  # a plain state dict names no snapshot: nothing to check
    older = {k: v for k, v in state.items() if not k.endswith("_extra_state")}  # saved before layers had a record
    assert not other.load_state_dict(older).missing_keys
    with pytest.raises(ConfigError, match=r"the state dict records no bank snapshot"):
        snapshot_of(state)
    with pytest.raises(ConfigError, match=r"Linear has no bank layer"):
        checkpoint_state(torch.nn.Linear(2, 2), tmp_path / "bank", 1)
    bank.close()


def test_restore_on_the_cluster(client: object, tmp_path: pathlib.Path) -> None:
    torch.manual_seed(1)
    root = tmp_path / "bank"
    bank = KnowledgeBank.create(client, [table()], n_shards=2, log_root=str(root))
    model = Tower(bank)
    _train(model, 2)
    state = checkpoint_state(model, root, step=2)
    rows = _rows(bank)
    _train(model, 2)
    restored = restore_bank(state, client, n_shards=1)  # Dask actors, on another shard count
    try:
        again = Tower(restored)
        load_state(again, state)
        np.testing.assert_array_equal(_rows(restored), rows)
    finally:
        restored.close()
        bank.close()


def test_a_bank_whose_client_was_closed_says_so_in_its_own_words(local_cluster: object) -> None:
    from distributed import Client

    c = Client(local_cluster)  # type: ignore[arg-type]
    bank = KnowledgeBank.create(c, [table()], n_shards=2, name="closing")
    layer = BankEmbedding(bank, "words")
    assert layer(KEYS).shape == (8, 8)
    c.close()
    said = (r"^bank 'closing': the Dask client it reaches its shards through is closed, so no call can reach them; "
            r"keep the client open while the bank is used .* KnowledgeBank.restore\(client, RUN/bank\)$")
    with pytest.raises(LifecycleError, match=said):
        layer(KEYS)
    with pytest.raises(LifecycleError, match=said):
        bank.lookup("words", [1])
    with pytest.raises(LifecycleError, match=said):
        bank.close()
    bank.close()  # closed now: a second close is quiet
