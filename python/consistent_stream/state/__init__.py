"""Operator state: arrangements stored as Delta tables under the checkpoint location."""
from .arrangement import StateStore  # noqa: F401
