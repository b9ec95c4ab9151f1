"""Debezium's change events: their format and the readers of a landing directory of them.

- :mod:`.events`: the event format (JSON lines with or without the schema envelope), the
  snapshot rule, parsing event files into complete transactions.
- :mod:`.schema`: Kafka Connect's JSON schema envelope -> a table's column types.
- :mod:`.columns`: events on Kafka parsed into columns (Spark on the executors, DuckDB on the
  driver), what :mod:`..kafka` assembles transactions from.
- :mod:`.source`: the transaction log a reader keeps, the landing directory's reader
  (``format: debezium``) and its source.

Nothing is imported here: :mod:`.events` also runs as the landing index's worker
(``python -m``), which a package that imported it first would warn about.
"""
