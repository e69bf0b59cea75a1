# Two commands on a fresh machine (Python 3.11, make and bash; nothing else):
#   make book   -> .venv, pinned deps, every chapter executed, HTML in _build/html
#   make test   -> the whole test suite (unit, torchrun, full book build, browser)
SHELL := /bin/bash
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: book book-cached test test-fast bench bench-schedules gpu-check browser-deps clean

$(STAMP): requirements.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 10) else "ppbook needs Python >= 3.10 (3.11 recommended), found " + sys.version.split()[0])'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.txt -e .
	touch $(STAMP)

# Executes every chapter from an empty cache: jupyter-cache keys on code cells only, so a
# cached build would keep stale outputs after a change in scripts/ or src/.
book: $(STAMP)
	rm -rf _build/.jupyter_cache _build/html _build/jupyter_execute
	$(BIN)/jupyter-book build . --all -W -n --keep-going
	$(BIN)/python tools/make_notebooks.py
	@echo "The book is in _build/html: open file://$(CURDIR)/_build/html/index.html"

# Re-uses cached outputs of unchanged code cells (for authors iterating on prose).
book-cached: $(STAMP)
	$(BIN)/jupyter-book build . --all -W -n --keep-going

browser-deps:
	@bash tools/ensure_chromium.sh

test: $(STAMP) browser-deps
	$(BIN)/python -m pytest

# Everything but the full book build and the browser test.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not book"

# Timing benchmarks (numbers for people, not pass/fail): GPipe busy fraction vs simulator,
# from-scratch GPipe vs ScheduleGPipe step time.
bench: $(STAMP)
	$(BIN)/python tools/bench_gpipe.py

# The seven schedules of chapter 5: measured step time vs the simulator's prediction (target 10%).
bench-schedules: $(STAMP)
	$(BIN)/python tools/bench_schedules.py

# On a machine with GPUs: every script with --check on the GPUs present (one process per GPU) and a
# bf16 throughput benchmark of 06_train on one GPU; one JSON per run in data/gpu/, non-zero exit on
# any failure (and on a machine without a GPU).
gpu-check: $(STAMP)
	$(BIN)/python tools/gpu_check.py

clean:
	rm -rf _build
