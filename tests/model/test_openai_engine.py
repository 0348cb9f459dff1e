"""The openai engine through the real ``oam-bridge`` subprocess, against a real
OpenAI-compatible server on loopback: llama-cpp-python's ``llama_cpp.server`` with the bundled
SmolLM2 model (``server_url``, started once for the module). Against stub servers, which need
no model: tests/process/test_openai_stub_server.py."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import jsonschema
import trio

from tests.support.harness import Proc, bridge

INVENTORY_TOOL = {
    "name": "check_inventory",
    "description": "Look up how many of an item the tavern has in stock.",
    "parameters": {
        "type": "object",
        "properties": {"item": {"type": "string", "enum": ["ale", "bread", "mead", "stew"]}},
        "required": ["item"],
    },
}
PRICE_TOOL = {
    "name": "check_price",
    "description": "Look up the price of an item in copper coins.",
    "parameters": {
        "type": "object",
        "properties": {"item": {"type": "string", "enum": ["ale", "bread", "mead", "stew"]}},
        "required": ["item"],
    },
}
MOOD_SCHEMA = {
    "type": "object",
    "properties": {
        "mood": {"type": "string", "enum": ["happy", "grumpy", "tired"]},
        "line": {"type": "string", "maxLength": 60},
    },
    "required": ["mood", "line"],
}


@asynccontextmanager
async def openai_bridge(url: str, *args: str) -> AsyncIterator[Proc]:
    """The bridge on the openai engine at ``url``, initialized; the engine must say it is available."""
    async with bridge("--engine", "openai", "--openai-url", url, *args, guard=None) as p:
        init = await p.initialize()
        info = {e["name"]: e for e in init["engines"]}["openai"]
        assert info["available"] is True and info["reason"] is None, info
        yield p


def deltas(p: Proc, turn_id: str, method: str = "turn/textDelta") -> list[str]:
    return [e["params"]["delta"] for e in p.client.turn_events(turn_id) if e["method"] == method]


async def test_a_streamed_text_turn(server_url: str) -> None:
    async with openai_bridge(server_url) as p:
        c = p.client
        created = await c.call(
            "npc/create",
            {
                "npcId": "keeper",
                "engine": "openai",
                "instructions": "You keep a tavern. Answer in one sentence.",
                "options": {"temperature": 0, "maxTokens": 24, "seed": 1},
            },
        )
        assert created["engine"] == "openai" and created["contextSize"] > 0
        with trio.fail_after(60):
            tid, done = await c.turn("keeper", "Hello! What do you sell?")
        assert done["method"] == "turn/completed", done
        parts = deltas(p, tid)
        assert len(parts) > 1, "streamed in more than one delta"
        assert done["params"]["text"] == "".join(parts) and done["params"]["text"].strip()
        assert done["params"]["finishReason"] in ("stop", "length")
        assert done["params"]["usage"]["outputTokens"] > 0
        c.assert_well_formed(tid)
        save = await c.call("npc/transcript", {"npcId": "keeper"})
        assert [m["role"] for m in save["turns"][0]] == ["user", "assistant"]
        await p.finish()


async def test_a_forced_tool_call_validates_then_the_final_text(server_url: str) -> None:
    async with openai_bridge(server_url) as p:
        c = p.client
        await c.call(
            "npc/create",
            {
                "npcId": "keeper",
                "engine": "openai",
                "instructions": "You keep a tavern.",
                "tools": [INVENTORY_TOOL],
                "options": {"temperature": 0, "maxTokens": 48, "seed": 1},
            },
        )
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
        params = done["params"]
        assert params["toolCalls"][0]["output"] == {"count": 3} and params["steps"] == 2
        assert params["text"] == "".join(deltas(p, r["turnId"]))  # the final step's text (the call step had none)
        assert not [w for w in params["warnings"] if "did not constrain" in w], params["warnings"]
        c.assert_well_formed(r["turnId"])
        save = await c.call("npc/transcript", {"npcId": "keeper"})
        assert [m["role"] for m in save["turns"][0]] == ["user", "assistant", "tool", "assistant"]
        await p.finish()


async def test_a_schema_turn_parses_and_validates(server_url: str) -> None:
    async with openai_bridge(server_url) as p:
        c = p.client
        await c.call(
            "npc/create",
            {
                "npcId": "keeper",
                "engine": "openai",
                "instructions": "You keep a tavern. Answer in JSON.",
                "options": {"temperature": 0, "maxTokens": 64, "seed": 1},
            },
        )
        with trio.fail_after(90):
            tid, done = await c.turn("keeper", "How are you today?", schema=MOOD_SCHEMA)
        assert done["method"] == "turn/completed", done
        jsonschema.validate(done["params"]["json"], MOOD_SCHEMA)
        assert json.loads("".join(deltas(p, tid, "turn/partialJson"))) == done["params"]["json"]
        assert not [w for w in done["params"]["warnings"] if "did not constrain" in w]
        await p.finish()


async def test_grammar_mode_a_required_step_with_two_tools_calls_one(server_url: str) -> None:
    """``--openai-grammar``: llama_cpp.server writes text when offered several tools; with the
    llama engine's grammar in the request the first (``required``) step calls one of them
    with arguments valid against its schema."""
    async with openai_bridge(server_url, "--openai-grammar") as p:
        c = p.client
        await c.call(
            "npc/create",
            {
                "npcId": "keeper",
                "engine": "openai",
                "instructions": "You keep a tavern.",
                "tools": [INVENTORY_TOOL, PRICE_TOOL],
                "options": {"temperature": 0, "maxTokens": 48, "seed": 1},
            },
        )
        with trio.fail_after(90):
            r = await c.call(
                "npc/respond",
                {"npcId": "keeper", "prompt": "How much is your ale?", "toolChoice": "required", "maxToolRounds": 1},
            )
            ev = await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
            tool = {t["name"]: t for t in (INVENTORY_TOOL, PRICE_TOOL)}[ev["params"]["name"]]
            jsonschema.validate(ev["params"]["arguments"], tool["parameters"])
            await c.call("npc/submit", {"npcId": "keeper", "callId": ev["params"]["callId"], "output": {"copper": 4}})
            done = await c.wait_terminal(r["turnId"])
        assert done["method"] == "turn/completed", done
        params = done["params"]
        assert params["toolCalls"][0]["name"] == tool["name"] and params["toolCalls"][0]["output"] == {"copper": 4}
        assert params["text"] == "".join(deltas(p, r["turnId"])) and "tool_calls" not in params["text"]
        assert not [w for w in params["warnings"] if "did not constrain" in w], params["warnings"]
        c.assert_well_formed(r["turnId"])
        await p.finish()


async def test_grammar_mode_an_auto_step_speaks_and_a_schema_turn_parses(server_url: str) -> None:
    """``OAM_OPENAI_GRAMMAR=1``: an ``auto`` step with two tools may answer in text (streamed
    in deltas, no JSON envelope), and a schema turn is constrained by the grammar."""
    grammar_on = {"OAM_OPENAI_GRAMMAR": "1"}
    async with bridge("--engine", "openai", "--openai-url", server_url, env=grammar_on, guard=None) as p:
        c = p.client
        await c.initialize()
        await c.call(
            "npc/create",
            {
                "npcId": "keeper",
                "engine": "openai",
                "instructions": "You keep a tavern. Answer in one sentence.",
                "tools": [INVENTORY_TOOL, PRICE_TOOL],
                "options": {"temperature": 0, "maxTokens": 24, "seed": 1},
            },
        )
        with trio.fail_after(90):
            tid, done = await c.turn("keeper", "Good morning! Lovely weather, isn't it?")
        assert done["method"] == "turn/completed", done
        parts = deltas(p, tid)
        assert done["params"]["toolCalls"] == [] and done["params"]["steps"] == 1, done
        assert len(parts) > 1 and done["params"]["text"] == "".join(parts) and done["params"]["text"].strip()
        assert "{" not in done["params"]["text"]
        c.assert_well_formed(tid)
        await c.call(
            "npc/create",
            {
                "npcId": "judge",
                "engine": "openai",
                "instructions": "You keep a tavern.",
                "options": {"temperature": 0, "maxTokens": 64, "seed": 1},
            },
        )
        with trio.fail_after(90):
            tid, done = await c.turn("judge", "How are you today?", schema=MOOD_SCHEMA)
        assert done["method"] == "turn/completed", done
        jsonschema.validate(done["params"]["json"], MOOD_SCHEMA)
        assert not [w for w in done["params"]["warnings"] if "did not constrain" in w]
        await p.finish()


async def test_cancel_mid_stream_rolls_back_and_the_npc_goes_on(server_url: str) -> None:
    async with openai_bridge(server_url) as p:
        c = p.client
        await c.call(
            "npc/create",
            {
                "npcId": "bard",
                "engine": "openai",
                "instructions": "You are a bard who tells very long stories.",
                "options": {"temperature": 0.8, "maxTokens": 400, "seed": 7},
            },
        )
        with trio.fail_after(60):
            r = await c.call("npc/respond", {"npcId": "bard", "prompt": "Tell me the longest tale you know."})
            await c.wait_event("turn/textDelta", turnId=r["turnId"])
            t0 = trio.current_time()
            assert (await c.call("npc/cancel", {"npcId": "bard"}))["cancelled"] == [r["turnId"]]
            done = await c.wait_terminal(r["turnId"])
            assert trio.current_time() - t0 < 2
        assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "cancelled"
        assert (await c.call("npc/transcript", {"npcId": "bard"}))["turns"] == []
        await c.call(
            "npc/create", {"npcId": "keeper", "engine": "openai", "options": {"temperature": 0, "maxTokens": 8}}
        )
        with trio.fail_after(90):  # the server and the bridge go on (the cut request is closed)
            _, after = await c.turn("keeper", "Hello")
        assert after["method"] == "turn/completed", after
        await p.finish()


async def test_four_npcs_stream_at_once(server_url: str) -> None:
    async with openai_bridge(server_url) as p:
        c = p.client
        ids = [f"npc{i}" for i in range(4)]
        for i, npc in enumerate(ids):
            await c.call(
                "npc/create",
                {
                    "npcId": npc,
                    "engine": "openai",
                    "instructions": f"You are villager number {i}.",
                    "options": {"temperature": 0, "maxTokens": 16, "seed": i},
                },
            )
        turns = [(await c.call("npc/respond", {"npcId": npc, "prompt": "Good morning!"}))["turnId"] for npc in ids]
        with trio.fail_after(120):
            done = [await c.wait_terminal(t) for t in turns]
        for t, d in zip(turns, done, strict=True):
            assert d["method"] == "turn/completed", d
            assert d["params"]["text"] == "".join(deltas(p, t)) and deltas(p, t)
            c.assert_well_formed(t)
        await p.finish()
