"""Changelog sources: what a model reads, as Z-sets between two cuts."""
from .spec import Cut, SourceSpec  # noqa: F401
