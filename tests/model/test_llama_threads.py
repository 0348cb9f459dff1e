"""The bridge keeps to the cores it is given (issue 33): ``--llama-threads N`` holds all of
llama.cpp's work, one NPC's tokens, prompt chunks and passes of several NPCs, to N threads,
``engine/status`` says the threads in use, and the default leaves one core to the game.

Measured through the real ``oam-bridge`` subprocess on the bundled model: four NPCs speaking
at once (every pass a batch of several NPCs, where llama.cpp used every core before) use about
one core with ``--llama-threads 1``, where ``--llama-batch-threads`` at every core used nearly
two on a 2-core machine (1.94-1.99, issue 33)."""

from __future__ import annotations

import os
import sys
import time

import pytest
import trio

from bridge.engines.llama._engine import default_threads, usable_cores
from tests.support.harness import Client, bridge, rpc

NPCS = ("ada", "bo", "cy", "dee")
PROMPTS = ("Tell me about the harbour.", "What is the news from the mine?", "Sing me a song.", "Who rules here?")


def cpu_seconds(pid: int) -> float:
    """The process's user and system CPU time so far (all its threads)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def engine_threads(c: Client) -> tuple[int | None, int | None]:
    llama = next(e for e in (await c.call("engine/status", {}))["engines"] if e["name"] == "llama")
    return llama["threads"], llama["batchThreads"]


async def cores_used_by_four_npcs(*args: str) -> tuple[float, tuple[int | None, int | None]]:
    """Four NPCs generating at once, three rounds: the bridge's CPU seconds per wall second
    while they spoke, and its engine/status threads."""
    async with bridge("--engine", "llama", *args) as p:
        c = p.client
        await c.initialize()
        assert await engine_threads(c) == (None, None), "null before the model loads"
        for npc in NPCS:
            opts = {"temperature": 0.7, "seed": 1, "maxTokens": 96}
            await c.call(
                "npc/create", {"npcId": npc, "instructions": f"You are {npc}, a talkative villager.", "options": opts}
            )
        threads = await engine_threads(c)
        used = wall = 0.0
        for rnd in range(3):
            cpu0, t0 = cpu_seconds(p.pid), time.monotonic()
            reqs = [
                rpc(f"r{rnd}{npc}", "npc/respond", {"npcId": npc, "prompt": f"{q} ({rnd})"})
                for npc, q in zip(NPCS, PROMPTS, strict=True)
            ]
            await c.send(*reqs)
            with trio.fail_after(240):
                ids = [(await c.result(f"r{rnd}{npc}"))["turnId"] for npc in NPCS]
                for turn_id in ids:
                    assert (await c.wait_terminal(turn_id))["method"] == "turn/completed"
            used += cpu_seconds(p.pid) - cpu0
            wall += time.monotonic() - t0
        return used / wall, threads


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
async def test_llama_threads_holds_every_pass_of_several_npcs_to_that_many_cores() -> None:
    cores, threads = await cores_used_by_four_npcs("--llama-threads", "1")
    assert threads == (1, 1)
    # one thread of llama.cpp, plus the bridge's loop writing the words (a few percent)
    assert cores < 1.3, f"the bridge used {cores:.2f} cores with --llama-threads 1"


@pytest.mark.skipif(usable_cores() < 2, reason="one core: nothing to leave to the game")
async def test_the_default_leaves_the_game_a_core_and_batch_threads_can_be_raised() -> None:
    async with bridge("--engine", "llama", "--llama-batch-threads", "2") as p:
        await p.client.initialize()
        await p.client.call("npc/create", {"npcId": "ada"})
        assert await engine_threads(p.client) == (default_threads(), 2)
    assert default_threads() == usable_cores() - 1
