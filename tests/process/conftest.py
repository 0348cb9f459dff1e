"""Fixtures of the process tests (real subprocesses over real pipes)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.harness import Proc, bridge


@pytest.fixture
async def proc() -> AsyncIterator[Proc]:
    """The bridge subprocess on the scripted engine, not yet initialized."""
    async with bridge() as p:
        yield p
