"""Node embeddings learned in the bank: DeepWalk-style skip-gram on the WordNet noun graph.

Every one of the 82,115 nouns has an input vector in the bank's ``nodes`` table and a context vector in
``contexts``, read and trained through :class:`~carls_dask.nn.BankEmbedding` layers; negatives are drawn by the bank. The run is
judged as the literature judges node embeddings: link prediction on held-out edges (node2vec's
protocol) and a linear probe of the semi-supervised paradigm's classes, or, trained on the noun
hierarchy's transitive closure, Nickel & Kiela's reconstruction mean rank and MAP.

- :mod:`~carls_dask.paradigms.node_embeddings.settings`: :class:`NodeEmbeddingsSettings`, what one run is;
- :mod:`~carls_dask.paradigms.node_embeddings.paradigm`: :class:`NodeEmbeddings`, the paradigm
  ``carls-dask run node-embeddings`` runs;
- :mod:`~carls_dask.paradigms.node_embeddings.loops`: the skip-gram trainer and the neighbour maker;
- :mod:`~carls_dask.paradigms.node_embeddings.models`: the losses and the two table holders (bank-held
  layers, or in-process ``torch.nn.Embedding``);
- :mod:`~carls_dask.paradigms.node_embeddings.data`: the graph, its training pairs and held-out parts;
- :mod:`~carls_dask.paradigms.node_embeddings.tables`: the bank tables (``nodes``, ``contexts``, ``neighbours``);
- topic modules: :mod:`~carls_dask.paradigms.node_embeddings.walks` (random walks, skip-gram pairs, the
  link split) and :mod:`~carls_dask.paradigms.node_embeddings.evaluation` (link AUC, the probe, reconstruction).
"""

from __future__ import annotations

from carls_dask.paradigms.node_embeddings.paradigm import NodeEmbeddings
from carls_dask.paradigms.node_embeddings.settings import NodeEmbeddingsSettings

__all__ = ["NodeEmbeddings", "NodeEmbeddingsSettings"]
