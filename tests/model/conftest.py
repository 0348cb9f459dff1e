"""The model tests: each needs the llama engine on the bundled SmolLM2 model (marker
``model``: skipped without it, failed under CI=true)."""

from __future__ import annotations

import subprocess
import time
import urllib.request
from collections.abc import Iterator

import pytest

from tests.support.harness import ROOT, free_port
from tests.support.needs import mark_folder, missing


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_folder(items, __file__, pytest.mark.model)


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    """``llama_cpp.server`` on the bundled model, one request at a time in the server
    (``--interrupt_requests False``: a new request waits instead of cutting the running one)."""
    from bridge.engines import llama
    from bridge.engines.llama._cpu import llama_cpp_server_command

    try:
        import llama_cpp.server  # noqa: F401
    except ImportError as e:
        missing(f"llama_cpp.server cannot be imported ({e}); the test extra installs llama-cpp-python[server]")
    port = free_port()
    proc = subprocess.Popen(
        [
            *llama_cpp_server_command(),
            "--model",
            llama.default_model_path(),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_threads",
            "1",
            "--interrupt_requests",
            "False",
            "--verbose",
            "False",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{url}/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None:
                said = proc.stderr.read().decode()[-2000:] if proc.stderr else ""
                raise AssertionError(f"llama_cpp.server exited: {said}")
            if time.monotonic() > deadline:
                raise AssertionError("llama_cpp.server did not answer /v1/models within 120 s")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
