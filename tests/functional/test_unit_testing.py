"""dbt's unit-testing classes on ``type: consistent_spark``: the three dbt-spark runs for its
``session`` method."""
from __future__ import annotations

import pytest
from dbt.tests.adapter.unit_testing.test_case_insensitivity import BaseUnitTestCaseInsensivity
from dbt.tests.adapter.unit_testing.test_invalid_input import BaseUnitTestInvalidInput
from dbt.tests.adapter.unit_testing.test_types import BaseUnitTestingTypes


class TestUnitTestingTypesConsistentSpark(BaseUnitTestingTypes):
    @pytest.fixture
    def data_types(self):
        # (Spark SQL literal, the same value in a unit test's YAML): exact numbers, time and
        # Spark's complex types, one dbt run and one dbt test each.
        return [
            ["cast(7 as bigint)", "7"],
            ["cast(12.34 as decimal(9, 2))", "12.34"],
            ["timestamp '2026-11-24 12:30:00'", "2026-11-24 12:30:00"],
            ["array(4, 5)", "'array(4, 5)'"],
            ["named_struct('k', 1)", "'named_struct(\"k\", 1)'"],
        ]


class TestUnitTestCaseInsensivityConsistentSpark(BaseUnitTestCaseInsensivity):
    pass


class TestUnitTestInvalidInputConsistentSpark(BaseUnitTestInvalidInput):
    pass
