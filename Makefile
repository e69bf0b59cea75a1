# Two commands on a fresh machine (Python 3.11, make and bash; nothing else):
#   make book   -> .venv, pinned deps, every chapter executed, HTML in _build/html
#   make test   -> the whole test suite (unit, torchrun, full book build, browser)
SHELL := /bin/bash
# Python writes the bytecode of each module the first time a process imports it (the install
# compiles nothing: tools/uv_pip.py). Machines that set PYTHONDONTWRITEBYTECODE (this project's
# do) would otherwise compile torch again in every process that imports it.
unexport PYTHONDONTWRITEBYTECODE
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Where pip gets torch. Empty: pip's default index (this project's machines find a local CPU wheel
# there). On Linux, that index serves the CUDA build (several GB); without a GPU, run e.g.
#   make book TORCH_INDEX=https://download.pytorch.org/whl/cpu
TORCH_INDEX ?=
TORCH_PIN := $(shell grep -m1 '^torch==' requirements-reader.txt)
# pip installs uv, and uv the rest, with pip's configuration passed on (tools/uv_pip.py): a fresh
# .venv in about 11 s instead of pip's 130 s on 2 cores, bytecode written as modules are first imported
UV_PIN := uv==0.13.9

NOTEBOOKS_BRANCH := $(shell sed -n 's/^ *ppbook_notebooks_branch: *\([^ #]*\).*/\1/p' _config.yml)

.PHONY: book book-cached notebooks publish-notebooks pdf test test-fast test-scripts bench bench-schedules bench-plan bench-planner bench-compile record-own-schedule page-times gpu-check torch-versions browser-deps clean

$(STAMP): requirements.txt requirements-reader.txt pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info[:2] >= (3, 10) else "ppbook needs Python >= 3.10 (3.11 recommended), found " + sys.version.split()[0])'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet $(UV_PIN)
	$(if $(TORCH_INDEX),$(BIN)/python tools/uv_pip.py --quiet "$(TORCH_PIN)" --index-url $(TORCH_INDEX))
	$(BIN)/python tools/uv_pip.py --quiet -r requirements.txt -e .
	$(BIN)/python tools/uv_pip.py --quiet --no-deps torchtitan==0.3.0 spmd_types==0.2.3 megatron-core==0.16.1
	touch $(STAMP)

# Executes every chapter from an empty cache (jupyter-cache keys on code cells only, so a
# cached build would keep stale outputs after a change in scripts/ or src/), two pages at a time
# (JOBS=1: one), then renders: see tools/build_book.py.
JOBS ?= 2
book: $(STAMP)
	$(BIN)/python tools/build_book.py --jobs $(JOBS)
	$(BIN)/python tools/make_notebooks.py
	@echo "The book is in _build/html: open file://$(CURDIR)/_build/html/index.html"

# The readable notebooks of the last build (glued values filled in, an install cell first): the
# download buttons' copies in _build/html/_sources, and _build/notebooks for the notebooks branch.
notebooks: $(STAMP)
	$(BIN)/python tools/make_notebooks.py

# Commit _build/notebooks as the branch the Colab and Binder buttons open, and push it.
publish-notebooks: notebooks
	bash tools/publish_notebooks.sh $(NOTEBOOKS_BRANCH)

# Re-uses cached outputs of unchanged code cells (for authors iterating on prose).
book-cached: $(STAMP)
	$(BIN)/python tools/build_book.py --keep-cache --jobs $(JOBS)

# A PDF of the book, _build/pdf/book.pdf: the single-page HTML build (it reuses the execution
# cache, so after `make book` nothing executes again), printed by Debian's chromium.
pdf: $(STAMP) browser-deps
	$(BIN)/python tools/make_pdf.py

browser-deps:
	@bash tools/ensure_chromium.sh

# Three pytest workers (pytest-xdist): one takes the tests that read the built book first and
# builds it, the others run every other test meanwhile, a test file at a time (tests/conftest.py).
# On two cores one process left a core idle for half the session. TEST_WORKERS=0: one process.
TEST_WORKERS ?= 3
test: $(STAMP) browser-deps
	$(BIN)/python -m pytest $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --no-loadscope-reorder)

# The inner loop: pure and in-process tests only (no launched process, no book, no browser).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -m "not book and not torchrun"

# Every test that launches a script (torchrun or one process), without the book and the browser.
test-scripts: $(STAMP)
	$(BIN)/python -m pytest -m "torchrun and not book"

# Timing benchmarks (numbers for people, not pass/fail): GPipe busy fraction vs simulator,
# from-scratch GPipe vs ScheduleGPipe step time.
bench: $(STAMP)
	$(BIN)/python tools/bench_gpipe.py

# The seven schedules of chapter 5: measured step time vs the simulator's prediction (target 10%).
bench-schedules: $(STAMP)
	$(BIN)/python tools/bench_schedules.py

# The planner's time model (chapter 10): gloo's fitted latency + bytes / bandwidth in the simulator
# against measured step times at two model widths (target 10%).
bench-plan: $(STAMP)
	$(BIN)/python tools/bench_plan.py

# How long the planner takes to answer each of chapter 10's published requests (target: 10 s).
bench-planner: $(STAMP)
	$(BIN)/python tools/bench_planner.py

# Chapter 12's compile section with inductor, torch.compile's default backend (minutes of compiling
# on a CPU): each schedule's step eager and compiled per block, per stage and in place, every run
# checked against one process; the ratios are printed, never asserted. JSON in _build/bench/.
bench-compile: $(STAMP)
	$(BIN)/python tools/bench_compile.py

# Chapter 14's two launches, ten times each under real torchrun, every other time with both cores
# loaded (tools/load_cores.py): writes data/recorded/own_schedule.json, which the chapter asserts
# on (several minutes; commit the file).
record-own-schedule: $(STAMP)
	$(BIN)/python tools/record_own_schedule.py --runs 10

# Each page's execution seconds in the last `make book`, slowest first, against the budget of
# about a minute per page on 2 cores (exit 1 when a page is over it); JSON in _build/bench/.
page-times: $(STAMP)
	$(BIN)/python tools/page_times.py

# On a machine with GPUs: every script with --check on the GPUs present (one process per GPU) and a
# bf16 throughput benchmark of 06_train on one GPU; one JSON per run in data/gpu/, non-zero exit on
# any failure (and on a machine without a GPU).
# The whole GPU record (tools/gpu_check.py, about 7 minutes on one H100 or H200): no $(STAMP), so
# that a GPU machine without network runs it with its own python3 and torch; GPU_OUT names the
# folder (default data/gpu/<gpu>-<date>).
GPU_PYTHON = $(if $(wildcard $(BIN)/python),$(BIN)/python,python3)
GPU_OUT ?=
gpu-check:
	PYTHONPATH=src$${PYTHONPATH:+:$$PYTHONPATH} $(GPU_PYTHON) tools/gpu_check.py $(if $(GPU_OUT),--out $(GPU_OUT))

# Every companion script's check under another torch than the pinned one (the book claims 2.11 to
# 2.15): a scratch venv outside the repository (TORCH_VENV) with PyPI's torch==$(TORCH) (on Linux the
# CUDA build, about 3 GB, which runs on a CPU too) and the book's runtime libraries, then
# tools/torch_versions.py in it: tools/script_matrix.py's launches on NPROC CPU processes each
# (chapter 12's compile section with its own aot_eager backend; the tool's --inductor for inductor),
# data/versions/torch-$(TORCH).json and the table data/versions/README.md. Hours on 2 busy cores; not
# part of `make test`. Where a pip config caps torch, prefix PIP_CONFIG_FILE=/dev/null.
TORCH ?=
TORCH_VENV ?= $(HOME)/.cache/ppbook/torch-$(TORCH)
NPROC ?= 2
torch-versions:
	@test -n "$(TORCH)" || { echo "make torch-versions: name the version, e.g. make torch-versions TORCH=2.11.0" >&2; exit 2; }
	test -x $(TORCH_VENV)/bin/python || $(PYTHON) -m venv $(TORCH_VENV)
	$(TORCH_VENV)/bin/python -c 'import torch, sys; sys.exit(torch.__version__.split("+")[0] != "$(TORCH)")' 2>/dev/null \
	  || $(TORCH_VENV)/bin/python -m pip install --quiet "torch==$(TORCH)" -r <(grep -v '^torch==' requirements-reader.txt)
	PYTHONPATH=$(CURDIR)/src PPBOOK_VERSIONS_COMMAND="make torch-versions TORCH=$(TORCH) NPROC=$(NPROC)" \
	  $(TORCH_VENV)/bin/python tools/torch_versions.py --expect $(TORCH) --nproc $(NPROC)

clean:
	rm -rf _build
