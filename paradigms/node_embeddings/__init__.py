"""Node embeddings learned in the bank: DeepWalk-style skip-gram on the WordNet noun graph.

Every one of the 82,115 nouns has an input and a context vector in the bank's ``nodes`` table, read and
trained through :class:`~carls_dask.nn.BankEmbedding` layers; negatives are drawn by the bank. The run is
judged as the literature judges node embeddings: link prediction on held-out edges (node2vec's
protocol) and a linear probe of the semi-supervised paradigm's classes, or, trained on the noun
hierarchy's transitive closure, Nickel & Kiela's reconstruction mean rank and MAP.
"""

from __future__ import annotations

from carls_dask.paradigms.node_embeddings.paradigm import NodeEmbeddings
from carls_dask.paradigms.node_embeddings.settings import NodeEmbeddingSettings

__all__ = ["NodeEmbeddingSettings", "NodeEmbeddings"]
