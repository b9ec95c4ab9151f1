"""Run one consistent_stream model: the entry point of the dbt adapter and of the CLI.

``run_model`` validates the config, compiles the SQL (errors before anything is written),
then runs the model's query (:mod:`consistent_stream.query`): micro-batches that each end at a
planned cut and run the exactly-once protocol of :mod:`consistent_stream.runtime`, trigger
available-now (``dbt run``: every change up to the cut taken at start, then stop) or
processing-time (continuous).

A run is a few named steps (:func:`_run_job`): open the sources and take the cut
(:meth:`_Run.open`); decide what to do (:func:`_decide`); compile and start or resume the
checkpoint (:func:`_prepare`); run the query; publish and report (:func:`_report`).
``--full-refresh`` deletes the checkpoint (and the state under it): the new query gets a new
id (:mod:`consistent_stream.checkpoint`), hence a new txn app id, and its first batch rebuilds
the target from the current snapshots.

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
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

from pyspark.sql import SparkSession
from pyspark.sql.types import StructType

from . import checkpoint, config_change, location, preflight, storage
from .delta import DeltaError, DeltaTableRef
from .delta.log import settle as settle_checksums
from .errors import CompileError, ConfigError, ConsistentStreamError, SourceError
from .exec.evaluator import PlanTypes, type_plan
from .oracle import batch_dataframe
from .plan import fingerprint
from .plan_cache import compiled as compiled_model
from .plan.clock import uses_clock
from .plan.expand import expand_views
from .query import StreamingQuery, fold, no_totals, query_id, query_record
from .runtime import BatchMeta, BatchResult, QueryRuntime, target_key
from .sink.catalog import UNREAD, publish
from .sources import Cut
from .sources.dag import latest_cut
from .sources.formats import open_source, source_class
from .sources.spec import normalize_relation
from .spec import JobSpec
from .threads import begin

log = logging.getLogger("consistent_stream")


def compile_job(spark: SparkSession, job: JobSpec, cut: Cut, sources=None):
    """Compile the model (or take this machine's kept plan of it, :mod:`.plan_cache`), and get
    its output schema (from Spark's analysis of the same SQL, so the target's types are exactly
    batch evaluation's) and the plan's types; the last two are read from the checkpoint when it
    holds them for this SQL and these source schemas.
    Returns ``(compiled, output schema, plan types)``."""
    sources = sources or {s.key: open_source(s) for s in job.sources}
    schemas = {k: s.schema() for k, s in sources.items()}
    compiled = compiled_model(job.sql, job.sources, {k: [f.name for f in v.fields] for k, v in schemas.items()},
                              incremental_only=job.incremental_only)
    schema_key = json.dumps({k: json.loads(v.json()) for k, v in sorted(schemas.items())}, sort_keys=True)
    saved = storage.read_json(job.plan_path)
    compiled.plan_changes = config_change.plan_changes(saved, compiled.root)
    cached = _load_plan(saved, compiled, schema_key)
    if cached is not None:
        out_schema, types = cached
    else:
        try:
            out_schema = batch_dataframe(spark, job.sql, job.sources, cut, analysis=True).schema
        except (ConsistentStreamError, DeltaError, OSError):
            raise   # a source's table or files, never the model's SQL: the error names them
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


def _compile_ahead(spark: SparkSession, job: JobSpec, sources: dict, target: DeltaTableRef) -> Future | None:
    """:func:`compile_job` started on a thread before the sources are read, for a first build
    (no ``target`` yet: no plan saved either) whose sources are all Kafka topics: the model's
    analysis then needs their columns only (learned from the topics' first records,
    :meth:`~.sources.kafka.source.KafkaSource.schema`), so that Spark's analysis (seconds on a new
    JVM) runs while the driver reads the topics' backlog. None otherwise: a later run's plan is
    saved (its compile reads it), other sources' analysis frame is the snapshot at the cut, and
    a topic whose columns are not known yet makes the run say what it waits for, as without
    this."""
    if not sources or any(s.spec.format != "kafka" for s in sources.values()) or target.exists():
        return None
    try:
        for s in sources.values():
            s.schema()   # here: the thread's compile then reads no topic
    except SourceError:
        return None
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="compile-ahead")
    try:
        return pool.submit(compile_job, spark, job, Cut({}), sources)
    finally:
        pool.shutdown(wait=False)


def _load_plan(d, compiled, schema_key: str):
    """The output schema and plan types of the checkpoint's saved plan ``d`` (``plan.json``'s
    content or None), when saved for this SQL, these source schemas and the operators
    ``compiled`` has (:func:`.config_change.plan_changes`)."""
    if not isinstance(d, dict):
        return None
    if d.get("fingerprint") != compiled.fingerprint or d.get("source_schemas") != schema_key \
            or config_change.plain_float_accumulators(d) or compiled.plan_changes:
        return None
    return StructType.fromJson(d["output_schema"]), PlanTypes.from_json(d["types"])


def _save_plan(job: JobSpec, compiled, out_schema: StructType, types: PlanTypes) -> None:
    storage.replace_text(job.plan_path, json.dumps({
        "fingerprint": compiled.fingerprint, "source_schemas": compiled.schema_key,
        "output_schema": json.loads(out_schema.json()), "types": types.to_json(),
        "unique_key": target_key(job, compiled, out_schema)}))


def _up_to_date(job: JobSpec, cut: Cut, target) -> BatchMeta | None:
    """The target's last batch when it is a batch of the checkpoint's query that already
    reflects ``cut`` (no later batch can be pending: its cut would be past the sources'),
    else None."""
    if not target.exists():
        return None
    meta = BatchMeta.from_commit(target.latest_commit())
    if meta is None or meta.cut != cut.versions or meta.app_id != query_id(job):
        return None
    return meta


def _start_checkpoint(job: JobSpec, fp: str, full_refresh: bool) -> checkpoint.QueryRecord:
    """Record in the checkpoint the definition the run maintains (``job.json``) and its
    fingerprint ``fp``, and return its query's record, starting a query when there is none; a
    full refresh removes the checkpoint (state, the query's record) first, so a new query
    starts. It keeps the local engine's translations (``local_sql.json``): each is a function
    of a delta query's SQL and column types, used only by the code that made it
    (:class:`~consistent_stream.exec.local.Translations`), so the first incremental run after
    a full refresh does not translate again."""
    if full_refresh and storage.exists(job.checkpoint_location):
        translations = storage.read_text(job.local_sql_path)
        storage.remove_tree(job.checkpoint_location)
        if translations:
            storage.replace_text(job.local_sql_path, translations)
    job.save()
    storage.replace_text(job.fingerprint_path, fp)
    return (None if full_refresh else query_record(job)) or checkpoint.start(job.query_path)


def run_job(spark: SparkSession, job: JobSpec, *, full_refresh: bool = False,
            timeout_s: float | None = None, catalog_entry=UNREAD) -> dict:
    """Run ``job`` to the cut taken now (trigger available-now) and stop; or, with a
    processing-time trigger, keep running (until ``timeout_s`` when given). Returns the
    run summary (``batches``, ``changes_read``, ``rows_written``, ``seconds``,
    ``target_version``, ``freshness_s``, ``up_to_date``, ``metrics`` per batch,
    ``object_store_requests``: the run's, lock and checks included, as
    :meth:`location.RequestCounter.since` gives them, ...).

    The run holds the model's writer lock throughout (:mod:`consistent_stream.sink.lock`):
    a second run of the model raises ConcurrentWriterError before reading or writing
    anything of the model's (on an object store its sources' logs are listed while the lock is
    taken, :class:`_CutAhead`). ``spark`` may be a classic session or a Spark Connect client
    (:mod:`consistent_stream.connect`): the batch loop, the commits and the local engine run in
    this process either way.

    ``catalog_entry``: the target's catalog entry (a :class:`~.sink.catalog.CatalogEntry`, None
    for none) as the caller read it before the run (the dbt adapter, from dbt's relation
    cache); the run's publish then does not read it again."""
    from .sink.lock import WriterLock
    before = location.REQUESTS.snapshot()
    reach_storage(spark, job)
    ahead = None
    try:
        # the sources' logs are listed while the lock is taken (_CutAhead); the run owns its
        # checkpoint's small files: each is read once (storage.read_once_under), all at once on
        # an object store, in the round trip that opens the target and the state
        ahead = _CutAhead.start(job, full_refresh)
        with WriterLock(job.checkpoint_location, job.model) as lock, \
                storage.read_once_under((os.path.join(job.checkpoint_location, "_consistent_stream"),),
                                        prefetch=(job.spec_path, job.fingerprint_path, job.plan_path,
                                                  job.query_path, job.local_sql_path)):
            summary = _run_job(spark, job, full_refresh=full_refresh, timeout_s=timeout_s, fence=lock.check,
                               catalog_entry=catalog_entry, ahead=ahead)
        settle_checksums()   # (the last commit's version checksum, written while the lock was released)
        summary["object_store_requests"] = location.REQUESTS.since(before)
        return summary
    except Exception as e:  # a full or read-only disk, a lost session: say so (docs/troubleshooting.md)
        explained = preflight.explain_failure(job, e)
        if explained is None:
            raise
        raise explained from e
    finally:
        if ahead is not None:
            ahead.settle()   # (a run that did not take the lock: its guess's reads end with it)


def _decide(job: JobSpec, target, sources: dict, cut: Cut, fp: str,
            full_refresh: bool) -> tuple[str, list, BatchMeta | None]:
    """What a run does before anything is compiled: ``(action, changes, up_to_date)``.
    ``action`` is ``none`` (go on from the checkpoint), ``apply`` (rebuild: the definition or
    a source's schema changed, :mod:`.config_change`, or a source table was created again under
    its path, its old versions gone), ``continue`` (keep the view as it is)
    or ``fail``; ``changes`` what changed; ``up_to_date`` the target's last batch when it
    already reflects ``cut`` (an available-now run then has nothing to do).

    Raises CommitError / ConfigError from the preflight checks (the checkpoint of another
    model or damaged, the target deleted or written by someone else)."""
    preflight.check_checkpoint_owner(job)
    changes = [] if full_refresh else config_change.definition_changes(job, fp)
    # a source table created again under its path (a seed, DROP TABLE): its old versions are gone
    changes += [] if full_refresh else [config_change.Change("source_replaced", s.replaced)
                                        for s in sources.values() if getattr(s, "replaced", None)]
    if not full_refresh and not changes:
        preflight.check_checkpoint_files(job)
        if job.trigger == "available_now" and _fingerprint_is(job, fp) and not uses_clock(job.sql):
            # (a model that reads the clock is up to date only when no row crossed a bound since)
            meta = _up_to_date(job, cut, target)
            if meta is not None:
                return "none", [], meta
        # the target deleted or written by someone else; a column the model reads changed
        preflight.check_target(job, target, query_record(job))
        drift = preflight.source_schema_drift(job, fp, {k: s.schema() for k, s in sources.items()})
        changes = config_change.schema_changes(drift, job)
    action = config_change.action(job, changes) if target.exists() else ("apply" if changes else "none")
    return action, changes, None


@dataclass
class _Run:
    """What every step of one run reads: the session, the job, when the run began (``t0``,
    seconds since epoch), the sources' handles by key, the cut taken at the start and the
    target's handle. ``full_refresh`` becomes True when the run decides to rebuild;
    ``compiling``: the model's compile when it started before the sources were read
    (:func:`_compile_ahead`); ``result``: the compile's result once taken (:meth:`compiled`)."""
    spark: SparkSession
    job: JobSpec
    full_refresh: bool
    t0: float
    sources: dict
    cut: Cut
    target: DeltaTableRef
    state: DeltaTableRef
    state_opening: threading.Thread | None = None
    compiling: Future | None = None
    result: tuple | None = None   # compile_job's result, once compiled
    catalog_entry: object = UNREAD   # the target's catalog entry as read before the run (sink.catalog.publish)

    @staticmethod
    def open(spark: SparkSession, job: JobSpec, full_refresh: bool, ahead: _CutAhead | None = None) -> "_Run":
        """Open the sources and take the cut the run processes up to (their newest
        consistent cut, :func:`~consistent_stream.sources.dag.latest_cut`). On an object
        store the state table's log is read meanwhile, on a thread (:meth:`state_table`), and
        so is the target's, whose newest commit checks the cut ``ahead`` guessed while the
        lock was taken (:class:`_CutAhead`)."""
        t0 = time.time()
        sources = ahead.sources if ahead is not None else {s.key: open_source(s) for s in job.sources}
        # the run holds the model's writer lock; Spark readers of the target use its checksums
        target = ahead.target if ahead is not None else DeltaTableRef(job.target_path, own_log=True, checksums=True)
        state = DeltaTableRef(job.state_root, own_log=True)
        opening = None
        if location.is_remote(job.state_root) and not full_refresh:
            def open_state():
                try:
                    state.exists()
                except Exception:  # noqa: BLE001 (opened again where it is used, which reports it)
                    pass
            opening = threading.Thread(target=open_state, name="open-state", daemon=True)
            opening.start()
        if not full_refresh:
            if ahead is not None:
                sources, guessed = ahead.taken()
                if guessed is not None:
                    return _Run(spark, job, full_refresh, t0, sources, guessed, target, state, opening, None)
            resume_sources(sources, target)
        compiling = _compile_ahead(spark, job, sources, target)
        try:
            cut = Cut(latest_cut(list(sources.values())))
        except BaseException:
            _settle(compiling)
            raise
        return _Run(spark, job, full_refresh, t0, sources, cut, target, state, opening, compiling)

    def compiled(self):
        """:func:`compile_job`'s result: of the compile started ahead, else compiled now; once
        per run."""
        if self.result is None:
            if self.compiling is not None:
                ahead, self.compiling = self.compiling, None
                self.result = ahead.result()
            else:
                self.result = compile_job(self.spark, self.job, self.cut, self.sources)
        return self.result

    def settle(self) -> None:
        """Wait for a compile started ahead that the run did not use (its result dropped)."""
        _settle(self.compiling)
        self.compiling = None

    def state_table(self) -> DeltaTableRef:
        """The state table's handle, once the thread that opens it is done; a new one when the
        run rebuilds (a full refresh removed the state the thread may have opened)."""
        if self.state_opening is not None:
            self.state_opening.join()
            self.state_opening = None
        if self.full_refresh:
            self.state = DeltaTableRef(self.job.state_root, own_log=True)
        return self.state


def _settle(ahead: Future | None) -> None:
    if ahead is not None:
        ahead.exception()   # waits; what it raised is not the run's


class _CutAhead:
    """The cut taken while the run takes the model's writer lock, on an object store: the
    sources resume from the newest commit this machine's copy of the target's log holds
    (:meth:`~.delta.reader.TableReader.kept_commit`, no request) and list their logs at once,
    on the process's threads, in the round trip of the lock's own write instead of after it.
    The sources are only read, never written, by a run, so reading them before the lock is
    held changes nothing; what the guess rests on is the target's newest commit, which
    :meth:`taken` checks once the lock is held, with the target's LIST (the copy used as it
    is: no commit since, by this run's lock, by none other). Made only for a target on an
    object store whose sources may all be read before the lock is held
    (``reads_before_lock``: Delta tables and upstream models; a Debezium or Kafka source reads
    with others, one reader of its landing directory or topic, and is opened under the lock).

    ``sources`` and ``target`` are the run's handles (the run opens them here, before the
    lock); :meth:`settle` waits for the guess's reads (a run that does not take the lock
    calls it too, so that no request of the run outlives it)."""

    def __init__(self, job: JobSpec):
        self.job = job
        self.sources = {s.key: open_source(s) for s in job.sources}
        self.target = DeltaTableRef(job.target_path, own_log=True, checksums=True)
        self.kept = None
        self._pending = None
        kept = self.target.kept_commit()
        meta = BatchMeta.from_commit(kept) if kept is not None else None
        if meta is None or not meta.cut_offsets:
            return
        self.kept = kept

        def guess() -> Cut | None:
            try:
                for key, src in self.sources.items():
                    if key in meta.cut:
                        src.resume(meta.cut_offsets, int(meta.cut[key]))
                return Cut(latest_cut(list(self.sources.values())))
            except Exception as e:  # noqa: BLE001 (taken again from the target as read, which raises it)
                log.debug("%s: the cut from this machine's copy of the target's log failed: %s", job.model, e)
                return None
        self._pending = begin(guess, "cut-ahead")

    @staticmethod
    def start(job: JobSpec, full_refresh: bool) -> "_CutAhead | None":
        """The guess for ``job``'s run, started; None where none is made (a local target, a
        full refresh, a source not read before the lock is held: ``reads_before_lock``)."""
        if full_refresh or not job.sources or not location.is_remote(job.target_path) or \
                not all(source_class(s.format).reads_before_lock for s in job.sources):
            return None
        return _CutAhead(job)

    def settle(self) -> Cut | None:
        """The guessed cut, once its reads are done (None: no guess, or it failed); the guess
        is taken once."""
        pending, self._pending = self._pending, None
        return pending() if pending is not None else None

    def taken(self) -> tuple[dict, Cut | None]:
        """``(sources, cut)`` once the run holds the lock: the guessed cut when the target's
        newest commit is the one the guess resumed from. Otherwise the cut is None and the
        sources are new ones (nothing of what the guess read is kept), which the caller
        resumes from the target as read, as without a guess, and where an error is raised
        again."""
        if self.kept is None:
            return self.sources, None
        try:
            self.target.exists()   # the target's LIST, while the guess's reads end
        except Exception:  # noqa: BLE001 (read again by the caller, which reports it)
            pass
        cut = self.settle()
        own = self.target.replayed_log()
        if cut is not None and own is not None and own.from_copy and own.version == self.kept.version:
            return self.sources, cut
        log.debug("%s: the target's newest commit is not the one this machine's copy of its log holds; the sources "
                  "are opened again", self.job.model)
        return {s.key: open_source(s) for s in self.job.sources}, None


def resume_sources(sources: dict, target: DeltaTableRef) -> None:
    """Let each source that can (a Kafka source: :meth:`~.sources.kafka.source.KafkaSource.resume`)
    read on from the resume point the target's last commit records for its cut
    (``cut_offsets``) instead of from its log's start, before anything reads it."""
    if not target.exists() or not any(hasattr(s, "resume") for s in sources.values()):
        return
    meta = BatchMeta.from_commit(target.latest_commit())
    if meta is None or not meta.cut_offsets:
        return
    for key, src in sources.items():
        if hasattr(src, "resume") and key in meta.cut:
            src.resume(meta.cut_offsets, int(meta.cut[key]))


def _run_job(spark: SparkSession, job: JobSpec, *, full_refresh: bool, timeout_s: float | None,
             fence=lambda: None, catalog_entry=UNREAD, ahead: _CutAhead | None = None) -> dict:
    """The run's steps, in order: open the sources and take the cut; decide (nothing to do,
    keep, fail or rebuild: :func:`_decide`); compile; start or resume the checkpoint; run the
    streaming query (:mod:`.query`: plan cuts, run batches, maintain); publish and report.
    ``fence`` is called before every commit (the writer lock's :meth:`check`); ``ahead``: the
    cut guessed while the lock was taken (:class:`_CutAhead`)."""
    run = _Run.open(spark, job, full_refresh, ahead)
    run.catalog_entry = catalog_entry
    try:
        return _run_steps(run, timeout_s, fence)
    finally:
        run.settle()


def _run_steps(run: _Run, timeout_s: float | None, fence) -> dict:
    """:func:`_run_job` after the run is open."""
    spark, job, full_refresh = run.spark, run.job, run.full_refresh
    action, changes, up_to_date = _decide(job, run.target, run.sources, run.cut,
                                          fingerprint(job.sql, job.sources), full_refresh)
    if up_to_date is not None:
        return _report_up_to_date(run, up_to_date)
    if job.local_engine == "duckdb":
        from .duck import prewarm
        # the batch's delta queries and keyed state reads: opened while the compile and Spark go
        # on (a rebuild's too: one on the driver runs there, and a warm session's next run does)
        prewarm()
    if action == "none" and not full_refresh and run.target.exists():
        # the same SQL planned with other operators by this version: the state is not theirs
        changes = run.compiled()[0].plan_changes
        action = config_change.action(job, changes)
    if action == "fail":
        raise config_change.failure(job, changes)
    if action == "continue":
        return _report_kept(run, action, changes)
    if action == "apply":
        log.warning("%s: its definition changed since the checkpoint was made; rebuilding the view (a full "
                    "refresh):\n%s", job.model, config_change.describe(changes))
        run.full_refresh = True
    runtime, key, record = _prepare(run, action, changes)
    runtime.fence = fence
    query = StreamingQuery(spark, job, runtime, run.sources, run.target, record)
    if job.trigger == "available_now":
        query.run_available_now(run.cut)
    else:
        query.run_continuous(run.cut, float(job.trigger.split(':', 1)[1]), timeout_s)
    summary = _report(run, query, key)
    if action == "apply":
        summary["configuration_change"] = {"action": action, "changes": [str(c) for c in changes]}
    return summary


def _prepare(run: _Run, action: str, changes: list) -> tuple[QueryRuntime, list | None, checkpoint.QueryRecord]:
    """Compile the model (raises before anything is written), start or resume its
    checkpoint and save the plan. Returns the query's runtime, the target's key (None: a
    bag) and the query's record. A rebuild after a definition change (``action`` ``apply``) that fails to compile
    raises ConfigError with the ``changes``."""
    job = run.job
    try:
        compiled, out_schema, types = run.compiled()
    except (CompileError, ConfigError) as e:
        if action != "apply":
            raise
        raise ConfigError(f"model {job.model}: rebuilding the view after its definition changed failed, and "
                          f"nothing was read or written:\n{config_change.describe(changes)}\n{e}") from e
    key = target_key(job, compiled, out_schema)
    log.info("%s: target %s", job.model, f"merged by unique_key {key}" + ("" if job.unique_key else " (inferred)")
             if key else "kept as a bag (no unique key configured or inferred)")
    record = _start_checkpoint(job, compiled.fingerprint, run.full_refresh)
    _save_plan(job, compiled, out_schema, types)
    runtime = QueryRuntime(run.spark, job, compiled, out_schema, types, sources=run.sources, target=run.target,
                           state=run.state_table())
    return runtime, key, record


def _report_up_to_date(run: _Run, meta: BatchMeta) -> dict:
    """An available-now run whose target already reflects the cut: publish, report."""
    _publish(run)
    commit = run.target.latest_commit()
    log.info("%s: up to date (target version %d reflects the sources' latest versions)", run.job.model,
             commit.version)
    return _summary(run.job, run.t0, [], run.cut, commit.version, meta.freshness_s(commit.timestamp_ms),
                    run.full_refresh, _cached_key(run.job), up_to_date=True)


def _report_kept(run: _Run, action: str, changes: list) -> dict:
    """``on_configuration_change: continue`` after a definition change: the view is kept at
    its version, published, and the changes are reported."""
    job, target = run.job, run.target
    log.warning("%s: its definition changed since the checkpoint was made, and on_configuration_change is "
                "'continue': the view is kept as it is, at target version %d, and not refreshed:\n%s",
                job.model, target.version(), config_change.describe(changes))
    _publish(run)
    summary = _summary(job, run.t0, [], run.cut, target.version(), None, False, _cached_key(job))
    summary["configuration_change"] = {"action": action, "changes": [str(c) for c in changes]}
    return summary


def _report(run: _Run, query: StreamingQuery, key) -> dict:
    """After the query: publish the target's newest version and report the run (its
    freshness measured from the newest commit when a batch was committed)."""
    target = run.target
    version = target.latest_version() if target.exists() else None
    if version is not None:
        _publish(run)
    freshness = None
    if version is not None and any(not r.skipped for r in query.results):
        c = target.latest_commit()
        meta = BatchMeta.from_commit(c)
        freshness = meta.freshness_s(c.timestamp_ms) if meta is not None else None
    # no batch at all: a model that reads the clock, in which no row crossed a bound since
    summary = _summary(run.job, run.t0, query.results, run.cut, version, freshness, run.full_refresh, key,
                       up_to_date=not query.results and version is not None and not query.folded["batches"],
                       folded=query.folded)
    summary["progress"] = query.progress
    if query.scaler is not None:
        summary["autoscale"] = query.scaler.log
    return summary


def _fingerprint_is(job: JobSpec, fp: str) -> bool:
    """Whether the checkpoint was made for fingerprint ``fp``."""
    text = storage.read_text(job.fingerprint_path)
    return text is not None and text.strip() == fp


def _cached_key(job: JobSpec):
    """The target's key as the saved plan records it (the configured one when there is no
    plan)."""
    d = storage.read_json(job.plan_path)
    return d.get("unique_key") if isinstance(d, dict) else (job.unique_key or None)


def _publish(run: _Run) -> None:
    """Register the target in the catalog (``USING delta``) unless it already is; its
    descriptions (``persist_docs``) are in its Delta metadata."""
    job = run.job
    publish(run.spark, job.schema, job.identifier, job.target_path, entry=run.catalog_entry)


def _summary(job: JobSpec, t0: float, results: list[BatchResult], cut: Cut, version, freshness,
             full_refresh: bool, key, up_to_date: bool = False, folded: dict | None = None) -> dict:
    """The run summary of ``results`` (plus ``folded``: the totals of older results the run
    dropped, see :data:`~consistent_stream.query.KEEP_BATCH_RESULTS`)."""
    import copy
    acc = copy.deepcopy(folded) if folded else no_totals()
    for r in results:
        fold(acc, r)
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


def reach_storage(spark: SparkSession, job: JobSpec) -> None:
    """Before a run reads or writes anything: when a location of ``job`` is on an object
    store, give the session the store's settings (:func:`location.apply_to_spark`) and check
    that each such location's bucket answers to the credentials (one LIST each, once in
    :data:`location.REACHED_FOR_S` per process: the models of a dbt run share it). Raises
    StorageError naming the config key, the location and what to do."""
    places = [(f"model {job.model}: target (location_root)", job.target_path),
              (f"model {job.model}: config checkpoint_location", job.checkpoint_location)]
    places += [(f"source {s.relation}: meta.consistent_stream.location", s.location) for s in job.sources]
    location.apply_to_spark(spark, [p for _, p in places])
    checked = set()
    for key, path in places:
        bucket = location.split(path)[0] if location.is_remote(path) else None
        if bucket and bucket not in checked:
            location.check_reachable(path, key)
            checked.add(bucket)


def run_model(spark, *, project_root, schema, identifier, model_name, sql, sources, config, full_refresh,
              catalog_entry=UNREAD):
    """Entry point of the dbt adapter (``adapter.consistent_stream_run``); see ``run_job``
    (``catalog_entry`` too).

    ``sources``: the model's inputs as the materialization collects them, through ephemeral
    and view models: dbt sources, upstream consistent_stream models (``kind: model``) and
    views (``kind: view``), whose SQL is expanded into the model's here
    (:mod:`consistent_stream.plan.expand`)."""
    warehouse = _warehouse_dir(spark, project_root)
    views = [s for s in sources if s.get("kind") == "view"]
    if views:
        sql = _expand_view_refs(spark, sql, views)
        sources = [s for s in sources if s.get("kind") != "view"]
    from .sink.catalog import CatalogTables
    job = JobSpec.from_dbt(project_root=project_root, schema=schema, identifier=identifier,
                           model_name=model_name, sql=sql, sources=sources, config=config,
                           warehouse_dir=warehouse, catalog=CatalogTables(spark))
    from .verify import record_model
    summary = run_job(spark, job, full_refresh=bool(full_refresh), catalog_entry=catalog_entry)
    record_model(project_root, job)
    return summary


def _view_text(spark, name: str, relation: str) -> str:
    """The SQL of view ``relation`` (dbt model ``name``) from Spark's catalog. Raises
    SourceError when the catalog has no such view (run the view model first)."""
    try:
        rows = spark.sql(f"DESCRIBE TABLE EXTENDED {relation}").collect()
    except Exception as e:  # AnalysisException: not in the catalog
        raise SourceError(f"ref('{name}'): the view {relation} is not in Spark's catalog "
                          f"({str(e).splitlines()[0]}); run the view model first: dbt run -s +<this model>") from None
    info = {r.col_name: r.data_type for r in rows}
    if info.get("Type", "").upper() != "VIEW" or not info.get("View Text"):
        raise SourceError(f"ref('{name}'): {relation} is not a view in Spark's catalog (type "
                          f"{info.get('Type')!r}); run the view model again")
    return info["View Text"]


def _expand_view_refs(spark, sql: str, refs: list[dict]) -> str:
    """``sql`` with the views of ``refs`` (``{name, relation}`` per view the model reads,
    directly or through other views and ephemerals) expanded (:func:`~consistent_stream.plan.expand.expand_views`)."""
    texts = {normalize_relation(r["relation"]): _view_text(spark, r["name"], r["relation"]) for r in refs}
    return expand_views(sql, texts)


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
    from .sink.catalog import CatalogTables
    base = warehouse_path(project_root, _warehouse_dir(spark, project_root))
    catalog = CatalogTables(spark)
    specs = [SourceSpec.from_dbt(s, project_root, catalog) for s in sources]
    # (a source found by its catalog name is already that relation in the catalog)
    return [publish_source(spark, spec, base) for spec in specs if not spec.catalog_table]


def sources_last_modified(project_root: str, sources: list[dict], catalog=None) -> list[int]:
    """Entry point of ``dbt source freshness`` (metadata-based): for each dbt source
    (``{source_name, name, relation, meta, primary_key}``), the commit time of its newest
    position, in ms since epoch (a Delta table's newest version; a CDC landing directory's
    newest captured transaction). A source without a location is the Delta table its relation
    names in the catalog (``catalog``, a :class:`~consistent_stream.sink.catalog.CatalogTables`).
    Raises SourceError naming a source that cannot be read, ConfigError one that is not a
    Delta table (or that has no location and no ``catalog`` to find it)."""
    from .sources import SourceSpec
    out = []
    for s in sources:
        source = open_source(SourceSpec.from_dbt(s, project_root, catalog=catalog))
        out.append(int(source.commit_ms(source.latest_position())))
    return out
