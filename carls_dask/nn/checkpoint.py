"""A model's checkpoint and its bank as one consistent pair: dense weights and bank rows of the same step.

A :class:`~carls_dask.nn.BankLayer`'s rows live in the bank, not in the module, so ``model.state_dict()``
holds the dense layers only. Each bank layer adds a record to it (torch's *extra state*, key
``<layer>._extra_state``): the bank's name and lineage, the table and column, and the bank snapshot that
holds the layer's rows at the checkpoint's step, when the state dict was taken by :func:`checkpoint_state`
(``None`` for a plain ``model.state_dict()``, which is taken at no particular snapshot).

- :func:`checkpoint_state` snapshots the bank of the model's bank layers into a bank store at ``step``
  (after every pending gradient push landed) and returns ``model.state_dict()`` recording that snapshot;
  :func:`save_checkpoint` writes it to a file with torch.
- :func:`restore_bank` starts a bank at exactly that snapshot (no delta-log record after it), on Dask
  actors with a client or in this process without one; build the model over it and :func:`load_state`
  (or ``model.load_state_dict(state)``) loads a consistent pair.
- Loading a state dict that records a snapshot into a model whose bank was not restored from that
  snapshot raises :class:`~carls_dask.errors.LifecycleError` (the dense weights would meet rows of another
  step): :func:`load_state` before any tensor is loaded, ``model.load_state_dict`` when it reaches the
  layer (torch loads the modules in order). A plain state dict (snapshot ``None``) and one saved before
  bank layers had a record load as before.

This is the bank's counterpart of TorchRec's sharded ``state_dict``, where each rank's
``ShardedTensor`` shards are the embedding rows themselves and ``torch.distributed.checkpoint`` writes them
beside the dense weights; here the rows stay in the bank's store and the state dict names the snapshot
that holds them (``docs/embeddings.md`` compares the two).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import torch

from carls_dask.errors import ConfigError
from carls_dask.nn.record import RECORD_FORMAT, RESTORED, TAKING, check_record

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = [
    "bank_layers",
    "checkpoint_state",
    "load_checkpoint",
    "load_state",
    "restore_bank",
    "save_checkpoint",
    "snapshot_of",
]

def bank_layers(model: torch.nn.Module) -> list[tuple[str, Any]]:
    """The model's bank layers (:class:`~carls_dask.nn.BankLayer`), by their names in ``model``."""
    from carls_dask.nn.embedding import BankLayer

    return [(name, m) for name, m in model.named_modules() if isinstance(m, BankLayer)]


def _one_bank(model: torch.nn.Module, what: str) -> Any:
    layers = bank_layers(model)
    if not layers:
        raise ConfigError(f"{what}: {type(model).__name__} has no bank layer (BankEmbedding, BankEmbeddingBag); "
                          "expected a model with one, else model.state_dict() alone is its checkpoint")
    banks = {id(layer.bank): layer.bank for _, layer in layers}
    if len(banks) > 1:
        names = sorted(str(b.name) for b in banks.values())
        raise ConfigError(f"{what}: the model's bank layers use {len(banks)} banks {names}; expected one bank (a "
                          "bank holds many tables: put them in one)")
    return next(iter(banks.values()))


@contextlib.contextmanager
def _recording(bank: KnowledgeBank, snapshot: dict[str, Any]) -> Iterator[None]:
    token = TAKING.set({id(bank): snapshot})
    try:
        yield
    finally:
        TAKING.reset(token)


def checkpoint_state(model: torch.nn.Module, root: str | os.PathLike[str], step: int) -> dict[str, Any]:
    """Snapshot the bank of ``model``'s bank layers into ``root`` at ``step``; return ``model.state_dict()``
    recording that snapshot.

    Every layer's pending gradient pushes land first (:meth:`~carls_dask.nn.BankLayer.flush`), so the
    snapshot holds every update the dense weights have seen. Take it between steps (no backward running).

    Parameters
    ----------
    model
        A module with bank layers over one bank.
    root
        The bank store to snapshot into (e.g. ``RUN/bank``; the bank's own ``log_root`` keeps the
        snapshots beside its delta log).
    step
        The training step of the checkpoint.

    Returns
    -------
    dict
        The state dict: dense tensors, and per bank layer its record with ``snapshot`` =
        ``{"root", "version", "step"}``.

    Raises
    ------
    ConfigError
        If the model has no bank layer, or layers over several banks.
    """
    bank = _one_bank(model, "checkpoint_state")
    for _, layer in bank_layers(model):
        layer.flush()
    path = pathlib.Path(root)
    version = int(bank.snapshot(str(path), int(step)))
    snapshot = {"root": str(path.resolve()), "version": version, "step": int(step)}
    with _recording(bank, snapshot):
        return dict(model.state_dict())


def save_checkpoint(model: torch.nn.Module, path: str | os.PathLike[str], root: str | os.PathLike[str], step: int,
                    **extra: Any) -> dict[str, Any]:
    """:func:`checkpoint_state` written to ``path`` with :func:`torch.save` as ``{"model": state, "step": step,
    **extra}`` (e.g. ``optimizer=opt.state_dict()``), under a temporary name then renamed; returns what was written.
    """
    out = {"model": checkpoint_state(model, root, step), "step": int(step), **extra}
    final = pathlib.Path(path)
    tmp = final.with_name(f".{final.name}.tmp")
    torch.save(out, tmp)
    os.replace(tmp, final)
    return out


def load_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """What :func:`save_checkpoint` wrote (on the CPU)."""
    loaded: dict[str, Any] = torch.load(pathlib.Path(path), map_location="cpu", weights_only=False)
    return loaded


def load_state(model: torch.nn.Module, state: Mapping[str, Any], strict: bool = True) -> Any:
    """``model.load_state_dict(state)`` after every bank layer's record was checked against its bank, so a
    mismatch raises before any tensor of the model changed.

    ``state`` is a state dict or a checkpoint from :func:`save_checkpoint` (its ``"model"``). Returns what
    ``load_state_dict`` returns.

    Raises
    ------
    LifecycleError, ConfigError
        As :func:`~carls_dask.nn.record.check_record`, for the first bank layer whose bank does not hold the recorded rows.
    """
    model_state = state["model"] if "model" in state and isinstance(state["model"], Mapping) else state
    for name, layer in bank_layers(model):
        check_record(layer, model_state.get(f"{name}._extra_state" if name else "_extra_state"))
    return model.load_state_dict(model_state, strict=strict)


def snapshot_of(state: Mapping[str, Any]) -> dict[str, Any]:
    """The bank snapshot a state dict (or a checkpoint from :func:`save_checkpoint`) records.

    Raises
    ------
    ConfigError
        If it records none (a plain ``model.state_dict()``), or its bank layers name different snapshots.
    """
    model_state = state.get("model", state)
    records = [v for k, v in model_state.items() if k.endswith("_extra_state") and isinstance(v, Mapping)
               and v.get("format") == RECORD_FORMAT]
    snaps = {(r["snapshot"]["root"], int(r["snapshot"]["version"])): r["snapshot"] for r in records if r.get("snapshot")}
    if not snaps:
        raise ConfigError("snapshot_of: the state dict records no bank snapshot; expected one taken by "
                          "carls_dask.nn.checkpoint.checkpoint_state (a plain model.state_dict() records none)")
    if len(snaps) > 1:
        raise ConfigError(f"snapshot_of: the state dict's bank layers record {len(snaps)} snapshots {sorted(snaps)}; "
                          "expected one")
    return dict(next(iter(snaps.values())))


def restore_bank(state: Mapping[str, Any], client: Any = None, *, n_shards: int | None = None,
                 log_root: str | os.PathLike[str] | None = None, **kwargs: Any) -> Any:
    """Start the bank at exactly the snapshot ``state`` records (no delta-log record written after it).

    Parameters
    ----------
    state
        A state dict from :func:`checkpoint_state`, or a checkpoint from :func:`save_checkpoint`.
    client
        A :class:`distributed.Client` (the bank's shards become Dask actors); ``None``: in-process shards.
    n_shards
        Shards of the restored bank (default: as many as the snapshot's).
    log_root
        Bank store the restored bank logs its changes to (default none: the snapshot's store is only read).
    **kwargs
        Passed to :meth:`KnowledgeBank.restore <carls_dask.bank.KnowledgeBank.restore>` (or ``restore_local``).

    Returns
    -------
    KnowledgeBank
        A bank a model built over loads ``state`` into.
    """
    from carls_dask.bank import KnowledgeBank

    snap = snapshot_of(state)
    root, version = str(snap["root"]), int(snap["version"])
    where = None if log_root is None else str(log_root)
    if client is None:
        bank = KnowledgeBank.restore_local(root, n_shards=n_shards, version=version, replay_log=False, log_root=where,
                                           **kwargs)
    else:
        bank = KnowledgeBank.restore(client, root, n_shards=n_shards, version=version, replay_log=False,
                                     log_root=where, **kwargs)
    setattr(bank, RESTORED, (str(pathlib.Path(root).resolve()), version))
    return bank
