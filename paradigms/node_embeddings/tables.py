"""The bank tables of a node-embedding run: ``nodes`` (input vectors), ``contexts`` (context vectors) and,
with the neighbour maker, ``neighbours``.

Input and context vectors are two tables rather than two columns of one: a lookup with insert and a
gradient push each log whole rows of their table to the bank's delta log, so a layer's calls then log
only the column it reads.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from carls_dask.bank import Column, TableSpec

if TYPE_CHECKING:
    from carls_dask.bank.client import KnowledgeBank
    from carls_dask.paradigms.node_embeddings.settings import NodeEmbeddingsSettings

__all__ = ["CONTEXTS", "NEIGHBOURS", "TABLE", "bank_tables", "initialise_bank", "node_tables", "table_specs"]

#: The bank table of the node vectors (the dashboards' drift map reads ``nodes.embedding``).
TABLE = "nodes"
#: The bank table of the context vectors (negatives are drawn from it, ranked by context frequency).
CONTEXTS = "contexts"
#: The table the neighbour maker writes: each query node's nearest nodes and their scores.
NEIGHBOURS = "neighbours"


def node_tables(dim: int, lr: float, init_scale: float, accumulator: float,
                optimizer: str = "adagrad") -> tuple[TableSpec, TableSpec]:
    """The ``nodes`` table (input vectors, normal with ``init_scale``) and the ``contexts`` table (context
    vectors, zeros as in word2vec), each with one ``embedding`` column."""
    def table(name: str, initializer: str, scale: float) -> TableSpec:
        return TableSpec(name, columns=(Column("embedding", "float32", (dim,), ("dim",), initializer=initializer,
                                               init_scale=scale),),
                         optimizer=optimizer, learning_rate=lr, adagrad_initial_accumulator=accumulator,
                         initializer=initializer, init_scale=scale)

    return table(TABLE, "normal", init_scale), table(CONTEXTS, "zeros", 0.0)


def table_specs(s: NodeEmbeddingsSettings) -> tuple[TableSpec, TableSpec]:
    """The ``nodes`` and ``contexts`` tables of ``s``."""
    return node_tables(s.dim, s.lr, s.init_scale, s.accumulator)


def bank_tables(s: NodeEmbeddingsSettings) -> list[TableSpec]:
    """The bank tables of a run: ``nodes``, ``contexts`` and, with the maker, ``neighbours``."""
    out = list(table_specs(s))
    if s.maker:
        out.append(TableSpec(NEIGHBOURS, columns=(Column("nodes", "int64", (s.maker_k,), ("neighbour",)),
                                                  Column("scores", "float32", (s.maker_k,), ("neighbour",),
                                                         initializer="zeros")), optimizer=None))
    return out


def initialise_bank(bank: KnowledgeBank, n_nodes: int, chunk: int = 1 << 16) -> None:
    """Allocate every node's rows (frequency 1), so the bank's sampler ranks every node from the first step."""
    for table in (TABLE, CONTEXTS):
        for s in range(0, n_nodes, chunk):
            bank.lookup(table, np.arange(s, min(n_nodes, s + chunk), dtype=np.int64), columns=[], insert=True)
