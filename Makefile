# make test: the test suite; make demo: the example project end to end on TPC-H SF 0.1.
# Both set up .venv at the repository root first (re-installed when setup.py changes).

PYTHON := .venv/bin/python
STAMP := .venv/installed.stamp

.PHONY: .venv test demo

.venv: $(STAMP)

$(STAMP): setup.py
	test -x $(PYTHON) || python3 -m venv .venv
	$(PYTHON) -m pip install -e '.[test]'
	touch $@

test: .venv
	$(PYTHON) -m pytest -q tests

demo: .venv
	scripts/demo.sh
