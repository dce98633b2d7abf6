"""PyTorch layers over the knowledge bank: embeddings that live only in the bank, trained through autograd.

- :class:`BankEmbedding` and :class:`BankEmbeddingBag`: :class:`torch.nn.Embedding` and
  :class:`torch.nn.EmbeddingBag` whose table is a bank column; forward looks keys up (with insert in
  training), backward sends the touched rows' gradient to the table's server-side optimizer;
- :class:`BankEmbeddingBagCollection` and :class:`BankEmbeddingCollection`: TorchRec's collections over
  bank tables (input a :class:`KeyedJaggedTensor` or a dict of keys by feature), every table's rows in
  one message per shard;
- :mod:`carls_dask.nn.pipeline`: one queue of calls per bank, so a step's reads and pushes of every layer
  travel together, prefetching the next batch's rows with bounded staleness;
- :func:`sampled_softmax_loss` and :class:`SampledSoftmaxLoss`: TensorFlow's sampled softmax with the
  bank's candidates and expected counts, class weights read through a layer; :func:`top_k_classes` for
  the full evaluation.

``docs/embeddings.md`` shows them at work.
"""

from __future__ import annotations

from carls_dask.nn.collection import BankEmbeddingBagCollection, BankEmbeddingCollection, BankTableConfig
from carls_dask.nn.embedding import BankEmbedding, BankEmbeddingBag, BankLayer
from carls_dask.nn.jagged import JaggedTensor, KeyedJaggedTensor, KeyedTensor
from carls_dask.nn.keys import as_keys
from carls_dask.nn.pipeline import BankQueue, PipelineStats, RowPipeline
from carls_dask.nn.sampled_softmax import (
    SampledSoftmaxLoss,
    sampled_softmax_logits,
    sampled_softmax_loss,
    top_k_classes,
)
from carls_dask.nn.table import BankColumn, initial_rows

__all__ = [
    "BankColumn",
    "BankEmbedding",
    "BankEmbeddingBag",
    "BankEmbeddingBagCollection",
    "BankEmbeddingCollection",
    "BankLayer",
    "BankQueue",
    "BankTableConfig",
    "JaggedTensor",
    "KeyedJaggedTensor",
    "KeyedTensor",
    "PipelineStats",
    "RowPipeline",
    "SampledSoftmaxLoss",
    "as_keys",
    "initial_rows",
    "sampled_softmax_logits",
    "sampled_softmax_loss",
    "top_k_classes",
]
