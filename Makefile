# Set-up is idempotent and fast after the first run: the venv and an install stamp are
# kept, and pip's wheel cache keeps llama-cpp-python's ~7 minute source build to once.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: setup test demo bench clean native dist

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test,llama]'
	touch $(STAMP)

setup: $(STAMP)

# The self-contained bridge for players' machines (packaging/, PyInstaller one-folder):
# dist/oam-bridge/oam-bridge. DIST_MODEL=0 leaves the model out (the game then passes
# --model); DIST_NATIVE=0 leaves out libOamNative (bundled when native/ has been built).
# PyInstaller is the `dist` extra, installed here only; an up-to-date build is not redone.
DIST_MODEL ?= 1
DIST_NATIVE ?= 1
DIST_STAMP := $(VENV)/.installed-dist

$(DIST_STAMP): $(STAMP)
	$(BIN)/pip install -q -e '.[test,llama,dist]'
	touch $(DIST_STAMP)

dist: $(DIST_STAMP)
	$(BIN)/python packaging/build_dist.py --model $(DIST_MODEL) --native $(DIST_NATIVE)

native:
	@if ! test -f native/Package.swift; then echo "native: no package yet"; \
	elif command -v swift >/dev/null 2>&1 || test -x /opt/swift/usr/bin/swift; then \
	  PATH="$$PATH:/opt/swift/usr/bin" swift build -c release --package-path native && \
	  PATH="$$PATH:/opt/swift/usr/bin" swift test --package-path native -q; \
	else echo "native: no Swift toolchain; skipping the native library"; fi

# mypy reads its settings (strict, files = bridge) from pyproject.toml's [tool.mypy].
test: setup native
	$(BIN)/python -m mypy
	$(BIN)/python -m pytest -q
	@if test -x engine_clients/run_tests.sh; then engine_clients/run_tests.sh; fi

demo: setup
	$(BIN)/python demo/scene.py

bench: setup
	$(BIN)/python bench/bench_protocol.py

clean:
	rm -rf $(VENV) native/.build dist/oam-bridge dist/.oam-bridge.inputs.json build/pyinstaller
