"""dbt's basic materialized-view suite on a consistent_stream model (see consistent_stream_mv):
create, create again, full refresh, replace a table or view and be replaced by one, and
change only on refresh; plus updates and deletes in the source, taken in incrementally."""
from __future__ import annotations

from dbt.tests.adapter.materialized_view.basic import MaterializedViewBasic
from dbt.tests.util import run_dbt
from deltalake import DeltaTable

from .consistent_stream_mv import (
    SOURCE_ROWS,
    ConsistentStreamMaterializedView,
    published_batch,
    relation_rows,
    source_path,
    source_rows,
)

SEED_ROWS = sorted(zip(SOURCE_ROWS["id"], SOURCE_ROWS["value"]))


class TestConsistentStreamMaterializedViewBasic(ConsistentStreamMaterializedView, MaterializedViewBasic):

    def test_materialized_view_full_refresh(self, project, my_materialized_view):
        # dbt's version looks for its own materialization's log line ("Applying REPLACE to:");
        # a consistent_stream full refresh starts a new query whose first batch rebuilds the
        # target from the source's snapshot.
        before = published_batch(my_materialized_view)
        run_dbt(["run", "--models", my_materialized_view.identifier, "--full-refresh"])
        after = published_batch(my_materialized_view)
        assert self.query_relation_type(project, my_materialized_view) == "materialized_view"
        assert (after.app_id != before.app_id, after.batch_id, after.strategy) == (True, 0, "recompute")
        assert relation_rows(my_materialized_view) == SEED_ROWS

    def test_materialized_view_takes_in_updates_and_deletes_incrementally_on_refresh(
        self, project, my_materialized_view, my_seed
    ):
        before = published_batch(my_materialized_view)
        source = DeltaTable(source_path(project))
        source.update(updates={"value": "250"}, predicate="id = 2")
        source.delete("id = 1")
        self.insert_record(project, my_seed, (5, 500))
        assert relation_rows(my_materialized_view) == SEED_ROWS

        self.refresh_materialized_view(project, my_materialized_view)

        after = published_batch(my_materialized_view)
        assert source_rows(project) == [(2, 250), (3, 300), (5, 500)]
        assert relation_rows(my_materialized_view) == source_rows(project)
        # the same query, one batch on, which read the three commits as changes
        assert (after.app_id, after.batch_id, after.strategy) == (before.app_id, before.batch_id + 1, "incremental")
        assert list(after.cut.values()) == [DeltaTable(source_path(project)).version()]
