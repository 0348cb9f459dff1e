# Set-up is idempotent and quiet after the first run: the venv and an install stamp are kept,
# and the portable llama.cpp wheel (packaging/llama_wheel.sh, ~8 minutes to compile the first
# time) is kept in a cache folder keyed by its version and build flags.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# llama-cpp-python's version is pinned in pyproject.toml; the flags make it portable: one CPU
# backend per microarchitecture, the best one chosen at run time (bridge/engines/llama/_cpu.py).
LLAMA_CPP_VERSION := $(shell sed -n 's/.*"llama-cpp-python==\([0-9.]*\)".*/\1/p' pyproject.toml | head -n 1)
LLAMA_CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON

.PHONY: setup check lint format test demo bench clean native dist system-deps

$(STAMP): pyproject.toml packaging/llama_wheel.sh
	@test -x $(BIN)/python || { echo "setup: creating $(VENV)"; $(PY) -m venv $(VENV); }
	@$(BIN)/pip install -q --upgrade pip
	@wheel=$$(LLAMA_CPP_VERSION=$(LLAMA_CPP_VERSION) LLAMA_CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" \
	  PYTHON=$(BIN)/python packaging/llama_wheel.sh) && \
	  echo "setup: installing $$(basename $$wheel)" && \
	  $(BIN)/pip install -q --force-reinstall --no-deps "$$wheel"
	@echo "setup: installing the Python dependencies into $(VENV) (about a minute the first time)"
	@$(BIN)/pip install -q -e '.[test,llama]'
	@touch $(STAMP)

setup: $(STAMP)

# The self-contained bridge for players' machines (packaging/, PyInstaller one-folder):
# dist/oam-bridge/oam-bridge. DIST_MODEL is the model it bundles and starts on: 1 the
# bundled SmolLM2 (94 MiB), 0 none (the game then passes --model), a catalog name
# (`oam models list`: pulled first when not downloaded, as `oam models pull NAME` does) or a
# FILE.gguf; the folder grows by the model file's size (qwen2.5-0.5b: ~470 MiB, a 3B model
# ~2 GiB). DIST_NATIVE=0 leaves out libOamNative (bundled when native/ has been built).
# PyInstaller is the `dist` extra, installed here only; an up-to-date build is not redone.
DIST_MODEL ?= 1
DIST_NATIVE ?= 1
DIST_STAMP := $(VENV)/.installed-dist

$(DIST_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[test,llama,dist]'
	touch $(DIST_STAMP)

dist: $(DIST_STAMP)
	$(BIN)/python packaging/build_dist.py --model "$(DIST_MODEL)" --native $(DIST_NATIVE)

native:
	@if ! test -f native/Package.swift; then echo "native: no package yet"; \
	elif command -v swift >/dev/null 2>&1 || test -x /opt/swift/usr/bin/swift; then \
	  PATH="$$PATH:/opt/swift/usr/bin" swift build -c release --package-path native && \
	  PATH="$$PATH:/opt/swift/usr/bin" swift test --package-path native -q; \
	else echo "native: no Swift toolchain; skipping the native library"; fi

system-deps:
	@packaging/system_deps.sh

# ruff (format and lint) and mypy (strict, files = bridge) read their settings from
# pyproject.toml. `make format` rewrites what `make lint` would refuse.
lint: setup
	$(BIN)/ruff format --check --quiet
	$(BIN)/ruff check --quiet
	$(BIN)/python -m mypy

format: setup
	$(BIN)/ruff format --quiet
	$(BIN)/ruff check --quiet --fix

# The quick loop (docs/contributing.md): lint, the unit and contract tests; no model, no
# native library, no subprocess-heavy suites. A few minutes.
check: lint
	$(BIN)/python -m pytest -q tests/unit tests/contract

# The whole suite, as CI runs it: the model, native, process and shipping tests, every client.
test: system-deps setup native lint
	$(BIN)/python -m pytest -q
	@if test -x engine_clients/run_tests.sh; then engine_clients/run_tests.sh; fi

demo: setup
	$(BIN)/python demo/scene.py

bench: setup
	$(BIN)/python bench/bench_protocol.py

clean:
	rm -rf $(VENV) native/.build dist/oam-bridge dist/.oam-bridge.inputs.json build/pyinstaller
