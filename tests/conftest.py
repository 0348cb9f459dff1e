"""Fixtures every folder may use, and the rule behind the ``model`` and ``native`` markers
(tests/support/needs.py). The harness itself is tests/support/harness.py; each folder's
conftest.py marks its tests and holds the fixtures only its tests use."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

pytest.register_assert_rewrite("tests.support")  # the harness's asserts explain themselves too

from bridge import ScriptedEngine, Server  # noqa: E402
from tests.support import needs  # noqa: E402
from tests.support.harness import Client, serve_in_memory  # noqa: E402


@pytest.hookimpl(trylast=True)  # after the folders' conftest.py put their markers
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    needs.mark_skips(items)  # a missing model or library: a skip, with the reason


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    needs.check(item)  # before the fixtures; under CI=true a missing model or library fails the test


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine()


@pytest.fixture
async def server_client(engine: ScriptedEngine) -> AsyncIterator[tuple[Server, Client]]:
    """An in-process server on ``engine`` and a client over memory streams."""
    async with serve_in_memory(engine) as pair:
        yield pair


@pytest.fixture
async def client(server_client: tuple[Server, Client]) -> Client:
    """``server_client``'s client, initialized."""
    c = server_client[1]
    await c.initialize()
    return c
