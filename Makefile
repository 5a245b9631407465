# The README's two commands. Nothing but Python 3.10+ is needed on the machine.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
CORE    = $(VENV)/.installed-core
TEST    = $(VENV)/.installed-test

# The demo: the tiny RoVE GPT on the embedded stdlib corpus, then the quick evaluation suite
# (runs/demo/eval/report.md and plots), sized to finish (install included) in about 10
# minutes on 2 CPU cores. Rerunning resumes from runs/demo.
DEMO_ARGS = --config configs/tiny.py --workdir runs/demo --config.steps=100 \
            --config.optim.warmup_steps=20 --config.eval_every=50 --config.checkpoint_every=50

# The paper's comparison at small scale (about 90 minutes on 2 CPU cores): RoVE and RoPE x 2
# seeds and NoPE x 1, then the full evaluation suite; writes results/. Reruns resume.
REPRODUCE_ARGS ?=

.PHONY: test demo reproduce install clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(CORE): $(PY) pyproject.toml
	$(PY) -m pip install -q -e .
	touch $(CORE)

$(TEST): $(PY) pyproject.toml
	$(PY) -m pip install -q -e '.[test]'
	touch $(TEST) $(CORE)

install: $(TEST)

test: $(TEST)
	$(PY) -m pytest -q -n 2 $(PYTEST_ARGS)

demo: $(CORE)
	$(PY) train.py $(DEMO_ARGS)
	$(PY) -m eval --workdir runs/demo --suite quick

reproduce: $(CORE)
	$(PY) reproduce.py $(REPRODUCE_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
