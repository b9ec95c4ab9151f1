"""Evaluating a compiled plan for one batch: the evaluator (:mod:`.evaluator`) and the
local engine (:mod:`.local`, DuckDB on the driver) beside Spark."""
