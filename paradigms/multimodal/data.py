"""The corpus a multimodal run reads: which image-text pairs (:class:`CorpusSpec`), loaded once per process
(:func:`load_corpus`); its rendered images and frozen features are cached in :data:`MULTIMODAL_CACHE` of
``carls.data.cache`` (:func:`carls_dask.locations.cache_dir`) unless a ``cache_dir`` setting names a folder."""

from __future__ import annotations

import dataclasses

import numpy as np

from carls_dask.errors import ConfigError
from carls_dask.paradigms.data.openmoji import EmojiPairs, concept_split, load_openmoji_pairs
from carls_dask.paradigms.data.sentences import encode_sentences
from carls_dask.paradigms.multimodal.features import image_features
from carls_dask.paradigms.multimodal.text import hash_tokens, resolve_text_encoder

__all__ = ["MULTIMODAL_CACHE", "Corpus", "CorpusSpec", "load_corpus"]

#: The subfolder of ``carls.data.cache`` holding rendered images and frozen features (without a cache_dir setting).
MULTIMODAL_CACHE = "multimodal"


@dataclasses.dataclass(frozen=True)
class CorpusSpec:
    """Which pairs to use; small and picklable, so every worker loads the same corpus.

    Attributes
    ----------
    size
        Image side in pixels.
    limit
        Concepts kept (``None``: all of about 1,700).
    n_test
        Concepts held out for retrieval evaluation (one pair each).
    n_val
        Further concepts held out of training as a validation split (one pair each), on which
        settings are chosen before the test figures are read; 0 keeps them in training.
    seed
        Seed of the concept choices.
    cache_dir
        Folder of the rendered-image and feature caches.
    text_buckets
        Hashed text token ids.
    text_encoder
        ``"minilm"`` (frozen all-MiniLM-L6-v2 sentence features), ``"hashed"`` (hashed word and
        character-trigram ids, no weights) or ``"auto"`` (MiniLM when its packages import, else hashed
        with a logged warning).
    torch_threads
        Intra-op threads the loops give torch in their worker process (``torch.set_num_threads``);
        1 avoids oversubscription when several workers share few cores; ``None`` leaves it.
    """

    size: int = 64
    limit: int | None = None
    n_test: int = 300
    n_val: int = 0
    seed: int = 0
    cache_dir: str | None = None
    text_buckets: int = 1 << 12
    torch_threads: int | None = 1
    text_encoder: str = "auto"


@dataclasses.dataclass(frozen=True)
class Corpus:
    """The loaded corpus: train pairs (the bank's corpus, keyed by row), held-out validation and test pairs.

    ``text_features`` are the frozen sentence features of every pair (``text_encoder="minilm"``;
    ``None`` with the hashed encoder); :attr:`text_inputs` is what the text head reads.
    """

    pairs: EmojiPairs
    train: np.ndarray
    test: np.ndarray
    features: np.ndarray
    text_ids: np.ndarray
    val: np.ndarray = dataclasses.field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    text_encoder: str = "hashed"
    text_features: np.ndarray | None = None

    @property
    def text_inputs(self) -> np.ndarray:
        """``float32[n, 384]`` sentence features (MiniLM) or ``int64[n, L]`` hashed token ids, every pair."""
        return self.text_ids if self.text_features is None else self.text_features

    @property
    def text_dim(self) -> int | None:
        """Size of the frozen text features (``None`` with hashed ids)."""
        return None if self.text_features is None else int(self.text_features.shape[1])

    @property
    def train_keys(self) -> np.ndarray:
        """Bank keys of the train pairs (their row numbers in :attr:`pairs`)."""
        return self.train.astype(np.int64)


def load_corpus(spec: CorpusSpec) -> Corpus:
    """Render (or read from cache) the pairs, compute (or read) the frozen features, split by concept.

    The test concepts are drawn first, so ``n_val`` never changes the test pairs; the validation
    concepts are then drawn from the remaining (training) concepts.

    Raises
    ------
    ConfigError
        If ``n_val`` is negative.
    InvalidBatchError
        If ``n_test`` or ``n_val`` leave no concept for training.
    """
    if not isinstance(spec.n_val, int) or spec.n_val < 0:
        raise ConfigError(f"CorpusSpec: n_val={spec.n_val!r}; expected an int >= 0")
    pairs = load_openmoji_pairs(spec.size, limit=spec.limit, seed=spec.seed, cache_dir=spec.cache_dir)
    train, test = concept_split(pairs, spec.n_test, seed=spec.seed)
    val = np.zeros(0, dtype=np.int64)
    if spec.n_val:
        sub_train, sub_val = concept_split(pairs.subset(train), spec.n_val, seed=spec.seed + 1)
        train, val = train[sub_train], train[sub_val]
    feats = image_features(pairs.images, cache_dir=spec.cache_dir)
    encoder = resolve_text_encoder(spec.text_encoder)
    text_features = encode_sentences(pairs.texts, cache_dir=spec.cache_dir) if encoder == "minilm" else None
    return Corpus(pairs, train, test, feats, hash_tokens(pairs.texts, spec.text_buckets), val, encoder,
                  text_features)

