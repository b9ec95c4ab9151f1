"""TPC-DS source data for consistent_stream: the 24 tables as Delta tables with Change Data Feed
on (:mod:`.generate`, from the PyPI package ``tpcgen-cli``) and a deterministic refresh stream
of inserts, deletes and updates on the fact and dimension tables (:mod:`.refresh`)."""

from .generate import ALL, DIMENSIONS, FACTS, PRIMARY_KEYS, SCHEMAS, TpcdsGenError, generate, table_path
from .refresh import RefreshCommit, RefreshResult, refresh_round

__all__ = [
    "ALL",
    "DIMENSIONS",
    "FACTS",
    "PRIMARY_KEYS",
    "SCHEMAS",
    "RefreshCommit",
    "RefreshResult",
    "TpcdsGenError",
    "generate",
    "refresh_round",
    "table_path",
]
