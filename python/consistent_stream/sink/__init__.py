"""The transactional, idempotent target commit (one Delta commit per micro-batch) and the
catalog entry that shows the target's latest whole version to Spark SQL."""
