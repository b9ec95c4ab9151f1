"""Evaluating a compiled plan for one batch: the evaluator (:mod:`.evaluator`, the delta rules
operator by operator) and its two engines, DuckDB on the driver (:mod:`.local`) and Spark
(:mod:`.spark`), between which :meth:`.evaluator.BatchEvaluator.materialize` chooses."""
