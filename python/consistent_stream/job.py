"""Run one consistent_stream model: the entry point of the dbt adapter and of the CLI.

``run_model`` validates the config, compiles the SQL (errors before anything is written),
then runs a Spark Structured Streaming query: source ``consistent_stream_cuts`` whose
offsets are cuts, ``foreachBatch`` running the exactly-once protocol of
:mod:`consistent_stream.runtime`, trigger available-now (``dbt run``: every change up to the
cut taken at start, then stop) or processing-time (continuous). ``--full-refresh`` deletes
the checkpoint (and the state under it): the new query gets a new id, hence a new txn app id,
and its first batch overwrites the target from the current snapshots.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time

from pyspark.sql import SparkSession

from .delta import DeltaTableRef
from .errors import CompileError, ConfigError, ConsistentStreamError
from .oracle import batch_dataframe
from .plan import compile_model
from .runtime import BatchResult, process_batch, target_key
from .sink.catalog import publish
from .sources import Cut
from .sources.formats import column_names, latest_cut, stream_options
from .sources.stream import CutSource
from .spec import JobSpec

log = logging.getLogger("consistent_stream")


def _registered(spark: SparkSession) -> None:
    if not getattr(spark, "_consistent_stream_registered", False):
        spark.dataSource.register(CutSource)
        spark._consistent_stream_registered = True


def source_schemas(job: JobSpec) -> dict[str, list[str]]:
    return {s.key: column_names(s) for s in job.sources}


def compile_job(spark: SparkSession, job: JobSpec, cut: Cut):
    """Compile the model and get its output schema from Spark's analysis of the same SQL
    (so the target's types are exactly batch evaluation's types)."""
    compiled = compile_model(job.sql, job.sources, source_schemas(job))
    try:
        schema = batch_dataframe(spark, job.sql, job.sources, cut).schema
    except Exception as e:  # AnalysisException: the SQL is not valid Spark SQL
        raise CompileError("model SQL", f"Spark cannot analyze it: {e}") from e
    missing = [k for k in job.unique_key if k not in [f.name.lower() for f in schema.fields]]
    if missing:
        raise ConfigError(f"model {job.model}: config unique_key {job.unique_key} names columns "
                          f"{missing} that are not in the model's output {schema.fieldNames()}")
    bad_parts = [c for c in job.partition_by if c not in [f.name.lower() for f in schema.fields]]
    if bad_parts:
        raise ConfigError(f"model {job.model}: config partition_by names columns {bad_parts} "
                          f"that are not in the model's output {schema.fieldNames()}")
    return compiled, schema


def current_cut(job: JobSpec) -> Cut:
    return Cut(latest_cut(job.sources))


def _query_id(job: JobSpec) -> str:
    with open(os.path.join(job.spark_checkpoint, "metadata")) as f:
        return json.load(f)["id"]


def run_job(spark: SparkSession, job: JobSpec, *, full_refresh: bool = False,
            timeout_s: float | None = None) -> dict:
    """Run ``job`` to the cut taken now (trigger available-now) and stop; or, with a
    processing-time trigger, keep running (until ``timeout_s`` when given). Returns the
    run summary."""
    t0 = time.time()
    _registered(spark)
    cut = current_cut(job)
    compiled, out_schema = compile_job(spark, job, cut)  # raises before anything is written
    key = target_key(job, compiled, out_schema)
    log.info("%s: target %s", job.model, f"merged by unique_key {key}" + ("" if job.unique_key else " (inferred)")
             if key else "kept as a bag (no unique key configured or inferred)")

    fp_path = os.path.join(job.checkpoint_location, "_consistent_stream", "fingerprint")
    if full_refresh and os.path.exists(job.checkpoint_location):
        shutil.rmtree(job.checkpoint_location)
    if os.path.exists(fp_path):
        with open(fp_path) as f:
            old = f.read().strip()
        if old != compiled.fingerprint:
            raise ConfigError(f"model {job.model}: its SQL or sources changed since the checkpoint at "
                              f"{job.checkpoint_location} was made; run dbt run --full-refresh -s {job.model}")
    job.save()
    with open(fp_path, "w") as f:
        f.write(compiled.fingerprint)

    results: list[BatchResult] = []
    failure: list[BaseException] = []
    stopping = threading.Event()  # timeout_s reached: no new batch starts, the running one ends

    def on_batch(batch_df, batch_id: int) -> None:
        if failure:
            return
        if stopping.is_set():  # fails the query before the batch's commit point: replayed next run
            raise ConsistentStreamError(f"model {job.model}: stopping at the {timeout_s}s timeout")
        try:
            rows = batch_df.collect()
            start = Cut({r["source"]: int(r["start_version"]) for r in rows})
            end = Cut({r["source"]: int(r["end_version"]) for r in rows})
            results.append(process_batch(spark, job, compiled, out_schema, _query_id(job), batch_id, start, end))
        except BaseException as e:  # surfaced after the query stops, with our message
            failure.append(e)
            raise

    reader = (spark.readStream.format("consistent_stream_cuts")
              .option("sources", json.dumps(stream_options(job.sources))))
    if job.trigger == "available_now":
        reader = reader.option("cut", cut.to_json())
    writer = (reader.load().writeStream.foreachBatch(on_batch)
              .option("checkpointLocation", job.spark_checkpoint)
              .queryName(f"consistent_stream_{job.schema}_{job.identifier}"))
    if job.trigger == "available_now":
        writer = writer.trigger(availableNow=True)
    else:
        writer = writer.trigger(processingTime=f"{float(job.trigger.split(':', 1)[1])} seconds")
    query = writer.start()
    try:
        if not timeout_s:
            query.awaitTermination()
        elif not query.awaitTermination(timeout_s):
            # Stop between batches, never inside one: query.stop() interrupts a running batch,
            # and Spark 4.2 can die with a StackOverflowError while classifying the (long)
            # interruption message of a Python foreachBatch.
            stopping.set()
            while query.isActive and query.status.get("isTriggerActive"):
                time.sleep(0.1)
    except Exception as e:
        if not stopping.is_set():
            if failure:
                raise failure[0]
            raise ConsistentStreamError(f"model {job.model}: streaming query failed: {e}") from e
    finally:
        if query.isActive:
            query.stop()
        progress = [{k: p[k] for k in ("batchId", "numInputRows", "durationMs", "timestamp") if k in p}
                    for p in query.recentProgress]
        for p in progress:
            log.info("StreamingQueryProgress %s", json.dumps(p, default=str))
    if failure and not stopping.is_set():
        raise failure[0]

    target = DeltaTableRef(job.target_path)
    version = target.latest_version() if target.exists() else None
    if version is not None:
        publish(spark, job.schema, job.identifier, job.target_path, version, job.partition_by)
    freshness = None
    committed = [r for r in results if not r.skipped]
    if committed and version is not None:
        c = target.commit_at(version)
        src_ms = int(c.metadata.get("source_commit_ms", 0))
        freshness = round((c.timestamp_ms - src_ms) / 1000.0, 3) if src_ms else None
    return {
        "model": job.model, "batches": len(committed), "skipped_batches": len(results) - len(committed),
        "changes_read": sum(r.changes_read for r in committed),
        "rows_written": sum(r.rows_written for r in committed),
        "seconds": round(time.time() - t0, 3), "target_version": version, "target_path": job.target_path,
        "cut": cut.versions, "freshness_s": freshness, "full_refresh": bool(full_refresh),
        "unique_key": key,
        "progress": progress,
    }


def run_model(spark, *, project_root, schema, identifier, model_name, sql, sources, config, full_refresh):
    """Entry point of the dbt adapter (``adapter.consistent_stream_run``); see ``run_job``."""
    warehouse = spark.conf.get("spark.sql.warehouse.dir", os.path.join(project_root, "spark-warehouse"))
    job = JobSpec.from_dbt(project_root=project_root, schema=schema, identifier=identifier,
                           model_name=model_name, sql=sql, sources=sources, config=config,
                           warehouse_dir=warehouse)
    from .verify import record_model
    summary = run_job(spark, job, full_refresh=bool(full_refresh))
    record_model(project_root, job)
    return summary
