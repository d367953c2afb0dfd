# `make run`: set up (first time) and run the default experiment on the simulator.
# `make test`: set up (first time) and run the test suite.
PYTHON ?= python3.11
VENV := .venv
STAMP := $(VENV)/.installed

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e ".[test,ray]"
	touch $(STAMP)

.PHONY: run test setup
setup: $(STAMP)

run: $(STAMP)
	$(VENV)/bin/python run.py

test: $(STAMP)
	$(VENV)/bin/python -m pytest -q
