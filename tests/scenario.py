"""Small hand-built change streams over real Delta tables, checked against batch evaluation."""
from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

from consistent_stream.job import run_job
from helpers import assert_target_equals_batch_evaluation, job_for

CDF = {"delta.enableChangeDataFeed": "true"}


class Scenario:
    """Source tables under ``root/src``; ``run()`` runs the model and checks the contract."""

    def __init__(self, spark, root: Path, tables: dict[str, pa.Table], keys: dict[str, list[str]]):
        self.spark, self.root = spark, root
        shutil.rmtree(root, ignore_errors=True)
        self.keys = keys
        for name, data in tables.items():
            write_deltalake(self.path(name), data, configuration=CDF)

    def path(self, name: str) -> str:
        return str(self.root / "src" / name)

    def sources(self) -> list[dict]:
        return [{"source_name": "src", "name": n, "relation": f"src.{n}",
                 "meta": {"location": self.path(n), "primary_key": k}} for n, k in self.keys.items()]

    def job(self, sql: str, unique_key, name: str = "m"):
        return job_for(name, sql, self.sources(), unique_key, self.root)

    def insert(self, name: str, data: pa.Table) -> None:
        write_deltalake(self.path(name), data, mode="append")

    def delete(self, name: str, predicate: str) -> None:
        DeltaTable(self.path(name)).delete(predicate)

    def update(self, name: str, values: dict[str, str], predicate: str) -> None:
        DeltaTable(self.path(name)).update(updates=values, predicate=predicate)

    def run(self, job, full_refresh: bool = False) -> dict:
        summary = run_job(self.spark, job, full_refresh=full_refresh)
        self.check(job)
        return summary

    def check(self, job) -> None:
        assert_target_equals_batch_evaluation(self.spark, job, job.model)
