"""Errors raised by consistent_stream. Every message names the file, position or config key
involved and says what to do about it."""


class ConsistentStreamError(Exception):
    """Base class of every error this package raises on purpose."""


class ConfigError(ConsistentStreamError):
    """A model config key or a source's ``meta.consistent_stream`` entry is missing or invalid."""


class CompileError(ConsistentStreamError):
    """The model SQL uses a construct the incremental compiler does not support.

    Raised before anything is written. ``construct`` names the construct, ``line`` and
    ``col`` (1-based) locate it in the compiled SQL when known.
    """

    def __init__(self, construct: str, detail: str, line: int | None = None, col: int | None = None):
        self.construct, self.detail, self.line, self.col = construct, detail, line, col
        where = f"line {line}, col {col}: " if line is not None else ""
        super().__init__(f"{where}{construct} is not supported by consistent_stream: {detail}")


class NoDeltaRule(CompileError):
    """A construct Spark evaluates but no operator of the incremental compiler maintains by
    a delta rule of its own (a LATERAL VIEW, a grouping set, a cross join, ..). The compiler
    maintains the smallest query holding it by recomputing it (the recompute floor), unless
    the model sets ``incremental_only: true``, which raises this error instead."""


class SourceError(ConsistentStreamError):
    """A source changelog cannot be read (missing table, Change Data Feed off, versions gone)."""


class CommitError(ConsistentStreamError):
    """The target or a state table is not in the state the exactly-once protocol expects."""


class UniqueKeyViolation(ConsistentStreamError):
    """The model's output has two rows for one ``unique_key`` value."""


class ConstraintViolation(ConsistentStreamError):
    """Rows of a batch violate a ``not_null`` or ``check`` constraint of the model."""


class ConcurrentWriterError(ConsistentStreamError):
    """Another run (another process) is writing the same model now."""


class StorageError(ConsistentStreamError):
    """A file of the model (target, checkpoint, state, lock) cannot be written: its file
    system is read-only or full."""


class SessionLostError(ConsistentStreamError):
    """The Spark session (its JVM) went away while a run was under way."""
