"""The contract's targets: the same scenarios in-process, through the real subprocess on the
scripted engine, and through the real subprocess on the native engine (the Swift library's
scripted backend behind the C ABI; marker ``native``: skipped where the library does not
load, failed under CI=true)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from bridge import Limits, ScriptedEngine
from tests.support.harness import Client, bridge, serve_in_memory

# Every target runs with these limits, each CLI-settable one off its default (and wider, so
# no scenario meets them): initialize must advertise the limits configured, not the defaults.
CONTRACT_LIMITS = Limits(
    max_line_bytes=6 * 1024 * 1024,
    max_npcs=9_000,
    max_pending_lines=2048,
    max_outbound_bytes=12 * 1024 * 1024,
    exit_grace_ms=2500,
)
LIMIT_ARGS = [
    "--max-line-bytes",
    str(CONTRACT_LIMITS.max_line_bytes),
    "--max-npcs",
    str(CONTRACT_LIMITS.max_npcs),
    "--max-pending-lines",
    str(CONTRACT_LIMITS.max_pending_lines),
    "--max-outbound-bytes",
    str(CONTRACT_LIMITS.max_outbound_bytes),
    "--exit-grace-ms",
    str(CONTRACT_LIMITS.exit_grace_ms),
]


@pytest.fixture
def contract_limits() -> Limits:
    """The limits every ``any_client`` target was started with."""
    return CONTRACT_LIMITS


@pytest.fixture(params=["memory", "subprocess", pytest.param("native-subprocess", marks=pytest.mark.native)])
async def any_client(request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    """An initialized client of each target (the initialize result: ``init_result``)."""
    if request.param == "memory":
        async with serve_in_memory(ScriptedEngine(), CONTRACT_LIMITS) as (_, c):
            await c.initialize()
            yield c
    else:
        engine = ["--engine", "native"] if request.param == "native-subprocess" else []
        async with bridge(*engine, *LIMIT_ARGS) as p:
            await p.initialize()
            yield p
