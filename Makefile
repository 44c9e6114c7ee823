# Quick start: `make demo` runs the end-to-end demo, `make test` runs lint and the tests.
# Both create .venv and install everything on first use (Python 3.10+ as python3).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch; the loader's GPU path brings its own CUDA runtime through DALI.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/mmdata demo

test: $(STAMP)
	$(BIN)/ruff check mmdata tests benchmarks
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python benchmarks/convert_bench.py
	$(BIN)/python benchmarks/decode_bench.py
	$(BIN)/python benchmarks/pack_bench.py
	$(BIN)/python benchmarks/loader_bench.py
	$(BIN)/python benchmarks/training_batches_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
