"""Text inputs of the dual encoder: hashed token ids, or the choice of the pretrained sentence encoder.

The hashed encoder needs no weights: words and character trigrams, hashed into a fixed number of
buckets. The pretrained one is all-MiniLM-L6-v2 (:mod:`carls_dask.paradigms.data.sentences`), whose
frozen 384-d features the trainer projects; :func:`resolve_text_encoder` picks between them.
"""

from __future__ import annotations

import logging
import re
import zlib
from collections.abc import Sequence

import numpy as np

from carls_dask.errors import ConfigError

__all__ = ["TEXT_ENCODERS", "hash_tokens", "minilm_available", "resolve_text_encoder", "tokens"]

logger = logging.getLogger(__name__)

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


TEXT_ENCODERS = ("auto", "minilm", "hashed")


def minilm_available() -> bool:
    """Whether the pretrained sentence encoder can be loaded (its wheel and ``transformers`` import)."""
    try:
        resolve_text_encoder("minilm")
    except ConfigError:
        return False
    return True


def resolve_text_encoder(choice: str) -> str:
    """``"minilm"`` or ``"hashed"``: the text encoder a setting ``choice`` means on this machine.

    ``"auto"`` is MiniLM when its packages import, else the hashed encoder (with a logged warning);
    an explicit ``"minilm"`` without them raises.

    Raises
    ------
    ConfigError
        If ``choice`` is not one of :data:`TEXT_ENCODERS`, or is ``"minilm"`` and the packages of
        all-MiniLM-L6-v2 are missing (the message names the install command).
    """
    if choice not in TEXT_ENCODERS:
        raise ConfigError(f"text_encoder={choice!r}; expected one of {TEXT_ENCODERS}")
    if choice == "hashed":
        return "hashed"
    from carls_dask.paradigms.data.sentences import check_sentence_encoder

    try:
        check_sentence_encoder()
    except ConfigError as exc:
        if choice == "minilm":
            raise
        logger.warning("text_encoder='auto': %s; falling back to the hashed text encoder", exc)
        return "hashed"
    return "minilm"
