"""Operator state: the arrangements of a query, in one Delta table under its checkpoint."""
from .arrangement import Arrangement, Lookup, StateStore  # noqa: F401
