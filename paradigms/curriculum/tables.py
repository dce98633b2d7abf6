"""The bank table of a curriculum run: one row per training example, written by the difficulty makers."""

from __future__ import annotations

from typing import Any

__all__ = ["BANK_COLUMNS", "TABLE", "difficulty_table"]

#: The bank table of per-example knowledge (keys are training-example indices). The dashboards
#: read the table named ``nodes`` by default, so the curriculum uses that name too.
TABLE = "nodes"

#: The columns of the table, in the order the trainer reads them.
BANK_COLUMNS = ("difficulty", "clean_difficulty", "pseudo_label", "confidence", "disagree_rounds")


def difficulty_table(name: str = TABLE) -> Any:
    """The bank table the curriculum writes: one row per training example."""
    from carls_dask.bank.schema import Column, TableSpec

    return TableSpec(name, columns=(
        Column("difficulty", dtype="float32", shape=(), dims=()),
        Column("clean_difficulty", dtype="float32", shape=(), dims=()),
        Column("pseudo_label", dtype="int64", shape=(), dims=()),
        Column("confidence", dtype="float32", shape=(), dims=()),
        Column("disagree_rounds", dtype="int64", shape=(), dims=()),
    ), optimizer=None)
