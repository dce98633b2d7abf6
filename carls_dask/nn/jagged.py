"""Many features' keys in one input, and pooled rows by feature: TorchRec's jagged types, for the bank's collections.

:class:`KeyedJaggedTensor` holds the keys of several sparse features for one batch, each sample having
any number of keys per feature, laid out as TorchRec lays them out: ``values`` is every key,
feature-major (all of feature 0's keys for samples 0, 1, ..., then feature 1's ...), and ``lengths`` has
one entry per (feature, sample) in the same order. :class:`JaggedTensor` is one feature's part;
:class:`KeyedTensor` is the pooled output of :class:`~carls_dask.nn.collection.BankEmbeddingBagCollection`
(one ``[batch, dim]`` block per feature, side by side). The names and methods are TorchRec's, so a model
written for ``torchrec.EmbeddingBagCollection`` feeds the bank's collection the same input (a TorchRec
``KeyedJaggedTensor`` is accepted as it is).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from carls_dask.errors import InvalidBatchError, InvalidShapeError

__all__ = ["JaggedTensor", "KeyedJaggedTensor", "KeyedTensor", "as_jagged_features"]


def _offsets_of(lengths: torch.Tensor) -> torch.Tensor:
    out = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    torch.cumsum(lengths.to(torch.int64), 0, out=out[1:])
    return out


class JaggedTensor:
    """One feature's keys (or rows) for a batch: ``values`` of every sample one after the other, ``lengths`` per sample.

    Parameters
    ----------
    values
        ``[n, ...]``: the samples' entries, concatenated.
    lengths
        ``int[batch]``: entries of each sample (give ``lengths`` or ``offsets``).
    offsets
        ``int[batch + 1]``: where each sample's entries start, and the end.
    weights
        Optional ``float[n]``, one weight per entry (``per_sample_weights`` of a ``sum`` bag).
    """

    def __init__(self, values: torch.Tensor, lengths: torch.Tensor | None = None, offsets: torch.Tensor | None = None,
                 weights: torch.Tensor | None = None) -> None:
        if (lengths is None) == (offsets is None):
            raise InvalidBatchError(f"JaggedTensor: lengths given: {lengths is not None}, offsets given: "
                                    f"{offsets is not None}; expected exactly one of them")
        self._values = values
        if lengths is None:
            assert offsets is not None
            self._offsets = torch.as_tensor(offsets, dtype=torch.int64)
            self._lengths = self._offsets[1:] - self._offsets[:-1]
        else:
            self._lengths = torch.as_tensor(lengths, dtype=torch.int64)
            self._offsets = _offsets_of(self._lengths)
        if int(self._offsets[-1]) != int(values.shape[0]) or bool((self._lengths < 0).any()):
            raise InvalidShapeError(f"JaggedTensor: lengths add up to {int(self._offsets[-1])} entries with none "
                                    f"negative expected, for {int(values.shape[0])} values")
        self._weights = weights

    def values(self) -> torch.Tensor:
        """Every sample's entries, concatenated."""
        return self._values

    def lengths(self) -> torch.Tensor:
        """Entries of each sample."""
        return self._lengths

    def offsets(self) -> torch.Tensor:
        """Where each sample's entries start (and the end)."""
        return self._offsets

    def weights_or_none(self) -> torch.Tensor | None:
        """The per-entry weights, if any."""
        return self._weights

    def to_dense(self) -> list[torch.Tensor]:
        """One tensor per sample."""
        return list(torch.split(self._values, self._lengths.tolist()))

    def __repr__(self) -> str:
        return f"JaggedTensor(values={tuple(self._values.shape)}, batch={self._lengths.numel()})"


class KeyedJaggedTensor:
    """Several sparse features' keys for one batch, laid out as TorchRec's ``KeyedJaggedTensor``.

    Parameters
    ----------
    keys
        Feature names.
    values
        Every key, feature-major: feature 0's keys of samples 0, 1, ..., then feature 1's, ...
    lengths
        ``int[len(keys) * batch]``: keys of each (feature, sample), in the order of ``values``.
    offsets
        ``int[len(keys) * batch + 1]`` instead of ``lengths``.
    weights
        Optional ``float`` weight per key.

    Examples
    --------
    >>> kjt = KeyedJaggedTensor.from_lengths_sync(["user", "history"], torch.tensor([7, 8, 1, 2, 3, 4]),
    ...                                           torch.tensor([1, 1, 3, 1]))
    >>> kjt["history"].to_dense()
    [tensor([1, 2, 3]), tensor([4])]
    """

    def __init__(self, keys: Sequence[str], values: torch.Tensor, lengths: torch.Tensor | None = None,
                 offsets: torch.Tensor | None = None, weights: torch.Tensor | None = None) -> None:
        self._keys = [str(k) for k in keys]
        if len(set(self._keys)) != len(self._keys) or not self._keys:
            raise InvalidBatchError(f"KeyedJaggedTensor: keys {self._keys}; expected distinct feature names")
        self._jagged = JaggedTensor(values, lengths, offsets, weights)
        n = self._jagged.lengths().numel()
        if n % len(self._keys):
            raise InvalidShapeError(f"KeyedJaggedTensor: {n} lengths for {len(self._keys)} keys; expected "
                                    "len(keys) * batch lengths")
        self._stride = n // len(self._keys)

    @classmethod
    def from_lengths_sync(cls, keys: Sequence[str], values: torch.Tensor, lengths: torch.Tensor,
                          weights: torch.Tensor | None = None) -> KeyedJaggedTensor:
        """TorchRec's constructor: keys, values and lengths."""
        return cls(keys, values, lengths=lengths, weights=weights)

    @classmethod
    def from_offsets_sync(cls, keys: Sequence[str], values: torch.Tensor, offsets: torch.Tensor,
                          weights: torch.Tensor | None = None) -> KeyedJaggedTensor:
        """TorchRec's constructor: keys, values and offsets."""
        return cls(keys, values, offsets=offsets, weights=weights)

    @classmethod
    def from_jt_dict(cls, features: Mapping[str, JaggedTensor]) -> KeyedJaggedTensor:
        """One :class:`JaggedTensor` per feature, all of the same batch."""
        keys = list(features)
        jts = [features[k] for k in keys]
        batch = {jt.lengths().numel() for jt in jts}
        if len(batch) != 1:
            raise InvalidShapeError(f"KeyedJaggedTensor.from_jt_dict: batches of {sorted(batch)} samples; expected "
                                    "every feature to have the same batch")
        weights = [jt.weights_or_none() for jt in jts]
        w = None if all(x is None for x in weights) else torch.cat(
            [x if x is not None else torch.ones(jt.values().shape[0]) for x, jt in zip(weights, jts, strict=True)])
        return cls(keys, torch.cat([jt.values() for jt in jts]), lengths=torch.cat([jt.lengths() for jt in jts]),
                   weights=w)

    def keys(self) -> list[str]:
        """Feature names."""
        return list(self._keys)

    def values(self) -> torch.Tensor:
        """Every key, feature-major."""
        return self._jagged.values()

    def lengths(self) -> torch.Tensor:
        """Keys of each (feature, sample)."""
        return self._jagged.lengths()

    def offsets(self) -> torch.Tensor:
        """Where each (feature, sample)'s keys start (and the end)."""
        return self._jagged.offsets()

    def weights_or_none(self) -> torch.Tensor | None:
        """The per-key weights, if any."""
        return self._jagged.weights_or_none()

    def stride(self) -> int:
        """Samples in the batch."""
        return self._stride

    def __getitem__(self, key: str) -> JaggedTensor:
        if key not in self._keys:
            raise InvalidBatchError(f"KeyedJaggedTensor: no feature {key!r}; features are {self._keys}")
        f = self._keys.index(key)
        b = self._stride
        off = self.offsets()
        start, end = int(off[f * b]), int(off[(f + 1) * b])
        w = self.weights_or_none()
        return JaggedTensor(self.values()[start:end], lengths=self.lengths()[f * b:(f + 1) * b],
                            weights=None if w is None else w[start:end])

    def to_dict(self) -> dict[str, JaggedTensor]:
        """One :class:`JaggedTensor` per feature."""
        return {k: self[k] for k in self._keys}

    def __repr__(self) -> str:
        return f"KeyedJaggedTensor(keys={self._keys}, batch={self._stride}, values={tuple(self.values().shape)})"


class KeyedTensor:
    """Pooled rows by feature: one ``[batch, dim]`` block per feature side by side in ``values`` (TorchRec's ``KeyedTensor``)."""

    def __init__(self, keys: Sequence[str], length_per_key: Sequence[int], values: torch.Tensor) -> None:
        self._keys = list(keys)
        self._lengths = [int(x) for x in length_per_key]
        self._values = values

    def keys(self) -> list[str]:
        """Feature names."""
        return list(self._keys)

    def values(self) -> torch.Tensor:
        """``[batch, sum of dims]``."""
        return self._values

    def length_per_key(self) -> list[int]:
        """Each feature's width in :meth:`values`."""
        return list(self._lengths)

    def __getitem__(self, key: str) -> torch.Tensor:
        if key not in self._keys:
            raise InvalidBatchError(f"KeyedTensor: no feature {key!r}; features are {self._keys}")
        i = self._keys.index(key)
        start = sum(self._lengths[:i])
        return self._values[:, start:start + self._lengths[i]]

    def to_dict(self) -> dict[str, torch.Tensor]:
        """One ``[batch, dim]`` tensor per feature."""
        return {k: self[k] for k in self._keys}

    def __repr__(self) -> str:
        return f"KeyedTensor(keys={self._keys}, values={tuple(self._values.shape)})"


def as_jagged_features(features: Any, owner: str) -> dict[str, JaggedTensor]:
    """A collection's input as one :class:`JaggedTensor` of keys per feature.

    Accepts a :class:`KeyedJaggedTensor` (ours or TorchRec's: anything with ``keys()``, ``values()`` and
    ``lengths()``), or a mapping of feature name to a :class:`JaggedTensor`, a ``[batch]`` tensor (one key a
    sample) or a ``[batch, n]`` tensor (``n`` keys a sample).
    """
    if isinstance(features, KeyedJaggedTensor):
        return features.to_dict()
    if not isinstance(features, Mapping) and all(hasattr(features, m) for m in ("keys", "values", "lengths")):
        w = features.weights_or_none() if hasattr(features, "weights_or_none") else None
        return KeyedJaggedTensor(list(features.keys()), features.values(), lengths=features.lengths(),
                                 weights=w).to_dict()
    if not isinstance(features, Mapping):
        raise InvalidBatchError(f"{owner}: input of type {type(features).__name__}; expected a KeyedJaggedTensor "
                                "or a dict of feature name -> tensor of keys")
    out: dict[str, JaggedTensor] = {}
    for name, v in features.items():
        if isinstance(v, JaggedTensor):
            out[str(name)] = v
            continue
        t = torch.as_tensor(v)
        if t.dim() == 1:
            out[str(name)] = JaggedTensor(t, lengths=torch.ones(t.shape[0], dtype=torch.int64))
        elif t.dim() == 2:
            out[str(name)] = JaggedTensor(t.reshape(-1), lengths=torch.full((t.shape[0],), t.shape[1],
                                                                            dtype=torch.int64))
        else:
            raise InvalidShapeError(f"{owner}: feature {name!r} has keys of shape {tuple(t.shape)}; expected "
                                    "[batch] or [batch, keys per sample] (or a JaggedTensor)")
    return out
