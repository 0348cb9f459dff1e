"""The bridge yields the CPU to the game's frame (issue 33): by default every thread of the
real ``oam-bridge`` process runs at nice +10 (the game's frame wins when both want a core:
bench/bench_frame.py has the frame times), ``--priority normal`` (``OAM_PRIORITY``) keeps the
game's priority."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.support.harness import bridge

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")


def nice_of_threads(pid: int) -> dict[int, int]:
    """Each thread's nice value (/proc/PID/task/TID/stat, field 19)."""
    out = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        out[int(task.name)] = int(fields[16])
    return out


async def threads_nice(*args: str) -> dict[int, int]:
    async with bridge(*args) as p:
        await p.client.initialize()
        await p.client.call("npc/create", {"npcId": "a", "script": [{"text": "Hi."}]})
        _, done = await p.client.turn("a", "Hello")  # the worker threads have started
        assert done["method"] == "turn/completed"
        return nice_of_threads(p.pid)


async def test_every_thread_of_the_bridge_yields_to_the_game_by_default() -> None:
    base = os.nice(0)
    niced = await threads_nice()
    assert len(niced) > 1 and set(niced.values()) == {min(19, base + 10)}, niced  # 19: the lowest


async def test_priority_normal_keeps_the_games() -> None:
    base = os.nice(0)
    assert set((await threads_nice("--priority", "normal")).values()) == {base}


def test_building_a_registry_in_process_leaves_the_callers_priority() -> None:
    """Only a host's main lowers the priority: a game or a test that builds a registry in its
    own process keeps its own."""
    import argparse

    from bridge.hosts._common import add_engine_arguments, build_registry

    ap = argparse.ArgumentParser()
    add_engine_arguments(ap)
    before = os.nice(0)
    build_registry(ap.parse_args(["--engine", "scripted"]))
    assert os.nice(0) == before
