"""The game layer on the real model through the real subprocess (the llama engine can play
no script, so these check what holds whatever the model says): world facts reach the prompt
and their revision the turn, decisions stay inside the options, a prewarm makes the first
turn read only its new line, lore is recalled by the bridge, respond_directly never reaches
the game, and another NPC's line keeps its speaker."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio

from tests.support.harness import Client, initialized_bridge

OPTS = {"temperature": 0, "seed": 3, "maxTokens": 40}
MENU_TOOL = {
    "name": "get_menu",
    "description": "Look up what the tavern serves and the prices.",
    "parameters": {"type": "object", "properties": {}},
}


@asynccontextmanager
async def llama_client() -> AsyncIterator[Client]:
    """A llama bridge subprocess, ended (stdin closed: it must exit 0) when the block ends."""
    async with initialized_bridge("--engine", "llama", guard=None) as p:
        yield p


async def first_of(c: Client, turn_id: str, methods: tuple[str, ...]) -> dict:
    while True:
        for e in c.turn_events(turn_id):
            if e["method"] in methods:
                return e
        await trio.sleep(0.02)


async def test_world_facts_decisions_and_prewarm_on_the_real_model() -> None:
    async with llama_client() as c:
        with trio.fail_after(240):
            assert (await c.call("world/set", {"key": "gate", "value": "barred for the storm", "tags": ["village"]}))[
                "revision"
            ] == 1
            await c.call(
                "npc/create",
                {
                    "npcId": "bram",
                    "persona": {"name": "Bram", "role": "the gate guard"},
                    "tags": ["village"],
                    "options": OPTS,
                },
            )
            w = await c.call("npc/prewarm", {"npcId": "bram"})
            warm = await c.wait_terminal(w["turnId"])
            assert warm["params"]["finishReason"] == "prewarmed" and warm["params"]["usage"]["inputTokens"] > 30
            tid, done = await c.turn("bram", "Is the gate open?", toolChoice="none")
            p = done["params"]
            assert done["method"] == "turn/completed" and p["worldRevision"] == 1
            assert p["usage"]["cachedTokens"] >= warm["params"]["usage"]["inputTokens"] - 2, (
                "the prewarmed prompt is reused"
            )
            options = [
                {"name": "let_in", "description": "open the gate"},
                {"name": "question", "description": "ask who they are"},
                {
                    "name": "ring_bell",
                    "description": "ring the bell",
                    "parameters": {
                        "type": "object",
                        "properties": {"times": {"type": "integer", "enum": [1, 2, 3]}},
                        "required": ["times"],
                    },
                },
            ]
            for seed in range(4):
                await c.call(
                    "npc/restore",
                    {
                        "save": {
                            "version": 1,
                            "config": {
                                "npcId": "d",
                                "persona": {"name": "Bram"},
                                "options": {"temperature": 0.9, "seed": seed, "maxTokens": 120},
                            },
                            "turns": [],
                        }
                    },
                )
                r = await c.call(
                    "npc/decide",
                    {"npcId": "d", "situation": "A stranger knocks at the gate after dark.", "options": options},
                )
                done = await c.wait_terminal(r["turnId"])
                assert done["method"] == "turn/completed", done
                answer = done["params"]["json"]
                assert list(answer)[:2] == ["reasoning", "choice"] and answer["choice"] in {
                    "let_in",
                    "question",
                    "ring_bell",
                }
                assert ("arguments" in answer) == (answer["choice"] == "ring_bell")
                assert answer["reasoning"][:1].isupper() and answer["reasoning"][-1] in ".!", "a sentence (x-oam-prose)"
            assert (await c.call("npc/transcript", {"npcId": "d"}))["turns"] == [], "decisions stay out of the history"


async def test_lore_respond_directly_and_speakers_on_the_real_model() -> None:
    async with llama_client() as c:
        with trio.fail_after(240):
            await c.call(
                "world/set",
                {"key": "the old keep", "value": "Built by King Aldric two hundred years ago.", "lore": True},
            )
            await c.call(
                "npc/create",
                {"npcId": "sage", "persona": {"name": "Mira", "role": "the village sage"}, "options": OPTS},
            )
            tid, done = await c.turn("sage", "Who built the old keep?", toolChoice={"tool": "recall"}, maxToolRounds=1)
            assert done["method"] == "turn/completed", done
            (call,) = done["params"]["toolCalls"]
            assert call["name"] == "recall" and call["arguments"] == {"topic": "the old keep"}
            assert call["output"] == "Built by King Aldric two hundred years ago."
            assert not [e for e in c.turn_events(tid) if e["method"] == "turn/toolCallRequested"], (
                "the bridge answered it"
            )
            await c.call(
                "npc/create",
                {
                    "npcId": "keeper",
                    "persona": {"name": "Greta", "role": "tavern keeper"},
                    "tools": [MENU_TOOL],
                    "options": OPTS,
                },
            )
            for line in ("Good evening!", "What do you serve?"):
                r = await c.call(
                    "npc/respond",
                    {"npcId": "keeper", "prompt": line, "toolChoice": "tool_or_answer", "maxToolRounds": 1},
                )
                # answer whatever the model chose; respond_directly is never asked for
                first = await first_of(c, r["turnId"], ("turn/toolCallRequested", "turn/completed", "turn/failed"))
                if first["method"] == "turn/toolCallRequested":
                    assert first["params"]["name"] == "get_menu"
                    await c.call(
                        "npc/submit",
                        {"npcId": "keeper", "callId": first["params"]["callId"], "output": {"ale": "2 copper"}},
                    )
                done = await c.wait_terminal(r["turnId"])
                assert done["method"] == "turn/completed", done
                assert all(t["name"] == "get_menu" for t in done["params"]["toolCalls"])
            tid, done = await c.turn("sage", "Mira, is the storm coming?", speaker="keeper", toolChoice="none")
            assert done["method"] == "turn/completed" and c.turn_events(tid)[0]["params"]["speaker"] == "Greta"
            assert not done["params"]["text"].startswith(("Mira:", "Greta:")), "no copied speaker label"
            turns = (await c.call("npc/transcript", {"npcId": "sage"}))["turns"]
            assert turns[-1][0] == {"role": "user", "content": "Mira, is the storm coming?", "name": "Greta"}
