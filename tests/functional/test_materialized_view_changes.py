"""dbt's materialized-view *changes* suite on a consistent_stream model: a changed model is
rebuilt (``apply``, dbt's "Applying REPLACE"), kept as it is with dbt's warning
(``continue``), or fails with dbt's message (``fail``); ``--full-refresh`` rebuilds whatever
the config says. Every change of a consistent_stream model's definition (SQL, sources,
unique_key, partition_by, constraints) is a replace: the checkpoint's state follows from the
old definition, so there is no change that can be applied with an ALTER, and dbt's ALTER
tests are skipped (as its suite says to, for an adapter without such changes)."""
from __future__ import annotations

import pytest
from dbt.tests.adapter.materialized_view.changes import (
    MaterializedViewChanges,
    MaterializedViewChangesApplyMixin,
    MaterializedViewChangesContinueMixin,
    MaterializedViewChangesFailMixin,
)
from dbt.tests.util import get_model_file, run_dbt, set_model_file

from .consistent_stream_mv import (
    MY_MATERIALIZED_VIEW,
    SOURCE_ROWS,
    SOURCES_YML,
    relation_rows,
    relation_type,
    write_source,
)

SEED_ROWS = sorted(zip(SOURCE_ROWS["id"], SOURCE_ROWS["value"]))
NO_ALTER = "every change of a consistent_stream model's definition rebuilds it (REPLACE); none is an ALTER"


class ConsistentStreamChanges(MaterializedViewChanges):
    """dbt's changes suite with the seed as a Delta source (see consistent_stream_mv); the
    replace is a change of the model's SQL (a filter)."""

    @pytest.fixture(scope="class", autouse=True)
    def seeds(self):
        return {}

    @pytest.fixture(scope="class", autouse=True)
    def models(self):
        yield {"sources.yml": SOURCES_YML, "my_materialized_view.sql": MY_MATERIALIZED_VIEW}

    @pytest.fixture(scope="function", autouse=True)
    def setup(self, project, my_materialized_view):
        write_source(project)
        run_dbt(["run", "--models", my_materialized_view.identifier, "--full-refresh"])
        initial = get_model_file(project, my_materialized_view)
        yield
        set_model_file(project, my_materialized_view, initial)
        project.run_sql(f"drop schema if exists {project.test_schema} cascade")

    @staticmethod
    def check_start_state(project, materialized_view):
        assert relation_type(materialized_view) == "materialized_view"
        assert relation_rows(materialized_view) == SEED_ROWS

    @staticmethod
    def check_state_alter_change_is_applied(project, materialized_view):
        """There is no ALTER change (``change_config_via_alter`` changes nothing): nothing to check."""

    @staticmethod
    def change_config_via_replace(project, materialized_view):
        model = get_model_file(project, materialized_view)
        set_model_file(project, materialized_view, model.rstrip() + " where value > 100\n")

    @staticmethod
    def check_state_replace_change_is_applied(project, materialized_view):
        assert relation_rows(materialized_view) == [row for row in SEED_ROWS if row[1] > 100]

    @staticmethod
    def query_relation_type(project, relation):
        return relation_type(relation)


class TestConsistentStreamChangesApply(ConsistentStreamChanges, MaterializedViewChangesApplyMixin):
    @pytest.mark.skip(reason=NO_ALTER)
    def test_change_is_applied_via_alter(self, project, my_materialized_view):
        pass


class TestConsistentStreamChangesContinue(ConsistentStreamChanges, MaterializedViewChangesContinueMixin):
    @pytest.mark.skip(reason=NO_ALTER)
    def test_change_is_not_applied_via_alter(self, project, my_materialized_view):
        pass


class TestConsistentStreamChangesFail(ConsistentStreamChanges, MaterializedViewChangesFailMixin):
    @pytest.mark.skip(reason=NO_ALTER)
    def test_change_is_not_applied_via_alter(self, project, my_materialized_view):
        pass
