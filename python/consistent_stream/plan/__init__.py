"""Model SQL (Spark dialect) -> logical plan, with sqlglot. See ``compile.compile_model``."""
from .compile import CompiledModel, compile_model, fingerprint  # noqa: F401
