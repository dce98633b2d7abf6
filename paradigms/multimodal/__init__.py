"""Paradigm 3, multimodal: image-text contrastive learning with bank-held embeddings and negatives.

- :mod:`~carls_dask.paradigms.multimodal.settings`: :class:`MultimodalSettings`, what one run is;
- :mod:`~carls_dask.paradigms.multimodal.paradigm`: the :class:`Multimodal` paradigm
  (``carls-dask run multimodal``, :func:`carls_dask.runtime.run_paradigm`);
- :mod:`~carls_dask.paradigms.multimodal.loops`: the contrastive trainer, the concept classifier and the
  corpus knowledge maker;
- :mod:`~carls_dask.paradigms.multimodal.models`: the dual encoder (trainable heads) and the image query head;
- :mod:`~carls_dask.paradigms.multimodal.data`: the corpus of image-text pairs a run reads, and its cache folder;
- :mod:`~carls_dask.paradigms.multimodal.tables`: the bank tables and their initialisation with frozen features;
- topic modules: :mod:`~carls_dask.paradigms.multimodal.text` and :mod:`~carls_dask.paradigms.multimodal.features`
  (hashed n-gram text ids, frozen EfficientNet-Lite0 image features, computed once and cached),
  :mod:`~carls_dask.paradigms.multimodal.losses` (contrastive loss with extra bank negatives and logQ
  correction, sampled softmax for a large output space), :mod:`~carls_dask.paradigms.multimodal.metrics`
  (retrieval recall).
"""

from __future__ import annotations

from carls_dask.paradigms.multimodal.paradigm import Multimodal
from carls_dask.paradigms.multimodal.settings import MultimodalSettings

__all__ = ["Multimodal", "MultimodalSettings"]
