"""The learning paradigms built on the bank and the runtime, each in its own subpackage.

- :mod:`carls_dask.paradigms.semi_supervised`: graph regularization with neighbour embeddings from the
  bank and reliable pseudo labels;
- :mod:`carls_dask.paradigms.curriculum`: maker-scored examples, paced;
- :mod:`carls_dask.paradigms.multimodal`: image-text contrastive learning with bank-held embeddings and
  negative sampling;
- :mod:`carls_dask.paradigms.node_embeddings`: skip-gram node vectors of the WordNet noun graph held in
  the bank, judged by link prediction, a linear probe and hierarchy reconstruction;
- :mod:`carls_dask.paradigms.data`: the data sets they read from local files.

Each registers a ``carls-dask run NAME`` entry point (group ``carls_dask.paradigms``).
"""

from __future__ import annotations

__all__: list[str] = []
