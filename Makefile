# The README's two commands. Nothing but Python 3.10+ is needed on the machine.
PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STAMP   = $(VENV)/.installed

.PHONY: test install clean demo

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(STAMP): $(PY) pyproject.toml
	$(PY) -m pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q -n 2 $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# Until the training job lands (issue 4), the demo is a tour of the core functions.
demo: $(STAMP)
	$(PY) examples/tour.py
