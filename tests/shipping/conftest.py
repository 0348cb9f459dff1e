"""The shipping tests (marker ``shipping``): the frozen build, its CPU variants under qemu,
and the build in chroots of other Linux systems. Linux only."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.dist import EXE
from tests.support.harness import ROOT
from tests.support.needs import CI, mark_folder


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    mark_folder(items, __file__, pytest.mark.shipping)
    linux_only = pytest.mark.skipif(sys.platform != "linux", reason="the builds under test are Linux's")
    mark_folder(items, __file__, linux_only)


@pytest.fixture(scope="session")
def dist_exe() -> Path:
    """The built executable, (re)built by ``make dist`` when missing or stale. OAM_SKIP_DIST=1
    skips the tests that need it, except under CI=true."""
    if os.environ.get("OAM_SKIP_DIST") == "1" and not CI:
        pytest.skip("OAM_SKIP_DIST=1")
    done = subprocess.run(["make", "-s", "dist"], cwd=ROOT, capture_output=True, text=True, timeout=1200)
    if done.returncode != 0:
        if importlib.util.find_spec("PyInstaller") is None and not CI:  # e.g. no network for pip
            pytest.skip(f"PyInstaller could not be installed: {done.stderr[-500:]}")
        pytest.fail(f"make dist failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    assert EXE.is_file() and os.access(EXE, os.X_OK)
    return EXE
