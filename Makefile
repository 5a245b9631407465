# The README's two commands. Nothing but Python 3.11+ is needed on the machine (jax 0.7 and
# newer need 3.11). PYTHON: the interpreter that creates .venv; by default python3 when it is
# 3.11 or newer, else the newest python3.1x on PATH that is.
# TOO_OLD exits 0 on 3.11+; otherwise it says why (the first recipe, before anything is
# installed) and exits 1.
TOO_OLD = import sys; sys.exit(None if sys.version_info >= (3, 11) else "error: rove-jax needs \
  Python 3.11 or newer (jax 0.7 and newer do); $(PYTHON) is " + sys.version.split()[0] + ". \
  Install one (e.g. apt install python3.12-venv, pyenv install 3.12, uv python install 3.12) \
  and run make with PYTHON=python3.12")
ifndef PYTHON
PYTHON := $(firstword $(foreach p,python3 python3.14 python3.13 python3.12 python3.11,$(if \
  $(shell $(p) -c '$(TOO_OLD)' 2>/dev/null && echo yes),$(p))) python3)
endif
VENV   ?= .venv
PY      = $(VENV)/bin/python
EVAL    = $(VENV)/bin/rove-eval
CORE    = $(VENV)/.installed-core
TEST    = $(VENV)/.installed-test

# The demo: a RoVE GPT and its RoPE twin (configs/demo.py, 0.6M parameters, 64-token context)
# trained on the embedded stdlib corpus, then perplexity from 0.5x to 16x the training length
# without YaRN, with YaRN at L / 64 and with one fixed YaRN factor, side by side
# (runs/demo/eval/report.md and perplexity_vs_length.png); sized to finish, install included,
# within 10 minutes on 2 CPU cores. Rerunning resumes from runs/demo.
DEMO_ARGS = --config configs/demo.py
DEMO_EVAL = --suite quick --tasks ppl --yarn all --lengths 32,64,128,256,512,1024
# Then the mechanism: 2 seed pairs of 2-layer models trained for 300 steps to retrieve the token
# k = 1..4 places after a marker (the packaged recall_offset config), a task whose answer is
# fixed by relative position alone; scored at 1x and 4x the training length with and without
# YaRN on the same 100 test samples (runs/demo/offset/eval/report.md).
OFFSET = --config recall_offset --workdir runs/demo/offset
OFFSET_EVAL = --tasks recall --recall-lengths 32,128 --recall-samples 100 --yarn both \
	--out runs/demo/offset/eval
OFFSET_OTHERS = runs/demo/offset/rope-s0 runs/demo/offset/rove-s1 runs/demo/offset/rope-s1

# The paper's comparison at small scale (about 2.5 hours on 2 CPU cores): a learning-rate
# sweep for RoVE and RoPE (REPRODUCE_ARGS=--reuse-sweep takes results/lr_sweep.json instead),
# then both at their own rate on 8 seed pairs and NoPE on 3, the full evaluation suite on 3
# seeds and perplexity on the rest, the training-length check, and the retrieval studies
# (associative recall and two position-dependent tasks); writes results/. Reruns resume.
REPRODUCE_ARGS ?=
# The second pre-registered study (study/preregistration_long.md, issue 49): RoVE and RoPE at
# 2,000 steps, a 3-rate sweep at that horizon, then 10 fresh seed pairs; writes results/long/.
# Runs at the lowest priority (nice 19) and resumes where it stopped; about 4 hours on 2 idle
# cores, longer beside other work. Progress: `$(PY) -m study.long_study --status`.
LONG_ARGS ?=

# The GPU tests, on a machine with a CUDA GPU: every test marked gpu, then the fused GPU kernel's
# numerics compiled on the GPU (FUSED_GPU_COMPILED=1), then the fused loss's (compiled wherever
# a GPU is the target), within about 4 minutes on one H200. They run in the Python whose jax
# has CUDA (GPU_PYTHON; bench/README.md says what it needs), not in .venv, which holds the CPU
# build.
GPU_PYTHON ?= python3
GPU_PYTEST = ROVE_JAX_TEST_GCS=off $(GPU_PYTHON) -m pytest -q -p no:cacheprovider
GPU_READY = import jax, sys; gpus = [d for d in jax.devices() if d.platform == "gpu"]; \
  sys.exit(None if gpus else "make test-gpu needs a CUDA GPU visible to jax " + jax.__version__ \
  + " in GPU_PYTHON; it sees " + str(jax.devices()))

.PHONY: test lint format test-gpu demo reproduce reproduce-long install clean

$(PY):
	@$(PYTHON) -c '$(TOO_OLD)'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# pip byte-compiles what it installs (no --no-compile): where PYTHONDONTWRITEBYTECODE is set, as
# on CI machines, nothing else would, and every process would compile jax from source again.
$(CORE): $(PY) pyproject.toml
	$(PY) -m pip install -q -e '.[all]'
	touch $(CORE)

$(TEST): $(PY) pyproject.toml
	$(PY) -m pip install -q -e '.[test]'
	touch $(TEST) $(CORE)

install: $(TEST)

# The linter and the formatter's check first (seconds), then the tests. `make format` formats
# the tree in place (ruff format, [tool.ruff.format] in pyproject.toml) and sorts the imports.
lint: $(TEST)
	$(PY) -m ruff check .
	$(PY) -m ruff format --check .

format: $(TEST)
	$(PY) -m ruff check --select I --fix -q .
	$(PY) -m ruff format .

# Three workers on two cores (the subprocess tests wait on their children); worksteal hands a
# worker that ran dry tests queued on another, which evens out the minute-long end-to-end tests.
test: lint
	$(PY) -m pytest -q -n 3 --dist worksteal --durations=15 $(PYTEST_ARGS)

test-gpu:
	@$(GPU_PYTHON) -c '$(GPU_READY)'
	$(GPU_PYTEST) -m gpu tests/core
	FUSED_GPU_COMPILED=1 $(GPU_PYTEST) tests/core/test_kernels_fused_gpu.py
	$(GPU_PYTEST) tests/core/test_linear_ce.py

demo: $(CORE)
	$(PY) train.py $(DEMO_ARGS) --workdir runs/demo/rove --config.model.pos_encoding=rove
	$(PY) train.py $(DEMO_ARGS) --workdir runs/demo/rope --config.model.pos_encoding=rope
	$(EVAL) --workdir runs/demo/rove --compare runs/demo/rope $(DEMO_EVAL) --out runs/demo/eval
	$(PY) train.py $(OFFSET)/rove-s0 --config.model.pos_encoding=rove --config.seed=0
	$(PY) train.py $(OFFSET)/rope-s0 --config.model.pos_encoding=rope --config.seed=0
	$(PY) train.py $(OFFSET)/rove-s1 --config.model.pos_encoding=rove --config.seed=1
	$(PY) train.py $(OFFSET)/rope-s1 --config.model.pos_encoding=rope --config.seed=1
	$(EVAL) --workdir runs/demo/offset/rove-s0 --compare $(OFFSET_OTHERS) $(OFFSET_EVAL)
	@echo "next: read runs/demo/eval/report.md; make reproduce runs the study (docs/results.md)"

reproduce: $(CORE)
	$(PY) reproduce.py $(REPRODUCE_ARGS)

reproduce-long: $(CORE)
	nice -n 19 $(PY) -m study.long_study $(LONG_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
