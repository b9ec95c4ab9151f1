"""The examples in the compiler's docstrings (``>>>``) run, so they stay true: the plan
package's passes document themselves by example (sqlglot's optimizer does the same)."""
from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import consistent_stream.plan as plan

MODULES = sorted(m.name for m in pkgutil.iter_modules(plan.__path__, plan.__name__ + "."))


@pytest.mark.parametrize("name", MODULES + ["consistent_stream.compare"])
def test_docstring_examples_hold(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
