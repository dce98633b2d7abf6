"""Text to hashed token ids: words and character trigrams, hashed into a fixed number of buckets."""

from __future__ import annotations

import re
import zlib
from collections.abc import Sequence

import numpy as np

from carls_dask.storage.errors import ConfigError

__all__ = ["hash_tokens", "tokens"]

_WORD = re.compile(r"[a-z0-9#*]+")


def tokens(text: str) -> list[str]:
    """Words of ``text`` (lower case) and the character trigrams of each ``<word>``."""
    words = _WORD.findall(text.lower())
    out = [f"w:{w}" for w in words]
    for w in words:
        padded = f"<{w}>"
        out.extend(f"c:{padded[i:i + 3]}" for i in range(len(padded) - 2))
    return out


def hash_tokens(texts: Sequence[str], buckets: int = 1 << 12, max_len: int = 64) -> np.ndarray:
    """``int64[n, max_len]`` token ids in ``[1, buckets)``, 0-padded (id 0 is padding).

    The hash is CRC-32 of the token, so ids are stable across processes and machines.

    Raises
    ------
    ConfigError
        If ``buckets`` < 2 or ``max_len`` < 1.
    """
    if buckets < 2 or max_len < 1:
        raise ConfigError(f"hash_tokens: buckets={buckets}, max_len={max_len}; expected buckets >= 2, max_len >= 1")
    out = np.zeros((len(texts), max_len), dtype=np.int64)
    for i, t in enumerate(texts):
        ids = [1 + zlib.crc32(tok.encode()) % (buckets - 1) for tok in tokens(t)][:max_len]
        out[i, : len(ids)] = ids
    return out
