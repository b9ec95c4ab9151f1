"""The ``consistent_spark`` adapter: dbt-spark's adapter plus one method that runs the engine.

Everything dbt-spark does (``table``, ``view``, ``incremental``, seeds, tests, the catalog)
is inherited. The ``consistent_stream`` materialization validates its config in Jinja and
calls :meth:`ConsistentSparkAdapter.consistent_stream_run`, which hands the model to
``consistent_stream.job.run_model`` in this process, on dbt-spark's SparkSession.
"""

import logging
import os
import re
import traceback
from datetime import datetime, timezone
from dataclasses import field, fields, make_dataclass
from importlib import import_module
from typing import Any, Dict, Iterable, List, Optional, Union

from dbt.adapters.base import available
from dbt.adapters.base.relation import AdapterTrackingRelationInfo, BaseRelation
from dbt.adapters.capability import Capability, CapabilityDict, CapabilitySupport, Support
from dbt.adapters.contracts.relation import RelationConfig
from dbt.adapters.events.logging import AdapterLogger
from dbt.adapters.spark.connections import SparkConnectionMethod
from dbt.adapters.spark.impl import SparkAdapter, SparkConfig
from dbt_common.exceptions import DbtRuntimeError

from consistent_stream.model_config import MODEL_CONFIG, config_keys
from dbt.adapters.consistent_spark.connections import ConsistentSparkConnectionManager

logger = AdapterLogger("ConsistentSpark")


class _EngineLogToDbt(logging.Handler):
    """The engine's Python logging (``consistent_stream.*``) in dbt's log: the progress
    reports of long batches (``consistent_stream.progress``) at info, in dbt's output;
    warnings as warnings; the rest at debug (``logs/dbt.log``, ``--debug``)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record must not fail the model
            return
        if record.levelno >= logging.WARNING:
            logger.warning(message)
        elif record.name == "consistent_stream.progress":
            logger.info(message)
        else:
            logger.debug(message)


def _bridge_engine_logs() -> None:
    """Send the engine's logging to dbt's (once per process)."""
    engine = logging.getLogger("consistent_stream")
    if not any(isinstance(h, _EngineLogToDbt) for h in engine.handlers):
        engine.addHandler(_EngineLogToDbt())
        # dbt owns the console: without this, a root handler that a library set up (seen in
        # `make demo-cluster`) printed every engine line a second time, unformatted
        engine.propagate = False
        if engine.level == logging.NOTSET:
            engine.setLevel(logging.INFO)

ADAPTER_NAME = "consistent_spark"
ADAPTER_MATERIALIZATION = "consistent_stream"


def _config_class() -> type:
    """``ConsistentSparkConfig``: dbt-spark's model configs plus a field (default None) for each
    key of the engine's model config (``consistent_stream.model_config``) that the model sets in
    ``config()`` and dbt-spark's class does not have already (``location_root``,
    ``partition_by``). Generated, so that a new key needs no edit here."""
    inherited = {f.name for f in fields(SparkConfig)}
    own = [(key.name, key.python_type(), field(default=None, metadata={"description": key.description}))
           for key in MODEL_CONFIG if key.from_config and key.name not in inherited]
    return make_dataclass("ConsistentSparkConfig", own, bases=(SparkConfig,), namespace={
        "__module__": __name__,
        "__doc__": "Model configs this adapter reads on top of dbt-spark's: the keys of "
                   "``consistent_stream.model_config.MODEL_CONFIG`` set in ``config()``.",
    })


ConsistentSparkConfig = _config_class()


class ConsistentSparkAdapter(SparkAdapter):
    ConnectionManager = ConsistentSparkConnectionManager
    AdapterSpecificConfigs = ConsistentSparkConfig
    # dbt-spark's, plus freshness from the sources' Delta logs (get_relation_last_modified)
    _capabilities = CapabilityDict({
        **SparkAdapter._capabilities,
        Capability.TableLastModifiedMetadata: CapabilitySupport(support=Support.Full),
    })

    @classmethod
    def get_adapter_run_info(cls, config: RelationConfig) -> AdapterTrackingRelationInfo:
        # dbt derives the module from the class name ("ConsistentSparkAdapter" ->
        # dbt.adapters.consistentspark), which does not exist: name it here.
        return AdapterTrackingRelationInfo(
            adapter_name=ADAPTER_NAME,
            base_adapter_version=import_module("dbt.adapters.__about__").version,
            adapter_version=import_module("dbt.adapters.consistent_spark.__version__").version,
            model_adapter_details=cls._get_adapter_specific_run_info(config),
        )

    def _spark_session(self) -> Any:
        """The SparkSession of this thread's dbt connection: built as dbt-spark builds it
        (``method: session``), or the process's Spark Connect session (``method: connect``, or a
        warm session's server: ``method: session`` with ``warm_session``)."""
        connection = self.connections.get_thread_connection()
        credentials = connection.credentials
        if credentials.over_connect:
            return self.connections.open(connection).handle.handle.session
        if credentials.method != SparkConnectionMethod.SESSION:
            raise DbtRuntimeError(
                f"consistent_stream models run in the dbt process, on a Spark session: set `method: session` "
                f"(a classic session) or `method: connect` (Spark Connect) in the profile (it is "
                f"`{credentials.method}`)"
            )
        connection = self.connections.open(connection)
        server_side_parameters = connection.handle.handle.server_side_parameters

        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is None:
            # Built as dbt-spark's session cursor builds it before each statement.
            builder = SparkSession.builder.enableHiveSupport()
            for parameter, value in server_side_parameters.items():
                builder = builder.config(parameter, value)
            return builder.getOrCreate()
        # An existing session keeps its static confs; apply the runtime ones, as the
        # builder would, without its warning about the static ones.
        for parameter, value in server_side_parameters.items():
            if spark.conf.isModifiable(parameter):
                spark.conf.set(parameter, value)
        return spark

    @available
    def consistent_stream_config_keys(self) -> List[str]:
        """The model config keys the ``consistent_stream`` materialization passes the engine
        (``config.get`` of each): ``consistent_stream.model_config.config_keys()``."""
        return config_keys()

    @available
    def consistent_stream_run(
        self,
        sql: str,
        sources: List[Dict[str, Any]],
        config: Dict[str, Any],
        schema: str,
        identifier: str,
        model_name: str,
        full_refresh: bool,
    ) -> Dict[str, Any]:
        """Run one ``consistent_stream`` model: bring its target up to date with its sources.

        ``sources`` holds one ``{"source_name", "name", "relation", "meta"}`` per dbt source
        the model reads; ``config`` the model's ``unique_key``, ``location_root``,
        ``checkpoint_location``, ``partition_by``, ``trigger``, ``recompute_threshold``,
        ``max_batch_rows``, ``state_file_rows``, ``local_engine``, the retention keys and the
        rest of the engine's config (``JobSpec.from_dbt``). Returns the engine's summary
        (``model``, ``batches``, ``changes_read``, ``rows_written``, ``seconds``,
        ``target_version``, ``target_path``, ...). Engine errors become ``DbtRuntimeError``
        with the engine's message.
        """
        _bridge_engine_logs()
        spark = self._spark_session()
        # dbt keeps the invocation's working directory: a relative --project-dir is relative to it.
        project_root = os.path.abspath(self.config.project_root)
        entry = self._drop_relation_of_another_materialization(spark, schema, identifier)
        try:
            from consistent_stream.job import run_model

            summary = run_model(
                spark,
                project_root=project_root,
                schema=schema,
                identifier=identifier,
                model_name=model_name,
                sql=sql,
                sources=[_plain(source) for source in sources],
                config=_plain(config),
                full_refresh=bool(full_refresh),
                catalog_entry=entry,
            )
        except DbtRuntimeError:
            raise
        except Exception as exc:
            raise _engine_error(f"consistent_stream model {model_name}", exc) from exc
        return dict(summary or {})

    def _drop_relation_of_another_materialization(self, spark: Any, schema: str, identifier: str) -> Any:
        """Drop ``schema.identifier`` when it is a view, or a table that is not a published
        consistent_stream target (an external Delta table whose location is a target the
        engine registered): the model's materialization was changed to consistent_stream.

        The engine registers the target under that name (``CREATE TABLE .. USING delta
        LOCATION``), which fails on a view, and must not drop a managed table dbt built with
        the engine's own statement. dbt-spark's ``table`` materialization likewise drops an
        existing view or non-Delta table before it builds.

        The entry is read from the metastore without opening the table
        (``consistent_stream.sink.catalog.catalog_entry``): an entry whose location is gone (a
        target deleted by hand, a bucket prefix cleaned up, a restored metastore) is left to
        the engine, which says what is missing and replaces the entry when it rebuilds.
        dbt's relation cache answers first (:meth:`_cached_entry`), the metastore when the
        cache does not hold the relation.

        Returns the entry as it stands afterwards (None: none, or dropped here), which the
        engine's publish uses instead of reading it again.
        """
        from consistent_stream.sink.catalog import catalog_entry, drop_entry

        entry = self._cached_entry(schema, identifier)
        if entry is None:
            try:
                entry = catalog_entry(spark, schema, identifier)
            except Exception as exc:
                raise _engine_error(f"reading the catalog entry {schema}.{identifier}", exc) from exc
        if entry is None or entry.is_target():
            return entry
        if entry.kind == "EXTERNAL" and entry.provider == "delta" and not entry.location_exists():
            return entry   # its location is gone: nothing to drop but the entry, which the engine replaces
        relation_type = "view" if entry.kind == "VIEW" else "table"
        logger.info(f"consistent_stream: dropping the {relation_type} {schema}.{identifier} (another "
                    f"materialization made it) before the model's target replaces it")
        if entry.kind == "VIEW" or entry.location_exists():
            self.drop_relation(self.Relation.create(schema=schema, identifier=identifier, type=relation_type))
        else:
            drop_entry(spark, schema, identifier)   # the entry alone: its location is gone
        return None

    def _cached_entry(self, schema: str, identifier: str) -> Any:
        """The catalog entry ``schema.identifier`` as dbt's relation cache holds it: dbt-spark
        fills the cache once per schema before the first model (``SHOW TABLE EXTENDED``) and
        keeps each table's ``information`` (type, provider, location) on its relation, so a
        model need not ask the metastore again. None when the cache does not hold the
        relation with that information (then the metastore is asked)."""
        from consistent_stream.sink.catalog import CatalogEntry

        if not self._schema_is_cached(None, schema):
            return None
        for relation in self.cache.get_relations(None, schema):
            information = getattr(relation, "information", None)
            if (relation.identifier or "").lower() == identifier.lower() and information:
                return CatalogEntry.from_information(information)
        return None

    @available
    def consistent_stream_publish_sources(self, sources: List[Dict[str, Any]]) -> List[int]:
        """Publish ``format: delta`` sources (``{"source_name", "name", "relation", "meta"}``)
        in Spark's catalog at their latest versions, for a dbt view that reads them. Returns
        the versions published."""
        spark = self._spark_session()
        project_root = os.path.abspath(self.config.project_root)
        try:
            from consistent_stream.job import publish_sources

            return publish_sources(spark, project_root, [_plain(source) for source in sources])
        except Exception as exc:
            raise _engine_error("publishing consistent_stream sources for a view", exc) from exc

    def _get_columns_for_catalog(self, relation: BaseRelation) -> Iterable[Dict[str, Any]]:
        """dbt-spark's catalog rows; a consistent_stream target's say so (``table_type``
        ``consistent_stream``) and carry its target version, cut, freshness, commit time
        and row count from the Delta log (``consistent_stream.observe.catalog_stats``)."""
        rows = list(super()._get_columns_for_catalog(relation))
        target = consistent_stream_target(getattr(relation, "information", "") or "")
        if target is None:
            return rows
        from consistent_stream.observe import catalog_stats

        try:
            stats = catalog_stats(target)
        except Exception as exc:  # the catalog still lists the relation
            logger.warning(f"consistent_stream: no statistics for {relation} ({target}): {exc}")
            stats = {}
        for row in rows:
            row["table_type"] = ADAPTER_MATERIALIZATION
            for key, (label, value, description) in stats.items():
                row.update({f"stats:{key}:label": label, f"stats:{key}:value": value,
                            f"stats:{key}:description": description, f"stats:{key}:include": True})
        return rows

    @available
    def consistent_stream_last_modified(self, sources: List[Dict[str, Any]], names: List[List[str]]) -> Any:
        """The result of ``get_relation_last_modified`` for metadata-based ``dbt source
        freshness``: one row ``(schema, identifier, last_modified, snapshotted_at)`` per
        source (``{"source_name", "name", "relation", "meta"}``, named ``[schema,
        identifier]`` in ``names``), ``last_modified`` its newest commit (UTC). A source with
        no ``meta.consistent_stream.location`` is looked up in the session's catalog."""
        import agate
        from dbt.adapters.contracts.connection import AdapterResponse
        from dbt_common.utils import AttrDict

        project_root = os.path.abspath(self.config.project_root)
        try:
            from consistent_stream.job import sources_last_modified
            from consistent_stream.sink.catalog import CatalogTables

            plain = [_plain(source) for source in sources]
            by_name = any(not (s.get("meta") or {}).get("location") for s in plain)
            catalog = CatalogTables(self._spark_session()) if by_name else None
            commits = sources_last_modified(project_root, plain, catalog)
        except Exception as exc:
            raise _engine_error("reading the sources' commit times for freshness", exc) from exc
        now = datetime.now(timezone.utc)
        rows = [[schema, identifier, datetime.fromtimestamp(ms / 1000, tz=timezone.utc), now]
                for (schema, identifier), ms in zip(names, commits)]
        table = agate.Table(rows, ["schema", "identifier", "last_modified", "snapshotted_at"],
                            [agate.Text(), agate.Text(), agate.DateTime(), agate.DateTime()])
        return AttrDict({"response": AdapterResponse(_message="OK"), "table": table})

    @available
    def consistent_stream_cut(self, models: List[str]) -> Dict[str, str]:
        """Temporary views of consistent_stream ``models`` at the newest versions that share
        one base cut (``consistent_stream.cut.register_cut_views``): model -> view name."""
        spark = self._spark_session()
        project_root = os.path.abspath(self.config.project_root)
        try:
            from consistent_stream.cut import register_cut_views

            return register_cut_views(spark, project_root, list(models))
        except Exception as exc:
            raise _engine_error(f"reading models {list(models)} at one cut", exc) from exc


_LOCATION = re.compile(r"^Location: (\S+)$", re.MULTILINE)


def consistent_stream_target(information: str) -> Optional[str]:
    """The target path of a relation published by consistent_stream, from its ``DESCRIBE``
    / ``SHOW TABLE EXTENDED`` text (its location is a Delta table the engine registered,
    ``consistent_stream.sink.catalog.is_target``), else None."""
    from consistent_stream.sink.catalog import is_target
    from consistent_stream.location import fs_path

    match = _LOCATION.search(information or "")
    if not match or not is_target(match.group(1)):
        return None
    return fs_path(match.group(1))


def _engine_error(what: str, exc: Exception) -> DbtRuntimeError:
    logger.debug(traceback.format_exc())
    return DbtRuntimeError(f"{what} failed: {type(exc).__name__}: {exc}")


def _plain(value: Any) -> Union[Dict[str, Any], List[Any], Any]:
    """A copy of a Jinja value as plain dicts and lists, for the engine."""
    if isinstance(value, dict):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value
