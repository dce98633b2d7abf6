"""The bank tables of a semi-supervised run: ``nodes`` (the neighbour maker's outputs) and ``pseudo_labels``."""

from __future__ import annotations

from typing import Any

__all__ = ["NODES_TABLE", "PSEUDO_TABLE", "bank_tables"]

NODES_TABLE = "nodes"
PSEUDO_TABLE = "pseudo_labels"


def bank_tables(n_classes: int, embed_dim: int, refresh_threshold: float = 2.0) -> list[Any]:
    """The two tables of a run: ``nodes`` (embedding, logits) and ``pseudo_labels`` (label, confidence, target).

    ``target`` is the class distribution a node is trained towards: one-hot for hard pseudo labels,
    the sharpened neighbour vote for soft ones. The ``nodes`` table watches its logits (a change feed
    counting moves beyond ``refresh_threshold`` in L2), which a ``maker_refresh="changes"`` maker follows.
    """
    from carls_dask.bank.changes import ChangeWatch
    from carls_dask.bank.schema import Column, TableSpec

    return [
        TableSpec(NODES_TABLE, columns=(
            Column("embedding", "float32", (embed_dim,), ("dim",), initializer="zeros"),
            Column("logits", "float32", (n_classes,), ("class",), initializer="zeros"),
        ), optimizer=None, watch=(ChangeWatch("logits", "l2", float(refresh_threshold)),)),
        TableSpec(PSEUDO_TABLE, columns=(
            Column("pseudo_label", "int64", (), ()),
            Column("confidence", "float32", (), (), initializer="zeros"),
            Column("target", "float32", (n_classes,), ("class",), initializer="zeros"),
        ), optimizer=None),
    ]
