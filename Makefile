# Quick start: `make demo` runs the end-to-end demo, `make test` runs lint and the tests.
# Both create .venv and install everything on first use (Python 3.10+ as python3).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# The LeRobot drop-in is also tested with the versions LeRobot 0.4-0.6 pin: PyAV 15 and numpy < 2.3. (They also
# pin torch < 2.11 / < 2.12, of which PyPI has only CUDA builds of about 3 GB; this environment keeps the CPU
# torch the main one uses.)
PINS := .venv-lerobot-pins
PINS_STAMP := $(PINS)/.installed
LEROBOT_PINS := "av>=15,<16" "numpy<2.3"

.PHONY: demo test test-fast check-aarch64 browser lint bench clean

# The viewer's browser test drives Debian's Chromium (Playwright cannot download its own browsers offline).
CHROMIUM ?= /usr/bin/chromium

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# The CPU build of torch; the loader's GPU path brings its own CUDA runtime through DALI.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[dev]'
	# SPDL ships no FFmpeg: it loads PyAV's, linked under the names it looks for
	$(BIN)/python -m mmdata.codecs.decoders.link_spdl
	touch $(STAMP)

$(PINS_STAMP): pyproject.toml
	$(PYTHON) -m venv $(PINS)
	$(PINS)/bin/python -m pip install -q --upgrade pip
	$(PINS)/bin/python -m pip install -q torch==2.13.0 $(LEROBOT_PINS)
	$(PINS)/bin/python -m pip install -q -e . pytest pytest-timeout $(LEROBOT_PINS)
	touch $(PINS_STAMP)

demo: $(STAMP)
	$(BIN)/mmdata demo

test: $(STAMP) $(PINS_STAMP) check-aarch64 browser
	$(BIN)/ruff check mmdata tests benchmarks
	$(BIN)/ruff format --check mmdata tests benchmarks
	$(BIN)/mypy
	$(BIN)/python -m pytest -q -n 2 --dist loadfile
	$(PINS)/bin/python -m pytest -q -p no:cacheprovider tests/test_lerobot_loader.py tests/test_importers.py -k lerobot

browser:
	@test -x $(CHROMIUM) || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

# The inner loop: everything but the slow tests (subprocesses, servers, clusters, conversions: see pyproject.toml's
# markers), about a minute on a 2-core machine.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

# `pip install mmdata` must resolve on aarch64 Linux (Grace Hopper and other ARM GPU nodes) from wheels alone.
# uv resolves for the target platform, markers included (pip's --platform evaluates markers for this machine).
check-aarch64: $(STAMP)
	$(BIN)/uv pip compile pyproject.toml --python-platform aarch64-manylinux_2_28 --python-version 3.11 \
		--no-build --quiet --output-file /dev/null

bench: $(STAMP)
	$(BIN)/python benchmarks/convert_bench.py
	$(BIN)/python benchmarks/decode_bench.py
	$(BIN)/python benchmarks/pack_bench.py
	$(BIN)/python benchmarks/loader_bench.py
	$(BIN)/python benchmarks/training_batches_bench.py

clean:
	rm -rf $(VENV) $(PINS) .pytest_cache .ruff_cache .mypy_cache
