# moe-offload-bench. Two commands do everything on a fresh clone (Python 3.11, make, PyPI):
#   make reproduce-table1    # MoE-Infinity Table 1 setting, every system, simulated, offline
#   make test                # the test suite
# Each creates .venv when it is missing.

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
MOEBENCH := $(VENV)/bin/moebench
STAMP := $(VENV)/.installed

.PHONY: reproduce-table1 test lint bench-sim clean-results

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev]'
	touch $(STAMP)

# ROUTING=<trace v1 file> replays an imported or recorded trace instead of synthetic routing.
reproduce-table1: $(STAMP)
	rm -rf results/table1
	$(MOEBENCH) -m experiment=table1 'system=glob(*)' $(if $(ROUTING),routing=$(abspath $(ROUTING)))
	$(MOEBENCH) table1 results/table1

test: $(STAMP)
	$(PY) -m pytest

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench-sim: $(STAMP)
	$(MOEBENCH) bench-sim

clean-results:
	find results -mindepth 1 -not -name README.md -exec rm -rf {} +
