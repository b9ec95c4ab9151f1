"""Run one consistent_stream model: the entry point of the dbt adapter and of the CLI.

``run_model`` validates the config, compiles the SQL (errors before anything is written),
then runs a Spark Structured Streaming query: source ``consistent_stream_cuts`` whose
offsets are cuts, ``foreachBatch`` running the exactly-once protocol of
:mod:`consistent_stream.runtime`, trigger available-now (``dbt run``: every change up to the
cut taken at start, then stop) or processing-time (continuous). ``--full-refresh`` deletes
the checkpoint (and the state under it): the new query gets a new id, hence a new txn app id,
and its first batch rebuilds the target from the current snapshots.

A run whose sources did not change since the target's last batch does nothing: no Spark job,
no query, no commit; it reports the model as up to date (with the freshness of its version).
What the compiler and Spark's analysis found about the plan (output schema, the plan's
types, the key) is kept beside the checkpoint, and so are the local engine's translations
of its delta queries, so later runs neither analyze snapshots, re-type the plan nor
translate its queries again.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from . import spark_checkpoint
from .delta import Docs
from .errors import CommitError, CompileError, ConfigError, ConsistentStreamError
from .oracle import batch_dataframe
from .plan import compile_model, fingerprint
from .plan.incremental import PlanTypes, spark_confs, type_plan
from .runtime import BatchMeta, BatchResult, QueryRuntime, target_key
from .sink.catalog import publish
from .sources import Cut
from .sources.backlog import BacklogPlanner
from .sources.formats import latest_cut, open_source
from .sources.spec import INITIAL
from .sources.stream import CutLog
from .spec import JobSpec, replace_text

log = logging.getLogger("consistent_stream")


def source_schemas(job: JobSpec) -> dict[str, list[str]]:
    return {s.key: open_source(s).columns() for s in job.sources}


def compile_job(spark: SparkSession, job: JobSpec, cut: Cut, sources=None):
    """Compile the model, and get its output schema (from Spark's analysis of the same SQL, so
    the target's types are exactly batch evaluation's) and the plan's types; the last two are
    read from the checkpoint when it holds them for this SQL and these source schemas.
    Returns ``(compiled, output schema, plan types)``."""
    sources = sources or {s.key: open_source(s) for s in job.sources}
    schemas = {k: s.schema() for k, s in sources.items()}
    compiled = compile_model(job.sql, job.sources, {k: [f.name for f in v.fields] for k, v in schemas.items()})
    schema_key = json.dumps({k: json.loads(v.json()) for k, v in sorted(schemas.items())}, sort_keys=True)
    cached = _load_plan(job, compiled.fingerprint, schema_key)
    if cached is not None:
        out_schema, types = cached
    else:
        try:
            out_schema = batch_dataframe(spark, job.sql, job.sources, cut).schema
        except Exception as e:  # AnalysisException: the SQL is not valid Spark SQL
            raise CompileError("model SQL", f"Spark cannot analyze it: {e}") from e
        types = type_plan(spark, compiled.root, schemas)
    from .sink.constraints import check_contract
    check_contract(out_schema, job.contract, job.model)
    missing = [k for k in job.unique_key if k not in [f.name.lower() for f in out_schema.fields]]
    if missing:
        raise ConfigError(f"model {job.model}: config unique_key {job.unique_key} names columns "
                          f"{missing} that are not in the model's output {out_schema.fieldNames()}")
    bad_parts = [c for c in job.partition_by if c not in [f.name.lower() for f in out_schema.fields]]
    if bad_parts:
        raise ConfigError(f"model {job.model}: config partition_by names columns {bad_parts} "
                          f"that are not in the model's output {out_schema.fieldNames()}")
    compiled.schema_key = schema_key
    return compiled, out_schema, types


def _load_plan(job: JobSpec, fp: str, schema_key: str):
    try:
        with open(job.plan_path) as f:
            d = json.load(f)
    except (OSError, ValueError):
        return None
    if d.get("fingerprint") != fp or d.get("source_schemas") != schema_key:
        return None
    return StructType.fromJson(d["output_schema"]), PlanTypes.from_json(d["types"])


def _save_plan(job: JobSpec, compiled, out_schema: StructType, types: PlanTypes) -> None:
    replace_text(job.plan_path, json.dumps({
        "fingerprint": compiled.fingerprint, "source_schemas": compiled.schema_key,
        "output_schema": json.loads(out_schema.json()), "types": types.to_json(),
        "unique_key": target_key(job, compiled, out_schema)}))


def _query_id(job: JobSpec) -> str | None:
    return spark_checkpoint.query_id(job.spark_checkpoint)


def _last_spark_commit(job: JobSpec) -> int | None:
    """The newest batch Spark's checkpoint records as committed."""
    return spark_checkpoint.last_committed(job.spark_checkpoint)


def _up_to_date(job: JobSpec, cut: Cut, target) -> BatchMeta | None:
    """The target's last batch when it already reflects ``cut`` and Spark's checkpoint has
    recorded it (so no batch is pending), else None."""
    if not target.exists():
        return None
    meta = BatchMeta.from_commit(target.latest_commit())
    if meta is None or meta.cut != cut.versions or meta.app_id != _query_id(job):
        return None
    return meta if _last_spark_commit(job) == meta.batch_id else None


def _start_checkpoint(job: JobSpec, fp: str, full_refresh: bool) -> None:
    """Record in the checkpoint the definition the run maintains (``job.json``) and its
    fingerprint ``fp``; a full refresh removes the checkpoint (state, cut log, Spark's
    query) first. It keeps the local engine's translations (``local_sql.json``): each is a
    function of a delta query's SQL and column types, used only by the code that made it
    (:class:`~consistent_stream.plan.local.Translations`), so the first incremental run after
    a full refresh does not translate again (about 0.03 s of customer_order_totals' batch at
    SF 10)."""
    if full_refresh and os.path.exists(job.checkpoint_location):
        try:
            with open(job.local_sql_path) as f:
                translations = f.read()
        except OSError:
            translations = None
        shutil.rmtree(job.checkpoint_location)
        if translations:
            replace_text(job.local_sql_path, translations)
    job.save()
    replace_text(job.fingerprint_path, fp)


def require_classic_session(spark, model: str) -> None:
    """Raise ConfigError when ``spark`` is a Spark Connect session (``sc://``, ``spark.remote``).

    The engine runs each micro-batch on the driver, in ``foreachBatch``, with its Delta
    handles, state store and cut log, and reads its Spark jobs from the SparkContext. Over
    Spark Connect the ``foreachBatch`` function is pickled and run in a Python process on the
    server, without access to anything defined outside it (pyspark:
    ``STREAMING_CONNECT_SERIALIZATION_ERROR``, "cannot pickle 'deltalake._internal.RawDeltaTable'"),
    there is no SparkContext, and DataFrames are analyzed lazily on the server, after the
    engine has dropped the temporary views they read (``TABLE_OR_VIEW_NOT_FOUND`` while
    compiling). README, "On a Spark cluster"."""
    if type(spark).__module__.startswith("pyspark.sql.connect"):
        raise ConfigError(
            f"model {model}: the dbt session is a Spark Connect session (spark.remote / sc://), which "
            f"consistent_stream does not support: its micro-batches run on the driver (foreachBatch with the "
            f"engine's Delta handles and state), which Spark Connect cannot ship to its server. Use a classic "
            f"session (method: session) with spark.master set to the cluster, e.g. spark://host:7077 (README, "
            f"\"On a Spark cluster\"). Nothing was read or written")


def run_job(spark: SparkSession, job: JobSpec, *, full_refresh: bool = False,
            timeout_s: float | None = None) -> dict:
    """Run ``job`` to the cut taken now (trigger available-now) and stop; or, with a
    processing-time trigger, keep running (until ``timeout_s`` when given). Returns the
    run summary (``batches``, ``changes_read``, ``rows_written``, ``seconds``,
    ``target_version``, ``freshness_s``, ``up_to_date``, ``metrics`` per batch, ...).

    The run holds the model's writer lock throughout (:mod:`consistent_stream.sink.lock`):
    a second run of the model raises ConcurrentWriterError before reading or writing
    anything. Raises ConfigError on a Spark Connect session (:func:`require_classic_session`)."""
    from .preflight import explain_failure
    from .sink.lock import WriterLock
    require_classic_session(spark, job.model)
    try:
        with WriterLock(job.checkpoint_location, job.model):
            return _run_job(spark, job, full_refresh=full_refresh, timeout_s=timeout_s)
    except Exception as e:  # a full or read-only disk, a lost session: say so (README "Bad inputs")
        explained = explain_failure(job, e)
        if explained is None:
            raise
        raise explained from e


def _decide(job: JobSpec, target, sources: dict, cut: Cut, fp: str,
            full_refresh: bool) -> tuple[str, list, BatchMeta | None]:
    """What a run does before anything is compiled: ``(action, changes, up_to_date)``.
    ``action`` is ``none`` (go on from the checkpoint), ``apply`` (rebuild: the definition or
    a source's schema changed, :mod:`.config_change`), ``continue`` (keep the view as it is)
    or ``fail``; ``changes`` what changed; ``up_to_date`` the target's last batch when it
    already reflects ``cut`` (an available-now run then has nothing to do).

    Raises CommitError / ConfigError from the preflight checks (the checkpoint of another
    model or damaged, the target deleted or written by someone else)."""
    from . import config_change, preflight
    preflight.check_checkpoint_owner(job)
    changes = [] if full_refresh else config_change.definition_changes(job, fp)
    if not full_refresh and not changes:
        preflight.check_checkpoint_files(job)
        if job.trigger == "available_now" and _fingerprint_is(job, fp):
            meta = _up_to_date(job, cut, target)
            if meta is not None:
                return "none", [], meta
        # the target deleted or written by someone else; a column the model reads changed
        preflight.check_target(job, target, _query_id(job), _last_spark_commit(job))
        drift = preflight.source_schema_drift(job, fp, {k: s.schema() for k, s in sources.items()})
        changes = config_change.schema_changes(drift, job)
    action = config_change.action(job, changes) if target.exists() else ("apply" if changes else "none")
    return action, changes, None


def _run_job(spark: SparkSession, job: JobSpec, *, full_refresh: bool, timeout_s: float | None) -> dict:
    t0 = time.time()
    sources = {s.key: open_source(s) for s in job.sources}
    cut = Cut(latest_cut(list(sources.values())))
    from . import config_change
    from .delta import DeltaTableRef
    target = DeltaTableRef(job.target_path)
    action, changes, up_to_date = _decide(job, target, sources, cut, fingerprint(job.sql, job.sources), full_refresh)
    if up_to_date is not None:
        _publish(spark, job, target, target.version())
        commit = target.latest_commit()
        log.info("%s: up to date (target version %d reflects the sources' latest versions)", job.model, commit.version)
        return _summary(job, t0, [], cut, commit.version, up_to_date.freshness_s(commit.timestamp_ms),
                        full_refresh, _cached_key(job), up_to_date=True)
    if action == "fail":
        raise config_change.failure(job, changes)
    if action == "continue":
        log.warning("%s: its definition changed since the checkpoint was made, and on_configuration_change is "
                    "'continue': the view is kept as it is, at target version %d, and not refreshed:\n%s",
                    job.model, target.version(), config_change.describe(changes))
        _publish(spark, job, target, target.version())
        summary = _summary(job, t0, [], cut, target.version(), None, False, _cached_key(job))
        summary["configuration_change"] = {"action": action, "changes": [str(c) for c in changes]}
        return summary
    if action == "apply":
        log.warning("%s: its definition changed since the checkpoint was made; rebuilding the view (a full "
                    "refresh):\n%s", job.model, config_change.describe(changes))
        full_refresh = True
    if job.local_engine == "duckdb" and not full_refresh:
        from .duck import prewarm
        prewarm()   # the batch's delta queries and keyed state reads: opened while Spark starts the query
    try:
        compiled, out_schema, types = compile_job(spark, job, cut, sources)  # raises before anything is written
    except (CompileError, ConfigError) as e:
        if action != "apply":
            raise
        raise ConfigError(f"model {job.model}: rebuilding the view after its definition changed failed, and "
                          f"nothing was read or written:\n{config_change.describe(changes)}\n{e}") from e
    key = target_key(job, compiled, out_schema)
    log.info("%s: target %s", job.model, f"merged by unique_key {key}" + ("" if job.unique_key else " (inferred)")
             if key else "kept as a bag (no unique key configured or inferred)")
    _start_checkpoint(job, compiled.fingerprint, full_refresh)
    _save_plan(job, compiled, out_schema, types)
    runtime = QueryRuntime(spark, job, compiled, out_schema, types, sources=sources, target=target)

    cuts = CutLog(job.cuts_dir)
    # the planner's source handles: the run's own when it plans between available-now queries
    # (on this thread, while no batch runs); its own in a continuous run, whose planning thread
    # reads the sources beside the batches
    planner_sources = sources if job.trigger == "available_now" else {s.key: open_source(s) for s in job.sources}
    planner = BacklogPlanner(planner_sources.values(), max_rows=job.max_batch_rows,
                             recompute_threshold=job.recompute_threshold)
    _plan(job, cuts, planner, target, cut)

    results: list[BatchResult] = []
    folded = _no_totals()   # results dropped from ``results`` (a long continuous run)
    failure: list[BaseException] = []
    from .sink.maintenance import Maintenance
    maintenance = Maintenance(job, target=target, state=runtime.store.table)
    stopping = threading.Event()  # no new batch starts (timeout_s reached, or the run ends)
    timed_out = threading.Event()
    scaler = _Scaling(spark, job, runtime) if job.autoscale is not None else None

    def on_batch(batch_df, batch_id: int) -> None:
        started()
        if failure:
            return
        if stopping.is_set():  # fails the query before the batch's commit point: replayed next run
            raise ConsistentStreamError(f"model {job.model}: stopping at the {timeout_s}s timeout")
        try:
            # the batch's file is cut file batch_id (read on the driver); Spark reads the
            # batch only when that file is gone
            planned = cuts.read(batch_id) or CutLog.batch_cut(batch_df)
            if planned is not None:
                result = process_batch(runtime, _query_id(job), batch_id, *planned)
                results.append(result)
                if len(results) > KEEP_BATCH_RESULTS:
                    _fold(folded, results.pop(0))
                if not result.skipped:  # the batch is committed: logs, old versions, files it superseded
                    maintenance.after_batch(batch_id, runtime.last.state_version if runtime.last else None)
                    if scaler is not None:  # at the batch boundary: the next batch's parallelism
                        try:
                            scaler.after_batch(result)
                        except Exception as e:  # the batch is committed: scaling must not fail the run
                            log.warning("%s: autoscale after batch %d failed, parallelism stays %s: %s",
                                        job.model, batch_id, runtime.parallelism, e)
        except BaseException as e:  # surfaced after the query stops, with our message
            failure.append(e)
            raise

    starting: list = []   # the session confs a query starts with, until its source exists
    starting_lock = threading.Lock()

    def started() -> None:
        """Restore the session confs that ``start_query`` set: called when the query's first
        micro-batch begins (its file source and the source's log exist by then) and when the
        query ends."""
        with starting_lock:
            while starting:
                starting.pop().__exit__(None, None, None)

    def start_query(trigger: dict):
        confs = spark_confs(spark, spark_checkpoint.QUERY_START_CONFS)
        with starting_lock:
            confs.__enter__()
            starting.append(confs)
        try:
            return (cuts.stream(spark).writeStream.foreachBatch(on_batch)
                    .option("checkpointLocation", job.spark_checkpoint)
                    .queryName(f"consistent_stream_{job.schema}_{job.identifier}")
                    .trigger(**trigger).start())
        except BaseException:
            started()
            raise

    progress: list[dict] = []
    if job.trigger == "available_now":
        # One planned cut at a time (see CutLog): plan the next cut, run an available-now
        # query that processes it, repeat until the cut taken at the start is reached.
        while True:
            _plan(job, cuts, planner, target, cut)
            if not _pending(job, cuts):
                break
            before = _last_spark_commit(job)
            seq = cuts.last()[0]
            planned = cuts.read(seq)
            if planned is not None:   # read and evaluate it while the query plans its micro-batch
                runtime.prepare(_query_id(job), seq, *planned)
            try:
                query = start_query({"availableNow": True})
            except BaseException:
                runtime.discard_prepared()
                raise
            runtime.start_preparing()
            try:
                query.awaitTermination()
            except Exception as e:
                if failure:
                    raise failure[0]
                raise ConsistentStreamError(f"model {job.model}: streaming query failed: {e}") from e
            finally:
                started()
                progress += _progress(query)
                runtime.discard_prepared()   # when no micro-batch took it
            if failure:
                raise failure[0]
            if _pending(job, cuts) and _last_spark_commit(job) == before:
                raise CommitError(
                    f"model {job.model}: Spark's file source did not pick up the planned cut {cuts.last()} under "
                    f"{cuts.directory} (no micro-batch ran). Nothing was written; run again, or dbt run "
                    f"--full-refresh -s {job.model} if this repeats")
    else:
        interval = float(job.trigger.split(':', 1)[1])
        from .delta import DeltaTableRef as _Ref
        target_for_planner = _Ref(job.target_path)

        def plan_forever():
            backlog = False
            while not stopping.wait(0.05 if backlog else interval):
                if _pending(job, cuts):
                    # the query has not processed the planned cut yet: the next plan, once it
                    # has, takes everything that arrived meanwhile (at once while a backlog
                    # is being worked off, else at the next interval)
                    continue
                try:
                    backlog = not _plan(job, cuts, planner, target_for_planner,
                                        Cut(latest_cut(list(planner_sources.values()))))
                except Exception as e:  # surfaced by the next batch (or the run's end)
                    log.warning("%s: planning the next cut failed: %s", job.model, e)
        _plan(job, cuts, planner, target, cut)
        query = start_query({"processingTime": f"{interval} seconds"})
        planning = threading.Thread(target=plan_forever, name=f"consistent_stream planner {job.model}", daemon=True)
        planning.start()
        try:
            if not timeout_s:
                query.awaitTermination()
            elif not query.awaitTermination(timeout_s):
                # Stop between batches, never inside one: query.stop() interrupts a running batch,
                # and Spark 4.2 can die with a StackOverflowError while classifying the (long)
                # interruption message of a Python foreachBatch.
                timed_out.set()
                stopping.set()
                while query.isActive and query.status.get("isTriggerActive"):
                    time.sleep(0.1)
        except Exception as e:
            if not timed_out.is_set():
                if failure:
                    raise failure[0]
                raise ConsistentStreamError(f"model {job.model}: streaming query failed: {e}") from e
        finally:
            stopping.set()
            if query.isActive:
                query.stop()
            started()
            progress += _progress(query)
        if failure and not timed_out.is_set():
            raise failure[0]

    version = target.latest_version() if target.exists() else None
    if version is not None:
        _publish(spark, job, target, version)
    freshness = None
    committed = [r for r in results if not r.skipped]
    if committed and version is not None:
        c = target.latest_commit()
        meta = BatchMeta.from_commit(c)
        freshness = meta.freshness_s(c.timestamp_ms) if meta is not None else None
    summary = _summary(job, t0, results, cut, version, freshness, full_refresh, key, folded=folded)
    summary["progress"] = progress
    if scaler is not None:
        summary["autoscale"] = scaler.log
    if action == "apply":
        summary["configuration_change"] = {"action": action, "changes": [str(c) for c in changes]}
    return summary


class _Scaling:
    """The autoscaler of a continuous run (:mod:`.autoscale`): after each committed batch it
    measures the lag behind the batch's cut (its own source handles: the planning thread has
    its own), asks the policy for the next batch's parallelism, applies it (the runtime's
    local engine threads and shuffle partitions; executors on a standalone cluster) and logs
    the decision with its inputs. ``log``: every decision, with its time and batch."""

    def __init__(self, spark: SparkSession, job: JobSpec, runtime: QueryRuntime):
        from .autoscale import AutoscaleConfig, Autoscaler, session_parallelism
        self.spark, self.job, self.runtime = spark, job, runtime
        offered = session_parallelism(spark)
        cfg = AutoscaleConfig(**{"max_parallelism": max(offered, int(job.autoscale.get("min_parallelism", 1))),
                                 **job.autoscale})
        self.policy = Autoscaler(cfg, initial=cfg.min_parallelism)
        self.sources = {s.key: open_source(s) for s in job.sources}
        self.log: list[dict] = []
        runtime.parallelism = self.policy.parallelism
        applied = self._executors(self.policy.parallelism)   # a cluster session starts with every core
        log.info("%s: autoscale from parallelism %d (%s)%s", job.model, self.policy.parallelism, cfg,
                 f"; {applied}" if applied else "")

    def _executors(self, parallelism: int) -> dict:
        """The executors for ``parallelism`` on a standalone cluster
        (:func:`~consistent_stream.autoscale.apply_to_cluster`; ``{}`` elsewhere). A failure
        is logged and returned as ``{"error": ...}``: scaling must not fail the run."""
        from .autoscale import apply_to_cluster
        try:
            return apply_to_cluster(self.spark, parallelism)
        except Exception as e:
            log.warning("%s: autoscale could not set the executors for parallelism %d: %s", self.job.model,
                        parallelism, e)
            return {"error": str(e)}

    def after_batch(self, result: BatchResult) -> None:
        from .autoscale import BatchSample
        from .sources.backlog import pending
        now = time.time()
        latest = latest_cut(list(self.sources.values()))
        lag_rows, oldest_ms = pending(list(self.sources.values()), result.cut, latest)
        sample = BatchSample(now, result.changes_read, result.seconds, self.policy.parallelism, lag_rows,
                             max(0.0, now - oldest_ms / 1000.0) if oldest_ms is not None else 0.0,
                             self.runtime.store.total_rows())
        d = self.policy.observe(sample)
        applied = {}
        if d.action != "hold":
            self.runtime.parallelism = d.parallelism
            applied = self._executors(d.parallelism)
            log.info("%s: autoscale %s %d -> %d after batch %d: %s; inputs %s%s", self.job.model, d.action,
                     d.previous, d.parallelism, result.batch_id, d.reason, json.dumps(d.inputs),
                     f"; {applied}" if applied else "")
        else:
            log.debug("%s: autoscale hold at %d after batch %d: %s", self.job.model, d.parallelism,
                      result.batch_id, d.reason)
        self.log.append({"t": round(now, 3), "batch_id": result.batch_id, "lag_rows": lag_rows,
                         "lag_s": round(sample.lag_s, 3), "rows": result.changes_read,
                         "seconds": round(result.seconds, 3), **d.as_dict(), **applied})
        if len(self.log) > KEEP_BATCH_RESULTS:
            self.log.pop(0)


def _progress(query) -> list[dict]:
    """The query's recent ``StreamingQueryProgress`` (batch id, input rows, durations), each
    logged at debug level."""
    progress = [{k: p[k] for k in ("batchId", "numInputRows", "durationMs", "timestamp") if k in p}
                for p in query.recentProgress]
    for p in progress:
        log.debug("StreamingQueryProgress %s", json.dumps(p, default=str))
    return progress


def _plan(job: JobSpec, cuts: CutLog, planner: BacklogPlanner, target, upto: Cut) -> bool:
    """Append to the cut log the next batch from the last planned cut towards ``upto``, when
    the query has processed every planned cut: it ends at the first cut of
    :func:`~consistent_stream.sources.backlog.plan_cuts` (at most ``max_batch_rows`` source
    change rows, at a transaction-consistent cut), which ``planner`` computes once per
    backlog. Returns whether the log reaches ``upto``
    (nothing is left to plan after this batch).

    One planned cut at a time: Spark's file source may admit every file it sees into one
    micro-batch (``maxFilesPerTrigger`` limits the files of one offset request, and a batch's
    offset can span two requests), and ``cleanSource`` then deletes the batch's last file
    only; with two files planned ahead, a batch processed cut ``n`` while the file of cut
    ``n + 1`` was deleted unprocessed (crash campaign, seed 5, trial 39). With one file, a
    micro-batch is exactly one planned cut."""
    if _pending(job, cuts):
        return False
    last = cuts.last()
    if last is not None:
        seq, start = last
    else:
        seq, start = -1, Cut({k: INITIAL for k in upto.versions})
        meta = BatchMeta.from_commit(target.latest_commit()) if target.exists() else None
        if meta is not None and meta.app_id == _query_id(job) and set(meta.cut) == set(upto.versions):
            seq, start = _last_spark_commit(job) if _last_spark_commit(job) is not None else -1, Cut(meta.cut)
    current = {k: v for k, v in start.versions.items()}
    for end in planner.cuts(current, upto.versions):
        end = {k: max(int(v), int(current.get(k, INITIAL))) for k, v in end.items()}
        if end == current:
            continue
        cuts.append(seq + 1, Cut(current), Cut(end))
        return all(int(end.get(k, INITIAL)) >= int(v) for k, v in upto.versions.items())
    return True


def _pending(job: JobSpec, cuts: CutLog) -> bool:
    """Whether the cut log holds a planned cut that Spark's checkpoint has not recorded as a
    committed batch yet (cut file ``seq`` is micro-batch ``seq``: one file per batch)."""
    last = cuts.last()
    if last is None:
        return False
    done = _last_spark_commit(job)
    return done is None or last[0] > done


def process_batch(runtime: QueryRuntime, app_id: str, batch_id: int, start: Cut, end: Cut) -> BatchResult:
    """One micro-batch of ``runtime``'s query (a seam for tests that slow a batch down)."""
    return runtime.process_batch(app_id, batch_id, start, end)


def _fingerprint_is(job: JobSpec, fp: str) -> bool:
    try:
        with open(job.fingerprint_path) as f:
            return f.read().strip() == fp
    except OSError:
        return False


def _cached_key(job: JobSpec):
    try:
        with open(job.plan_path) as f:
            return json.load(f).get("unique_key")
    except (OSError, ValueError):
        return job.unique_key or None


def _publish(spark: SparkSession, job: JobSpec, target, version: int) -> None:
    """Register the target's ``version`` in the catalog unless it already is, with the
    model's descriptions (``persist_docs``)."""
    publish(spark, job.schema, job.identifier, job.target_path, version, job.partition_by,
            docs=Docs.from_dbt(job.docs), table=target)


KEEP_BATCH_RESULTS = 1000
"""A run keeps the results of its last this many batches (the summary's ``metrics``); older
ones only count in the summary's totals, so a continuous run's driver memory does not grow
with the number of its batches."""
_METRICS = ("spark_jobs", "state_rows_read", "state_files_read", "state_rows_compacted", "target_rows_rewritten")


def _fold(acc: dict, r: BatchResult) -> dict:
    """Add batch result ``r`` to the running totals ``acc`` (see :func:`_summary`)."""
    if r.skipped:
        acc["skipped_batches"] += 1
        return acc
    acc["batches"] += 1
    acc["changes_read"] += r.changes_read
    acc["rows_written"] += r.rows_written
    acc["strategies"].add(r.metrics.strategy)
    for k in _METRICS:
        acc["totals"][k] += getattr(r.metrics, k)
    for p, s in r.metrics.phases.items():
        acc["totals"]["phases"][p] = round(acc["totals"]["phases"].get(p, 0.0) + s, 3)
    return acc


def _no_totals() -> dict:
    return {"batches": 0, "skipped_batches": 0, "changes_read": 0, "rows_written": 0, "strategies": set(),
            "totals": {**{k: 0 for k in _METRICS}, "phases": {}}}


def _summary(job: JobSpec, t0: float, results: list[BatchResult], cut: Cut, version, freshness,
             full_refresh: bool, key, up_to_date: bool = False, folded: dict | None = None) -> dict:
    """The run summary of ``results`` (plus ``folded``: the totals of older results the run
    dropped, see ``KEEP_BATCH_RESULTS``)."""
    import copy
    acc = copy.deepcopy(folded) if folded else _no_totals()
    for r in results:
        _fold(acc, r)
    committed = [r for r in results if not r.skipped]
    return {
        "model": job.model, "batches": acc["batches"], "skipped_batches": acc["skipped_batches"],
        "changes_read": acc["changes_read"], "rows_written": acc["rows_written"],
        "seconds": round(time.time() - t0, 3), "target_version": version, "target_path": job.target_path,
        "cut": cut.versions, "freshness_s": freshness, "full_refresh": bool(full_refresh),
        "unique_key": key, "up_to_date": up_to_date,
        "strategies": sorted(acc["strategies"]),
        "totals": acc["totals"],
        "metrics": [{"batch_id": r.batch_id, "seconds": round(r.seconds, 3), "changes_read": r.changes_read,
                     **r.metrics.to_dict()} for r in committed],
    }


def run_model(spark, *, project_root, schema, identifier, model_name, sql, sources, config, full_refresh):
    """Entry point of the dbt adapter (``adapter.consistent_stream_run``); see ``run_job``.

    ``sources``: the model's inputs as the materialization collects them, through ephemeral
    and view models: dbt sources, upstream consistent_stream models (``kind: model``) and
    views (``kind: view``), whose SQL is expanded into the model's here
    (:mod:`consistent_stream.plan.expand`)."""
    warehouse = _warehouse_dir(spark, project_root)
    views = [s for s in sources if s.get("kind") == "view"]
    if views:
        from .plan.expand import expand_view_refs
        sql = expand_view_refs(spark, sql, views)
        sources = [s for s in sources if s.get("kind") != "view"]
    job = JobSpec.from_dbt(project_root=project_root, schema=schema, identifier=identifier,
                           model_name=model_name, sql=sql, sources=sources, config=config,
                           warehouse_dir=warehouse)
    from .verify import record_model
    summary = run_job(spark, job, full_refresh=bool(full_refresh))
    record_model(project_root, job)
    return summary


def _warehouse_dir(spark, project_root: str) -> str:
    """The session's ``spark.sql.warehouse.dir`` (Spark's default: ``spark-warehouse`` in the
    project)."""
    return spark.conf.get("spark.sql.warehouse.dir", os.path.join(project_root, "spark-warehouse"))


def publish_sources(spark, project_root: str, sources: list[dict]) -> list[int]:
    """Entry point of the adapter's view support: publish each dbt source (``{source_name,
    name, relation, meta}``) at its latest version as its relation in Spark's catalog
    (:func:`~consistent_stream.sink.catalog.publish_source`). Returns the versions."""
    from .sink.catalog import publish_source
    from .sources import SourceSpec
    from .spec import warehouse_path
    base = warehouse_path(project_root, _warehouse_dir(spark, project_root))
    return [publish_source(spark, SourceSpec.from_dbt(s, project_root), base) for s in sources]


def sources_last_modified(project_root: str, sources: list[dict]) -> list[int]:
    """Entry point of ``dbt source freshness`` (metadata-based): for each dbt source
    (``{source_name, name, relation, meta}``), the commit time of its newest position, in ms
    since epoch (a Delta table's newest version; a CDC landing directory's newest captured
    transaction). Raises SourceError naming a source that cannot be read."""
    from .sources import SourceSpec
    out = []
    for s in sources:
        source = open_source(SourceSpec.from_dbt(s, project_root))
        out.append(int(source.commit_ms(source.latest_position())))
    return out
