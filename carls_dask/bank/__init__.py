"""The knowledge bank: sharded Dask actors holding typed knowledge with provenance.

Import as ``from carls_dask.bank import KnowledgeBank, TableSpec, Column``. The pure shard state
machine is :class:`ShardCore` (no Dask, no I/O); :class:`BankShard` is its Dask actor shell and
:class:`KnowledgeBank` the client that routes batches to shards.
"""

from __future__ import annotations

from carls_dask.bank.actor import BankShard
from carls_dask.bank.changes import ChangeBatch, ChangeCursor, ChangeWatch
from carls_dask.bank.client import KnowledgeBank
from carls_dask.bank.core import LookupResult, ShardCore
from carls_dask.bank.hashing import bucket_of, hash_string, to_int64_keys
from carls_dask.bank.sampling import NegativeSample
from carls_dask.bank.schema import Column, TableSpec, nodes_table

__all__ = [
    "BankShard",
    "ChangeBatch",
    "ChangeCursor",
    "ChangeWatch",
    "Column",
    "KnowledgeBank",
    "LookupResult",
    "NegativeSample",
    "ShardCore",
    "TableSpec",
    "bucket_of",
    "hash_string",
    "nodes_table",
    "to_int64_keys",
]
