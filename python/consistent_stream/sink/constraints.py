"""dbt model contracts and constraints on a consistent_stream target.

* The **contract** (``contract: {enforced: true}`` and the model's ``columns`` with their
  ``data_type``) is checked against the model's output schema, as Spark's analysis of the
  SQL gives it, before a run reads or writes anything (:func:`check_contract`), and reported as
  dbt reports a broken contract: one line per mismatched column.
* **Constraints** of type ``not_null`` and ``check`` are enforced at every batch, on the rows
  the batch inserts or updates into the target (its changelog's rows of positive weight; a
  rebuild's whole output), before the target's commit: a violation fails the batch, the
  target is not committed, and the error names the constraint and up to five offending rows
  (:func:`check_constraints`). A failed batch is replayed as planned (same source versions,
  exactly once), so data that violates a constraint is recovered from by changing the model
  or the constraint (a rebuild) or by a full refresh after fixing the data. A ``check`` passes
  when its expression is TRUE or NULL (SQL CHECK semantics); expressions are Spark SQL over the
  output's columns. Constraints of other types (``unique``, ``primary_key``, ``foreign_key``,
  ``custom``) are not enforced: the materialization warns about them (``unique_key`` is what a
  target checks for uniqueness).

Spark evaluates both, so a check means what it means in the batch evaluation the contract
of every version is stated against.
"""
from __future__ import annotations

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.types import DataType, StructType

from ..changelog import WEIGHT, q
from ..errors import ConfigError, ConstraintViolation

ENFORCED = ("not_null", "check")
EXAMPLE_ROWS = 5


def _spark_type(data_type: str) -> str | None:
    """``data_type`` (dbt's column ``data_type``, Spark DDL: ``bigint``, ``decimal(15,2)``,
    ``array<string>``) as Spark's simple string (parsed by the active session); None when
    Spark cannot parse it."""
    try:
        parsed = DataType.fromDDL(data_type)
    except Exception:
        return None
    # fromDDL also reads a list of fields ("long integer" is struct<long:int>)
    if isinstance(parsed, StructType) and not data_type.strip().lower().startswith("struct"):
        return None
    return parsed.simpleString()


def check_contract(output: StructType, contract: list[dict], model: str) -> None:
    """Raise ConfigError when the model's ``output`` schema differs from its enforced
    ``contract`` (``[{name, data_type}]``, empty when not enforced): a column missing on
    either side, or another type. Names compare case-insensitively, types as Spark types."""
    if not contract:
        return
    got = {f.name.lower(): f.dataType.simpleString() for f in output.fields}
    want: dict[str, str] = {}
    rows = []
    for c in contract:
        name, data_type = str(c["name"]).lower(), c.get("data_type")
        if not data_type:
            rows.append((name, got.get(name, "-"), "-", "the contract gives it no data_type"))
            continue
        parsed = _spark_type(str(data_type))
        if parsed is None:
            rows.append((name, got.get(name, "-"), str(data_type), "Spark cannot parse this data_type"))
            continue
        want[name] = parsed
    named = {r[0] for r in rows}
    for name, spark_type in got.items():          # in the output's order, then the contract's
        if name in named:
            continue
        if name not in want:
            rows.append((name, spark_type, "-", "missing in the contract"))
        elif want[name] != spark_type:
            rows.append((name, spark_type, want[name], "data type mismatch"))
    rows += [(name, "-", t, "missing in the model's output") for name, t in want.items() if name not in got]
    if rows:
        table = "\n".join(f"| {n} | {d} | {c} | {why} |" for n, d, c, why in rows)
        raise ConfigError(
            f"model {model}: its contract is enforced and does not match the model's output; nothing was read "
            f"or written. Make the name, data_type and number of columns under `columns:` in its YAML match "
            f"the SQL (or the SQL match them):\n| column_name | definition_type | contract_type | "
            f"mismatch_reason |\n{table}")


def _violation_sql(constraint: dict) -> str:
    """Spark SQL that is TRUE for a row violating ``constraint``."""
    if constraint["type"] == "not_null":
        return " OR ".join(f"{q(c)} IS NULL" for c in constraint["columns"])
    return f"NOT COALESCE(({constraint['expression']}), TRUE)"


def describe(constraint: dict) -> str:
    """``not_null on [a, b]`` or ``check n > 0``, with the constraint's name when it has one."""
    name = f"{constraint['name']}: " if constraint.get("name") else ""
    if constraint["type"] == "not_null":
        return f"{name}not_null on {constraint['columns']}"
    return f"{name}check ({constraint['expression']})"


def check_constraints(spark: SparkSession, rows: DataFrame | pa.Table, constraints: list[dict], model: str) -> None:
    """Raise ConstraintViolation when a row of ``rows`` (the batch's output changelog:
    columns + ``__weight``, or a rebuild's rows + ``__weight``) of positive weight violates
    one of ``constraints`` (``[{type, columns, expression, name}]``, types ``not_null`` and
    ``check``). One Spark job, only when there are constraints."""
    enforced = [c for c in constraints if c["type"] in ENFORCED]
    if not enforced or (isinstance(rows, pa.Table) and rows.num_rows == 0):
        return
    df = spark.createDataFrame(rows) if isinstance(rows, pa.Table) else rows
    data = [c for c in df.columns if c != WEIGHT]
    flags = [f"({_violation_sql(c)}) AS `__violates_{i}`" for i, c in enumerate(enforced)]
    try:
        found = (df.where(f"{q(WEIGHT)} > 0").selectExpr(*[q(c) for c in data], *flags)
                 .where(" OR ".join(f"`__violates_{i}`" for i in range(len(enforced))))
                 .limit(EXAMPLE_ROWS).collect())
    except Exception as e:   # an expression Spark cannot analyze over the output's columns
        raise ConfigError(f"model {model}: a check constraint cannot be evaluated over the model's output columns "
                          f"{data}: {e}".split("\n")[0]) from e
    if not found:
        return
    broken = [describe(c) for i, c in enumerate(enforced) if any(r[f"__violates_{i}"] for r in found)]
    examples = "\n".join("  " + str({c: r[c] for c in data}) for r in found)
    raise ConstraintViolation(
        f"model {model}: the batch's rows violate the constraint(s) {'; '.join(broken)}; nothing of the batch was "
        f"committed (the target stays at its last version). Rows (up to {EXAMPLE_ROWS}):\n{examples}\nA run "
        f"replays the batch as planned, at the same source versions: fix the model or the constraint (the "
        f"changed definition is rebuilt, see on_configuration_change), or fix the sources' data and run dbt run "
        f"--full-refresh -s {model}")
