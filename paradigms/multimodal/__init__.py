"""Paradigm 3, multimodal: image-text contrastive learning with bank-held embeddings and negatives.

- :mod:`carls_dask.paradigms.multimodal.text` and :mod:`carls_dask.paradigms.multimodal.features`: hashed n-gram text
  ids and frozen EfficientNet-Lite0 image features (computed once and cached);
- :mod:`carls_dask.paradigms.multimodal.model`: the dual encoder (trainable heads) and the image query head;
- :mod:`carls_dask.paradigms.multimodal.losses`: contrastive loss with extra bank negatives and logQ
  correction, and sampled softmax for a large output space;
- :mod:`carls_dask.paradigms.multimodal.loops`: the trainers and the corpus knowledge maker;
- :mod:`carls_dask.paradigms.multimodal.paradigm`: the :class:`Multimodal` paradigm and its
  settings (``carls-dask run multimodal``, :func:`carls_dask.runtime.run_paradigm`).
"""

from __future__ import annotations

__all__: list[str] = []
