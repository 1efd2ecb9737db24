# One entry point for setup, quickstart, tests, lint and benchmarks.
# `make quickstart` and `make test` create .venv on first use; later calls reuse it.
VENV ?= .venv
PY := $(VENV)/bin/python
# A CUDA machine keeps/gets PyPI's CUDA build; elsewhere pin the CPU-friendly 2.13.0.
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo "torch>=2.4,<2.15" || echo "torch==2.13.0")
PYTEST_ARGS ?=
# The suite runs on pytest-xdist workers, one per core up to 4 (each may start 2-process runs; more would
# only contend); each test file goes to one worker (its module fixtures are built once) and
# tests/scheduling.py starts the heaviest files first. TEST_WORKERS=0 runs it in this process.
TEST_WORKERS ?= $(shell python3 -c "import os; n = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count() or 1; print(min(4, n) if n > 1 else 0)")
# --instafail prints each failure's report when it happens (a killed or timed-out run still names it).
XDIST = -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder --instafail

.PHONY: setup quickstart test test-fast test-readme test-smoke test-gpu-suite lint format bench bench-memory clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

quickstart: setup
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-2} $(VENV)/bin/framer-ds train configs/quickstart.yaml --overwrite

test: setup
	$(PY) -m pytest $(XDIST) $(PYTEST_ARGS)

# Every README command block run as written in a scratch copy, the long trainings included (~10 min).
test-readme: setup
	$(PY) -m pytest tests/test_readme.py -m "readme_full or not readme_full" $(PYTEST_ARGS)

# `framer-ds smoke` of every shipped recipe, the slow ones included (tests/lab/test_smoke.py; ~1 h on 2 cores).
test-smoke: setup
	$(PY) -m pytest tests/lab/test_smoke.py -m "smoke_full or not smoke_full" $(PYTEST_ARGS)

# The GPU suite's real `run.sh --smoke` on this CPU, every step training at tiny sizes (~5 min on 2 cores);
# `make test` runs the same checks with the launches stubbed (tests/lab/test_gpu_suite.py).
test-gpu-suite: setup
	$(PY) -m pytest tests/lab/test_gpu_suite.py -m "gpu_suite_full or not gpu_suite_full" $(PYTEST_ARGS)

# The inner loop: everything but the multi-process launches (about a third of the suite's time).
test-fast: setup
	$(PY) -m pytest $(XDIST) -m "not distributed" $(PYTEST_ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/shellcheck -x slurm/*.sh scripts/train/*.sh scripts/lib/*.sh scripts/dev/*.sh benchmarks/gpu/*.sh .ci/run

format: setup
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

bench: setup
	$(PY) benchmarks/step_overhead.py --write docs/benchmarks.md
	$(PY) benchmarks/video_lora_step.py --write docs/benchmarks.md

# ~20 min on 2 CPU cores: every strategy x 3 models, 2 processes each
bench-memory: setup
	$(PY) benchmarks/strategy_memory.py --label "make bench-memory" --write docs/benchmarks.md

clean:
	rm -rf $(VENV) runs .pytest_cache .ruff_cache
