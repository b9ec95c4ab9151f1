"""TPC-H source data for consistent_stream: Delta tables with Change Data Feed on
(:mod:`.generate`) and a deterministic refresh stream of inserts, deletes and updates
(:mod:`.refresh`). Command-line entry points are in :mod:`.cli`."""

from .generate import ALL, SCHEMAS, TpchGenError, generate
from .refresh import RefreshCommit, RefreshResult, refresh_round

__all__ = [
    "ALL",
    "SCHEMAS",
    "RefreshCommit",
    "RefreshResult",
    "TpchGenError",
    "generate",
    "refresh_round",
]
