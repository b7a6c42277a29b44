# probing: every target sets itself up; `make test` works on a fresh machine.
PYTHON ?= python3
TORCH_VERSION ?= 2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.DEFAULT_GOAL := help
.PHONY: help install browser pythons old-glibc-root wheel unit test fuzz check-install lint format bench bench-scale soak demo docs screenshots clean

help: ## Show the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk 'BEGIN {FS = ":.*## "} {printf "  make %-14s %s\n", $$1, $$2}'

$(STAMP): pyproject.toml setup.py
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --disable-pip-version-check "setuptools>=64" wheel
	# Pinned first: an unpinned torch would pull the newest CUDA build (gigabytes).
	$(BIN)/pip install -q --disable-pip-version-check "torch==$(TORCH_VERSION)"
	$(BIN)/pip install -q --disable-pip-version-check ".[test,dev,torch,pyrasite,mcp,core,wheel]"
	touch $(STAMP)

install: $(STAMP) ## Create .venv with probing and its extras (test, dev, torch, pyrasite, mcp, core, wheel)
	@# Refresh probing itself from the working tree (fast: no dependency resolution). The
	@# in-tree build/ goes first: a module deleted from probing/ must not live on in it.
	rm -rf build probing.egg-info
	$(BIN)/pip install -q --disable-pip-version-check --no-deps --no-build-isolation .

lint: install ## ruff (lint and format check) and mypy --strict
	$(BIN)/ruff check probing tests benchmarks docs/examples setup.py
	$(BIN)/ruff format --check probing tests benchmarks docs/examples setup.py
	$(BIN)/mypy

format: install ## Format the code with ruff
	$(BIN)/ruff format probing tests benchmarks docs/examples setup.py
	$(BIN)/ruff check --fix probing tests benchmarks docs/examples setup.py

# A trace viewer that runs offline, for the test that loads `trace export`'s file in one
# (Perfetto's UI is served only from its site; chrome://tracing is gone from Chromium).
SPEEDSCOPE := $(VENV)/share/speedscope-1.25.0

$(SPEEDSCOPE)/index.html:
	rm -rf $(SPEEDSCOPE) && mkdir -p $(SPEEDSCOPE)
	cd $(SPEEDSCOPE) && npm pack --silent speedscope@1.25.0 > /dev/null \
		&& tar xzf speedscope-1.25.0.tgz --strip-components=3 package/dist/release && rm speedscope-1.25.0.tgz

browser: $(SPEEDSCOPE)/index.html ## Install Debian's chromium and tmux, which the tests of the HTML pages and of `top`'s screen drive (as root), and speedscope
	@{ command -v chromium && command -v tmux; } > /dev/null || { \
		if [ "$$(id -u)" = 0 ] && command -v apt-get > /dev/null; then \
			apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q chromium tmux; \
		else echo "make browser: install Debian's chromium and tmux packages (as root: apt-get install chromium tmux)" >&2; exit 1; fi; }

# CPython 3.14 and 3.15 for the tests' targets, from Debian's archive with their own glibc (they
# need a newer one than this Debian has): tools/pythons.sh says how. Kept in .pythons/, or in
# $$PROBING_PYTHONS_DIR (CI keeps it outside its clean clone); a second run does nothing.
pythons: ## Install CPython 3.14 and 3.15 into .pythons/ (or $PROBING_PYTHONS_DIR) for the tests' targets
	@tools/pythons.sh

unit: install ## The unit and protocol layers alone, in under a minute: the suite to run while coding
	$(BIN)/pytest -n 2 -m "not serial" tests/unit tests/protocol -q -p no:cacheprovider
	$(BIN)/pytest -m serial tests/unit tests/protocol -q -p no:cacheprovider

# Integration tests spend much of their time waiting on the processes they start, so the suite
# runs on more workers than this 2-core machine has cores (TEST_WORKERS=N to choose another
# count). A test file runs whole on one worker (--dist loadfile): the jobs a module starts once
# (the docs' demo job, torchrun jobs) are not started again on every worker.
# Tests marked `serial` (a step-time ratio, a stall bound, a flood, CPU hogs) cannot share the
# machine: they run after, alone. Both parts always run; either one failing fails `make test`.
# The wheel installed into a fresh venv per interpreter (marker `install`, three minutes of pip)
# is `make check-install`'s, which CI runs after `make test`.
TEST_WORKERS ?= 3

test: lint browser pythons old-glibc-root ## Lint, type-check, then the whole test suite (in parallel, then the serial tests alone)
	@status=0; \
	echo "$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m 'not serial and not install'"; \
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile -m "not serial and not install" || status=$$?; \
	echo "$(BIN)/pytest -m serial"; \
	$(BIN)/pytest -m serial || status=$$?; \
	exit $$status

fuzz: install ## The fuzz layer alone (tests/fuzz), FUZZ_SCALE times its examples; FUZZ_SEED=N draws other inputs
	PROBING_FUZZ_SCALE=$(or $(FUZZ_SCALE),1) $(if $(FUZZ_SEED),PROBING_FUZZ_SEED=$(FUZZ_SEED)) \
		$(BIN)/pytest tests/fuzz -p no:cacheprovider

check-install: install pythons ## Build the wheel; pip install it, wheels only, on every CPython 3.8-3.15 (a few minutes)
	$(BIN)/pytest -m install tests/integration/test_build.py

# Debian bullseye (glibc 2.31) for the test of the manylinux wheel: tools/old_glibc_root.sh says
# how. Kept in .old-glibc-root/, or in $$PROBING_OLD_GLIBC_ROOT (CI keeps it outside its clone).
old-glibc-root: ## Make the Debian bullseye root (glibc 2.31) the manylinux wheel's test installs into (as root; else the test skips)
	@[ "$$(id -u)" != 0 ] || tools/old_glibc_root.sh

wheel: install ## A manylinux_2_28 wheel in dist/: its native parts checked and the wheel tagged by auditwheel
	rm -rf build/wheel && mkdir -p dist
	$(BIN)/pip wheel -q --disable-pip-version-check --no-deps --no-build-isolation -w build/wheel .
	PATH="$(BIN):$$PATH" $(BIN)/auditwheel repair --plat manylinux_2_28_x86_64 -w dist build/wheel/probing-*.whl
	rm -rf build/wheel

bench: install ## Print the measurements of the closing notes (ratios against baselines)
	$(BIN)/python benchmarks/bench_core.py
	$(BIN)/python benchmarks/bench_attach.py
	$(BIN)/python benchmarks/bench_backtrace.py
	$(BIN)/python benchmarks/bench_outside.py
	$(BIN)/python benchmarks/bench_torch.py
	$(BIN)/python benchmarks/bench_memory.py
	$(BIN)/python benchmarks/bench_unharmed.py
	$(BIN)/python benchmarks/bench_ranks.py
	$(BIN)/python benchmarks/bench_collectives.py
	$(BIN)/python benchmarks/bench_stragglers.py
	$(BIN)/python benchmarks/bench_top.py
	$(BIN)/python benchmarks/bench_nodes.py
	$(BIN)/python benchmarks/bench_records.py
	$(BIN)/python benchmarks/bench_record_query.py
	$(BIN)/python benchmarks/bench_core_files.py
	$(BIN)/python benchmarks/bench_trace_export.py
	$(BIN)/python benchmarks/bench_flamegraph.py
	$(BIN)/python benchmarks/bench_report.py
	$(BIN)/python benchmarks/scale/run.py --ranks 1024 --nodes 16 --forms store

bench-scale: install ## The CLI on a job of real agents on simulated nodes, 16 to 1 024 ranks (root; docs/scale.md)
	$(BIN)/python benchmarks/scale/run.py --ranks 16,64,256,1024 --nodes 16

soak: install pythons ## Long: attach, eval, query, detach 200 times per interpreter and job kind (SOAK_CYCLES=N)
	$(BIN)/python benchmarks/soak.py --cycles $(or $(SOAK_CYCLES),200) --parallel 2

demo: install ## Start a small training job with the agent and run probing against it
	bash docs/examples/demo.sh

docs: install ## Regenerate docs/tables.md from the agent's own column documentation
	$(BIN)/python -m probing.schema.docgen > docs/tables.md

screenshots: install browser ## Render the pictures of docs/guide.md again (docs/images/*.png) with their tests
	PROBING_SCREENSHOTS=$(CURDIR)/docs/images $(BIN)/pytest -m pictures -p no:cacheprovider

clean: ## Remove the virtual environment and build leftovers
	rm -rf $(VENV) build dist *.egg-info .pytest_cache .mypy_cache .ruff_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
