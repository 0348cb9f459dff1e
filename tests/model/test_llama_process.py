"""The real model through the real subprocess: an engine-executed tool round trip, and
a forced call that is schema-valid. Every stdout line is parsed as JSON by the Client."""

from __future__ import annotations

import signal

import jsonschema
import trio

from tests.support.harness import bridge, rpc

# An enum: the game's inventory has fixed item names (free strings are covered in
# test_llama_steering.py, where the grammar bounds them).
INVENTORY_TOOL = {
    "name": "check_inventory",
    "description": "Look up how many of an item the tavern has in stock.",
    "parameters": {
        "type": "object",
        "properties": {"item": {"type": "string", "enum": ["ale", "bread", "mead", "stew"]}},
        "required": ["item"],
    },
}


async def test_real_model_calls_a_game_tool_and_finishes_after_submit() -> None:
    async with bridge("--engine", "llama", guard=None) as c:
        init = await c.initialize()
        assert {e["name"]: e["available"] for e in init["engines"]}["llama"] is True
        created = await c.call(
            "npc/create",
            {
                "npcId": "keeper",
                "persona": {"name": "Greta", "role": "tavern keeper"},
                "tools": [INVENTORY_TOOL],
                "options": {"temperature": 0, "maxTokens": 64, "seed": 1},
            },
        )
        assert created["engine"] == "llama" and created["contextSize"] > 0
        with trio.fail_after(90):
            r = await c.call(
                "npc/respond",
                {
                    "npcId": "keeper",
                    "prompt": "Do you have ale?",
                    "toolChoice": {"tool": "check_inventory"},
                    "maxToolRounds": 1,
                },
            )
            ev = await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
            assert ev["params"]["name"] == "check_inventory"
            jsonschema.validate(ev["params"]["arguments"], INVENTORY_TOOL["parameters"])
            await c.call("npc/submit", {"npcId": "keeper", "callId": ev["params"]["callId"], "output": {"count": 3}})
            done = await c.wait_terminal(r["turnId"])
        assert done["method"] == "turn/completed", done
        assert done["params"]["toolCalls"][0]["output"] == {"count": 3}
        assert done["params"]["steps"] == 2 and done["params"]["usage"]["outputTokens"] > 0
        c.assert_well_formed(r["turnId"])
        await c.finish()


async def test_a_signal_while_the_engine_starts_still_answers_every_request() -> None:
    # SIGTERM while npc/create starts the llama engine in a worker thread: the create and the
    # requests queued behind it each get their one response (shutting_down) before the exit
    async with bridge("--engine", "llama", guard=None) as c:
        await c.initialize()
        await c.send(
            rpc(10, "npc/create", {"npcId": "a", "instructions": "You are a guard."}),
            rpc(11, "npc/respond", {"npcId": "a", "prompt": "Hi"}),
            [rpc(12, "npc/list"), {"jsonrpc": "2.0", "method": "npc/list"}],
        )
        await trio.sleep(0.1)  # read, and the create waits for the engine (about a second)
        c.process.send_signal(signal.SIGTERM)
        with trio.fail_after(10):
            assert await c.process.wait() == 0
            await c.eof.wait()
    answers = [r for r in c.responses if isinstance(r, dict) and r.get("id") in (10, 11)]
    answers += [r for r in c.responses if isinstance(r, list) for r in r]
    assert sorted(r["id"] for r in answers) == [10, 11, 12], c.responses
    assert all(r["error"]["data"]["code"] == "shutting_down" for r in answers), answers
