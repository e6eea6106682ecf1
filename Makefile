# The two commands the README opens with. Both create or refresh .venv first; a second run
# reinstalls nothing unless pyproject.toml changed.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Open MPI refuses to run as root unless told; as our launch helpers do, say so only as root.
ifeq ($(shell id -u),0)
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
endif
export PATH := $(CURDIR)/$(BIN):$(PATH)
# Python caches each module's bytecode the first time any process imports it, torch's and ours:
# where PYTHONDONTWRITEBYTECODE=1 (here, CI) nothing was cached, and every rank, engine and kernel
# compiled from source what it imported (torch's alone: a `downpour train` rank 13.8 s of CPU
# instead of 4.8, a fresh-clone make test at half speed). A cached file whose source changed since
# is not used (Python compares the source's mtime and size).
unexport PYTHONDONTWRITEBYTECODE

.PHONY: study studies test test-fast test-durations lab docs gpu-check venv lint figures clean

study: $(STAMP)  ## the main job: notebook 02 headless -> results/<host>/scaling/{runs.csv,figures/*.png}
	$(BIN)/downpour notebook run notebooks/02_scaling_study.ipynb

# Every study, each by its notebook, into results/<host>/{scaling,staleness,gossip,accuracy,model,lm}/;
# each resumes (runs already in this machine's CSVs at this commit are skipped) and redraws its
# figures. Notebook 05 runs on the multi-node Slurm sandbox as root, on local ranks otherwise;
# notebook 06 calibrates the performance model here and checks it against the references;
# notebook 07 is notebook 05's study on the language model, to a validation loss.
studies: study   ## every study: notebooks 02 to 07 headless
	$(BIN)/downpour notebook run notebooks/03_downpour_staleness.ipynb
	$(BIN)/downpour notebook run notebooks/04_gossip_consensus.ipynb
	$(BIN)/downpour notebook run notebooks/05_time_to_accuracy.ipynb
	$(BIN)/downpour notebook run notebooks/06_at_scale.ipynb
	$(BIN)/downpour notebook run notebooks/07_lm_time_to_loss.ipynb

# On TEST_WORKERS pytest-xdist workers (0: all in this process): the Slurm tests, the notebooks and
# each shared setup keep to one worker apiece (tests/conftest.py), the other tests share the rest.
# Then, in one process with nothing beside them, the tests marked `alone`: measurements that hold
# only on a quiet machine (model validate's 9 ms DiLoCo steps came out 43% off beside the workers).
# Pytest's exit 5 (nothing selected: a PYTEST_ARGS tier with no `alone` test) passes in one part.
# Three workers on 2 cores: with four the cores stay busier while the tests that wait (a silent
# rank's timeout, Slurm's time limit) sleep (2.2 idle CPU-minutes of the workers' part -> 0.35, 24.4
# minutes in all) in one of three fresh-clone runs; of the other two, one lost JupyterLab's server
# connection in the browser test, the other took 28.2 minutes and lost a 10 s silent-rank test to the
# load (a rank still starting 10 s after the others reached the first collective). On the slower
# machine below four gained nothing: 30.2 minutes at 7793957 (workers 28.7, both cores busy 97-100%
# from the first minute), where three took 29.8 at 0e7c88f (workers 27.6); the cores were
# already full, and more tests at once only wait on each other longer. A fourth worker that took only
# the tests that mostly wait (the silent-rank and cluster-timeout groups; 3a7f2e2, reverted) kept the
# cores 98-100% busy from the first minute, and the workers' part took 1557 s against 1442-1571 on three.
# A fresh clone's make test here, three runs of nearly one tree: 23.4, 25.6 and 26.9 minutes (the venv
# with uv and the bytecode under a minute, workers 21.4 to 24.8, alone 1.3-1.5); in one process 45 (earlier).
# On a slower machine of the same kind, 29.2, 30.2 and 32.8 minutes (workers 27.0, 28.2 and 30.4), and
# 31.3 (workers 29.0) with the study test on one cluster; CPU-bound there (both cores 99-100% busy);
# 29.5 at 640a65e (workers 27.9, alone 1.3), with the venv's bytecode left to Python.
TEST_WORKERS ?= 3
test: $(STAMP)   ## the whole suite: unit, multi-rank (mpiexec), cluster, notebooks, real Slurm (as root)
ifeq ($(TEST_WORKERS),0)
	$(BIN)/python -m pytest $(PYTEST_ARGS)
else
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadgroup --alone=apart $(PYTEST_ARGS); \
	first=$$?; $(BIN)/python -m pytest --alone=only $(PYTEST_ARGS); second=$$?; \
	for s in $$first $$second; do [ $$s = 0 ] || [ $$s = 5 ] || exit $$s; done; \
	[ "$$first$$second" != 55 ]  # nothing selected in either part is a failure, as in pytest
endif

# The tier to run while working (tests/conftest.py tiers every test by what it starts; pyproject.toml
# lists the markers): one-process tests and the quick multi-rank ones, no cluster, notebook or Slurm.
# Another tier alone: PYTEST_ARGS='-m cluster' make test (or notebooks, slurm, "ranks and slow").
test-fast: $(STAMP)  ## the fast tier (unit + quick mpiexec tests): a few minutes
	$(BIN)/python -m pytest -m "(unit or ranks) and not slow" $(PYTEST_ARGS)

# What decides the fast tier: each test's seconds, measured here, into tests/durations.txt (tests
# over conftest's SLOW_S are `slow`). It measures every unit and ranks test but those slow by a mark
# in the code (while measuring, the file marks nothing): at a load of 15, 40 minutes or more; name
# files in PYTEST_ARGS to measure only those (the file keeps the other entries).
test-durations: $(STAMP)  ## measure the unit and ranks tests into tests/durations.txt
	$(BIN)/python -m pytest -m "(unit or ranks) and not slow" --record-durations tests/durations.txt $(PYTEST_ARGS)

# JupyterLab on notebooks/ with a kernel that is .venv's python (its kernelspec is written into
# .venv and put first on JUPYTER_PATH), so the notebooks import this downpour_lib and its mpiexec.
# LAB_ARGS go to `jupyter lab` (e.g. LAB_ARGS="--no-browser --port=8890").
lab: $(VENV)/.installed-notebooks  ## open the notebooks in JupyterLab on .venv's kernel
	$(BIN)/downpour lab notebooks $(LAB_ARGS)

$(VENV)/.installed-notebooks: $(STAMP)
	$(call INSTALL,-e '.[notebooks]')
	touch $@

# The guide (docs/*.md, Sphinx with MyST) into docs/_build/html, strict: a warning (a broken link,
# cross-reference, image or page, a docstring autodoc cannot read) fails the build. Its measured
# tables are made at build time from results/reference/ (docs/_ext/results.py).
DOCS_ARGS ?=
docs: $(VENV)/.installed-docs  ## build the guide in strict mode -> docs/_build/html/index.html
	$(BIN)/python -m sphinx -W --keep-going -n -q -b html docs docs/_build/html $(DOCS_ARGS)
	@echo "make docs: open docs/_build/html/index.html"

$(VENV)/.installed-docs: $(STAMP)
	$(call INSTALL,-e '.[docs]')
	touch $@

# On a CUDA machine: the gpu-marked tests, then `downpour bench gpu` (a table, and JSON under
# results/<host>/gpu/). Without CUDA it says so and exits 0.
gpu-check: $(STAMP)  ## the GPU tests and benchmarks (every algorithm on cuda, bf16/fp16, the data pipeline)
	@if $(BIN)/python -c "import sys, torch; sys.exit(not torch.cuda.is_available())"; then \
		$(BIN)/python -m pytest -m gpu tests/test_gpu.py $(PYTEST_ARGS) && $(BIN)/downpour bench gpu; \
	else \
		echo "make gpu-check: no CUDA device on $$(hostname) (torch $$($(BIN)/python -c 'import torch; print(torch.__version__)')): nothing to check here; run it on a GPU node"; \
	fi

figures: $(STAMP)  ## redraw every study's figures of this machine (results/<host>/*/figures/) from its CSVs
	$(BIN)/downpour plot

lint: $(STAMP)
	$(BIN)/ruff check downpour_lib tests

venv: $(STAMP)

# Installs with uv where it can (torch's CUDA wheels are ~4 GB unpacked: a fresh .venv took 135 s
# with pip here, 47 s with uv from its cache), with pip where uv cannot (uv reads no pip.conf: a
# cluster whose packages come only from a mirror pip is configured for). uv leaves the bytecode
# to Python (PYTHONDONTWRITEBYTECODE, above): compiling every package at install took 28 s of both
# cores here, and importing torch and torch._dynamo compiles 1,710 of the venv's 13,358 modules.
# The constraint files pip.conf names hold for uv too (here they keep torchvision on the release
# built for this torch: without them uv took 0.29.2+cu132 beside torch 2.14.1+cu130).
PIP_CONSTRAINTS = $(shell $(PYTHON) -m pip config list 2>/dev/null | sed -n "s/^global\.constraint='\(.*\)'$$/\1/p")
INSTALL = UV_CONSTRAINT="$(PIP_CONSTRAINTS)" $(BIN)/uv pip install --quiet --python $(BIN)/python $(1) \
	|| { echo "make: uv could not install $(1); pip instead"; $(BIN)/python -m pip install --quiet $(1); }

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip uv
	$(call INSTALL,-e '.[test]')
	touch $(STAMP)

clean:
	rm -rf $(VENV) .pytest_cache
