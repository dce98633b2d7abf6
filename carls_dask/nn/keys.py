"""Keys of a bank-backed layer: integer tensors and arrays or strings, of any shape, as the bank takes them.

A layer accepts what :class:`torch.nn.Embedding` accepts (an integer tensor of any shape) and what the
bank accepts (``int64`` keys, or strings hashed by the bank's own stable hash), so the rows a layer
reads for ``"cat"`` are the rows ``bank.lookup(table, ["cat"])`` reads. Everything is checked here,
before a key reaches the bank, so a bad batch allocates and updates nothing.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from carls_dask.bank.hashing import to_int64_keys
from carls_dask.errors import InvalidBatchError, InvalidDTypeError, InvalidShapeError

__all__ = ["LayerKeys", "as_keys", "padding_key_of"]


@dataclasses.dataclass(frozen=True)
class LayerKeys:
    """A batch of keys flattened for the bank, with the shape it came in.

    Attributes
    ----------
    flat
        ``int64[n]`` keys in row-major order of the input.
    shape
        The input's shape (``flat`` reshaped to it gives the keys back).
    """

    flat: np.ndarray
    shape: tuple[int, ...]

    @property
    def size(self) -> int:
        """Number of keys."""
        return int(self.flat.shape[0])


def _strings(arr: np.ndarray) -> bool:
    """Whether every element of an object or unicode array is a ``str``."""
    if arr.dtype.kind == "U":
        return True
    return arr.dtype.kind == "O" and all(isinstance(k, str) for k in arr.reshape(-1).tolist())


def _integers(arr: np.ndarray) -> bool:
    """Whether every element of an object array is an integer (``bool`` is not)."""
    return all(isinstance(k, int | np.integer) and not isinstance(k, bool | np.bool_) for k in arr.reshape(-1).tolist())


def as_keys(keys: Any, owner: str) -> LayerKeys:
    """``keys`` as :class:`LayerKeys`: ``int64`` keys as given, strings hashed as the bank hashes them.

    Parameters
    ----------
    keys
        An integer :class:`torch.Tensor` (any device) or NumPy array, or nested lists of Python ints or
        of strings, of any shape; a NumPy array of strings.
    owner
        The layer, named in error messages.

    Raises
    ------
    InvalidDTypeError
        For float, bool or complex keys, a mix of strings and integers, or anything else.
    InvalidShapeError
        For ragged nested lists.
    InvalidBatchError
        For integers outside the ``int64`` range.
    """
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        torch = None  # type: ignore[assignment]
    if torch is not None and isinstance(keys, torch.Tensor):
        if keys.dtype.is_floating_point or keys.dtype.is_complex or keys.dtype == torch.bool:
            raise InvalidDTypeError(f"{owner}: keys must be an integer tensor (int64 like torch.nn.Embedding's "
                                    f"input) or strings, got a {keys.dtype} tensor")
        arr = keys.detach().to("cpu").numpy()
    elif isinstance(keys, str | bytes):
        raise InvalidShapeError(f"{owner}: keys must be a batch (a tensor, an array or a list), got a single "
                                f"{type(keys).__name__} {keys!r}; expected e.g. [{keys!r}]")
    elif isinstance(keys, np.ndarray):
        arr = keys
    else:
        try:
            arr = np.array(keys, dtype=object)
        except ValueError:
            raise InvalidShapeError(f"{owner}: keys are ragged nested lists; expected a rectangular batch "
                                    "(use BankEmbeddingBag with offsets for bags of different sizes)") from None
        if arr.size and any(isinstance(k, list | tuple | np.ndarray) for k in arr.reshape(-1).tolist()):
            raise InvalidShapeError(f"{owner}: keys are ragged nested lists; expected a rectangular batch "
                                    "(use BankEmbeddingBag with offsets for bags of different sizes)")
        if arr.size and _strings(arr):
            arr = arr.astype(str)
        elif arr.size and _integers(arr):
            try:
                arr = arr.astype(np.int64)
            except OverflowError:
                raise InvalidBatchError(f"{owner}: a key is outside the int64 range; expected keys within "
                                        f"[{np.iinfo(np.int64).min}, {np.iinfo(np.int64).max}]") from None
        elif arr.size:
            kinds = sorted({type(k).__name__ for k in arr.reshape(-1).tolist()})
            raise InvalidDTypeError(f"{owner}: keys must be all integers or all strings, got {kinds}")
        else:
            arr = arr.astype(np.int64)
    shape = tuple(int(s) for s in arr.shape)
    if arr.dtype.kind in "US" or (arr.dtype.kind == "O" and arr.size and _strings(arr)):
        if arr.dtype.kind == "S":
            raise InvalidDTypeError(f"{owner}: keys are bytes ({arr.dtype}); expected str keys or integers")
        flat = to_int64_keys(arr.reshape(-1).astype(object), owner) if arr.size else np.empty(0, np.int64)
        return LayerKeys(flat, shape)
    if arr.size and arr.dtype.kind not in "iu":
        raise InvalidDTypeError(f"{owner}: keys must be integers (int64) or strings, got dtype {arr.dtype}")
    if arr.size and arr.dtype.kind == "u" and arr.dtype.itemsize == 8 and int(arr.max()) > np.iinfo(np.int64).max:
        raise InvalidBatchError(f"{owner}: key {int(arr.max())} is outside the int64 range; expected keys within "
                                f"[{np.iinfo(np.int64).min}, {np.iinfo(np.int64).max}]")
    return LayerKeys(np.ascontiguousarray(arr.reshape(-1), dtype=np.int64), shape)


def padding_key_of(padding_key: int | str | None, owner: str) -> int | None:
    """The ``int64`` key that stands for padding (a string is hashed as the bank hashes it), or ``None``.

    Raises
    ------
    InvalidDTypeError
        For anything but an ``int``, a ``str`` or ``None``.
    """
    if padding_key is None:
        return None
    if isinstance(padding_key, bool) or not isinstance(padding_key, int | np.integer | str):
        raise InvalidDTypeError(f"{owner}: padding_key must be an int, a str or None, got {padding_key!r}")
    return int(as_keys([padding_key], owner).flat[0])
