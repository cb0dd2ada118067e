# Each user-facing target does its own setup; `make setup` is idempotent and quick when done.
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.setup-done

.PHONY: setup test demo bench bench-models bench-numerics bench-dataset bench-search fuzz clean

setup: $(STAMP)

$(STAMP): pyproject.toml Makefile
	@command -v mlir-opt-22 >/dev/null 2>&1 || [ -x /usr/lib/llvm-22/bin/mlir-opt ] || \
	  { [ "$$(id -u)" = 0 ] && { apt-get install -y --no-install-recommends mlir-22-tools llvm-22 >/dev/null 2>&1 || \
	      { apt-get update -qq && apt-get install -y --no-install-recommends mlir-22-tools llvm-22 >/dev/null; }; } \
	    || echo "note: mlir-22-tools not installed (needs root); the MLIR path will say so"; }
	[ -x $(PY) ] || python3 -m venv $(VENV)
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e ".[dev]"
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q -n 2 --dist worksteal --durations=60 tests

demo: setup
	$(PY) -m scanweaver_tvm.demo

bench: setup
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) -m bench.scan

bench-models: setup
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) -m bench.models

bench-numerics: setup
	$(PY) -m pip install -q -e ".[bench]"
	$(PY) -m bench.numerics

bench-dataset: setup   # resumable: each run adds rounds until every task has its records
	$(PY) -m bench.tuning_dataset --init
	$(PY) -m bench.tuning_dataset --worker 0/2 --minutes 120 & $(PY) -m bench.tuning_dataset --worker 1/2 --minutes 120; wait
	$(PY) -m tir_schedules.world_model.pretrain

bench-search: setup    # resumable: runs already in bench/data/search_eval are kept
	$(PY) -m bench.search_eval --ranking
	$(PY) -m bench.search_eval --search --worker 0/2 & $(PY) -m bench.search_eval --search --worker 1/2; wait
	$(PY) -m bench.search_eval --retime --report

fuzz: setup
	$(PY) -m bench.fuzz --count 1000 --seed 0 --out bench/out/fuzz

clean:
	rm -rf $(VENV) build *.egg-info
