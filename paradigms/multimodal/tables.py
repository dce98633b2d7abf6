"""The bank tables of a multimodal run and their initialisation.

- ``texts`` and ``images``: one row per train pair (keyed by its row in the corpus), with the corpus
  maker's ``embedding`` and the frozen pretrained features (``pretrained``) the loops read;
- ``concepts``: the concept classifier's class embeddings, trained in the bank through a ``BankEmbedding`` layer.

:func:`initialise_bank` runs the frozen pretrained encoders once (EfficientNet-Lite0 for images and,
with ``text_encoder="minilm"``, all-MiniLM-L6-v2 for texts, both shipped in registry packages) and
writes their features into the bank before the loops start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from carls_dask.bank import Column, TableSpec
from carls_dask.paradigms.data.sentences import SENTENCE_MODEL
from carls_dask.paradigms.multimodal.data import CorpusSpec, load_corpus
from carls_dask.paradigms.multimodal.features import FEATURE_DIM, PRETRAINED_NAME

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank

__all__ = ["CONCEPTS", "IMAGES", "TEXTS", "corpus_tables", "has_pretrained", "initialise_bank"]

TEXTS, IMAGES, CONCEPTS = "texts", "images", "concepts"


def corpus_tables(dim: int = 64, classes_dim: int | None = None, text_dim: int | None = None) -> list[TableSpec]:
    """The bank tables: ``texts`` and ``images`` (embedding and frozen features) and ``concepts``.

    ``images.pretrained`` holds the frozen image features; ``texts.pretrained`` the frozen sentence
    features when ``text_dim`` is given (the MiniLM text encoder).
    """
    text_columns = [Column("embedding", "float32", (dim,), ("dim",), initializer="zeros")]
    if text_dim is not None:
        text_columns.append(Column("pretrained", "float32", (text_dim,), ("sentence",), initializer="zeros"))
    tables = [
        TableSpec(TEXTS, columns=tuple(text_columns), optimizer=None),
        TableSpec(IMAGES, columns=(Column("embedding", "float32", (dim,), ("dim",), initializer="zeros"),
                                   Column("pretrained", "float32", (FEATURE_DIM,), ("feature",),
                                          initializer="zeros")), optimizer=None),
    ]
    if classes_dim is not None:
        tables.append(TableSpec(CONCEPTS, columns=(Column("embedding", "float32", (classes_dim,), ("dim",)),),
                                optimizer="adagrad", learning_rate=0.2, initializer="normal", init_scale=0.01))
    return tables


def initialise_bank(bank: KnowledgeBank, spec: CorpusSpec, chunk: int = 1024) -> int:
    """Write the frozen pretrained features of the train corpus into ``images.pretrained`` (and, with the
    MiniLM text encoder, ``texts.pretrained``).

    Runs the pretrained encoders (or reads their caches); provenance ``maker="efficientnet-lite0"``
    (``"all-MiniLM-L6-v2"`` for texts), ``model_step=0``. Returns the number of corpus rows written.
    """
    corpus = load_corpus(spec)
    keys = corpus.train_keys
    texts = corpus.text_features if corpus.text_features is not None and has_pretrained(bank, TEXTS) else None
    for s in range(0, len(keys), chunk):
        k = keys[s:s + chunk]
        bank.update(IMAGES, k, {"pretrained": corpus.features[k]}, model_step=0, maker=PRETRAINED_NAME)
        if texts is not None:
            bank.update(TEXTS, k, {"pretrained": texts[k]}, model_step=0, maker=SENTENCE_MODEL)
    return len(keys)


def has_pretrained(bank: KnowledgeBank, table: str) -> bool:
    """Whether ``table`` of ``bank`` has a ``pretrained`` column (``texts`` has one with MiniLM features)."""
    return any(c.name == "pretrained" for c in bank.spec(table).columns)

