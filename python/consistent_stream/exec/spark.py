"""Spark as a batch's engine: a query of the batch run as Spark jobs, its result either
collected to the driver as Arrow or written by the executors to scratch files.

The other engine is :class:`~.local.LocalEngine` (DuckDB on the driver); which one runs a
query is decided in one place, :meth:`~.evaluator.BatchEvaluator.materialize`.
"""
from __future__ import annotations

import os

from pyspark.sql import SparkSession

from ..changelog import Changelog, Views
from ..delta.files import new_dir, write_spark
from ..settings import spark_confs


class SparkEngine:
    """Runs a batch's queries on Spark, over the batch's temporary ``views``; results that
    are written go to fresh directories under ``scratch`` (the evaluator removes it once
    ``wrote`` says something was written there)."""

    def __init__(self, spark: SparkSession, views: Views, scratch: str):
        self.spark, self.views, self.scratch = spark, views, scratch
        self.wrote = False

    def run(self, sql: str, confs: dict[str, str], *, collect: bool,
            read_back_rows: int | None) -> tuple[Changelog, int | None]:
        """The result of the Spark SELECT ``sql`` under session ``confs``, as a changelog of
        its rows (columns as the SELECT names them, Spark's types).

        ``collect``: the executors send it to the driver as Arrow (one job; the caller knows
        it is change-sized). Otherwise they write it as Parquet files under ``scratch``, and
        the driver reads it back as Arrow when it has at most ``read_back_rows`` rows (None:
        never); a larger result stays a DataFrame over the files. Returns ``(changelog, rows
        written)``, the rows None when nothing was written (collected)."""
        with spark_confs(self.spark, confs):
            df = self.views.sql(sql)
            if collect:
                return Changelog.of_arrow(self.views, df.toArrow(), schema=df.schema), None
            self.wrote = True
            files = write_spark(df, self.scratch, new_dir("change"))
        if not files:
            return Changelog.empty(self.views, df.schema), 0
        n = sum(f.num_records for f in files)
        paths = [os.path.join(self.scratch, f.path) for f in files]
        if read_back_rows is not None and n <= read_back_rows:
            import pyarrow.dataset as pads

            from ..delta.deltars import arrow_schema
            from ..location import pyarrow_filesystem
            fs, _ = pyarrow_filesystem(paths[0])
            data = pads.dataset([pyarrow_filesystem(p)[1] for p in paths], format="parquet", filesystem=fs,
                                schema=arrow_schema(df.schema)).to_table()
            return Changelog.of_arrow(self.views, data, schema=df.schema), n
        from ..delta.deltars import as_uri
        return Changelog.of_frame(self.views, self.spark.read.schema(df.schema).parquet(*map(as_uri, paths)),
                                  rows=n), n
