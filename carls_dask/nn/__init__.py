"""PyTorch layers over the knowledge bank: embeddings that live only in the bank, trained through autograd.

- :class:`BankEmbedding` and :class:`BankEmbeddingBag`: :class:`torch.nn.Embedding` and
  :class:`torch.nn.EmbeddingBag` whose table is a bank column; forward looks keys up (with insert in
  training), backward sends the touched rows' gradient to the table's server-side optimizer;
- :mod:`carls_dask.nn.pipeline`: prefetching the next batch's rows and pushing gradients off the
  training thread, with bounded staleness;
- :func:`sampled_softmax_loss` and :class:`SampledSoftmaxLoss`: TensorFlow's sampled softmax with the
  bank's candidates and expected counts, class weights read through a layer; :func:`top_k_classes` for
  the full evaluation.

``docs/embeddings.md`` shows them at work.
"""

from __future__ import annotations

from carls_dask.nn.embedding import BankEmbedding, BankEmbeddingBag, BankLayer
from carls_dask.nn.keys import as_keys
from carls_dask.nn.pipeline import PipelineStats, RowPipeline
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
    "BankLayer",
    "PipelineStats",
    "RowPipeline",
    "SampledSoftmaxLoss",
    "as_keys",
    "initial_rows",
    "sampled_softmax_logits",
    "sampled_softmax_loss",
    "top_k_classes",
]
