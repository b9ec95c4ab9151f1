"""Vectorized delta rules over Z-set DataFrames, one operator per module.

Every operator maps the changelog of its input(s) for one micro-batch (columns + ``__weight``)
to the changelog of its output, reading its arrangements as of the previous batch and
staging their updates in a :class:`~consistent_stream.state.StateStore`.
"""
