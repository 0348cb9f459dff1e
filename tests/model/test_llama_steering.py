"""Steering on the real bundled model, through the real ``oam-bridge`` subprocess.

Each test names the rule it checks. The small model is not smart, so these tests assert
what the bridge guarantees whatever the model "wants": calls of enabled tools only, with
schema-valid arguments; forced and named choices; budgets; schema answers; cancel;
trimming; stdout purity. Every stdout line is parsed as JSON by the test client.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import jsonschema
import pytest
import trio

from bridge.engines import llama
from tests.support.harness import Proc, RpcError, initialized_bridge

NOTE_TOOL = {  # a free string argument: bounded by the grammar, so the call always closes
    "name": "write_note",
    "description": "Write a note in the tavern's ledger.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
}
DOOR_TOOL = {
    "name": "open_door",
    "description": "Open one of the tavern's doors.",
    "parameters": {
        "type": "object",
        "properties": {"door": {"type": "string", "enum": ["front", "back", "cellar"]}},
        "required": ["door"],
    },
}
DICE_TOOL = {
    "name": "roll_dice",
    "description": "Roll dice with the game's own random numbers.",
    "parameters": {
        "type": "object",
        "properties": {"sides": {"type": "integer"}, "count": {"type": "integer"}},
        "required": ["sides", "count"],
    },
}
TOOLS = [NOTE_TOOL, DOOR_TOOL, DICE_TOOL]
BY_NAME = {t["name"]: t for t in TOOLS}


# An initialized bridge on the llama engine; at the end, stdin EOF must exit it with 0.
llama_bridge = partial(initialized_bridge, "--engine", "llama", guard=None)


@pytest.fixture
async def bridge() -> AsyncIterator[Proc]:
    async with llama_bridge("--llama-ctx", "1024") as p:
        yield p


def copy_of_the_model(tmp_path: Any) -> str:
    other = tmp_path / "other.gguf"
    shutil.copyfile(llama.default_model_path(), other)
    return str(other)


async def create(
    p: Proc, npc: str, tools: list[dict[str, Any]], seed: int = 1, max_tokens: int = 64, **extra: Any
) -> None:
    await p.client.call(
        "npc/create",
        {
            "npcId": npc,
            "persona": {"name": "Greta", "role": "tavern keeper"},
            "tools": tools,
            "options": {"temperature": 0.8, "maxTokens": max_tokens, "seed": seed},
            **extra,
        },
    )


async def run_turn(
    p: Proc, npc: str, prompt: str, output: Any = "done", **kw: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One turn; every game tool call is answered with ``output``. Returns the terminal
    event and the calls the game saw."""
    with trio.fail_after(120):
        return await p.turn_answering_calls(npc, prompt, output, **kw)


def assert_valid_call(call: dict[str, Any], allowed: set[str]) -> None:
    assert call["name"] in allowed, call
    jsonschema.validate(call["arguments"], BY_NAME[call["name"]]["parameters"])


async def test_forced_call_with_a_free_string_argument_is_valid_and_bounded(bridge: Proc) -> None:
    # REQ llama-required: `required` forces a call of an enabled tool with valid arguments;
    # a free string is bounded, so the call cannot run to maxTokens and come out malformed.
    for seed in (1, 2, 3):
        await create(bridge, f"scribe{seed}", [NOTE_TOOL], seed=seed, max_tokens=400)
        done, calls = await run_turn(
            bridge,
            f"scribe{seed}",
            "Write down that the bard owes us three silver.",
            toolChoice="required",
            maxToolRounds=1,
        )
        assert done["method"] == "turn/completed", done
        assert len(calls) >= 1
        for call in calls:
            assert_valid_call(call, {"write_note"})
            assert len(call["arguments"]["text"]) <= llama.TOOL_STRING_MAX


async def test_named_choice_among_several_tools_calls_exactly_that_tool(bridge: Proc) -> None:
    # REQ llama-named: a named tool allows only that one on the first step.
    for seed in (1, 2):
        await create(bridge, f"gambler{seed}", TOOLS, seed=seed)
        done, calls = await run_turn(
            bridge, f"gambler{seed}", "Open the cellar door for me.", toolChoice={"tool": "roll_dice"}, maxToolRounds=1
        )
        assert done["method"] == "turn/completed", done
        assert calls and all(c["name"] == "roll_dice" for c in calls)
        for call in calls:
            assert_valid_call(call, {"roll_dice"})


async def test_required_with_several_tools_and_budgets(bridge: Proc) -> None:
    # REQ llama-budget: maxToolRounds 1 => one round of calls, then a step without tools
    # that must answer in text; maxToolCalls 1 => the grammar holds the step to one call
    # (before it did, each of seeds 2-13 made several with room for them, maxTokens 160, and
    # the calls past the budget got error outputs the model then read).
    for seed in (4, 5, 6, 7):
        await create(bridge, f"keeper{seed}", TOOLS, seed=seed, max_tokens=160)
        done, calls = await run_turn(
            bridge,
            f"keeper{seed}",
            "Roll two six-sided dice and open the front door.",
            toolChoice="required",
            maxToolRounds=1,
            maxToolCalls=1,
        )
        assert done["method"] == "turn/completed", (seed, done)
        p = done["params"]
        assert p["steps"] == 2, "one tool round, then one answering step"
        for call in calls:
            assert_valid_call(call, set(BY_NAME))
        assert len(calls) == 1, "a forced step within maxToolCalls 1 makes exactly one call"
        assert len(p["toolCalls"]) == 1, "no call over the budget, so no error output to read"


async def test_auto_with_tools_gives_text_or_valid_calls(bridge: Proc) -> None:
    # REQ llama-auto: with tools allowed the model may answer or call, but only enabled
    # tools with valid arguments come out; the turn completes either way.
    for seed in (1, 2, 3):
        await create(bridge, f"host{seed}", [DOOR_TOOL, DICE_TOOL], seed=seed)
        done, calls = await run_turn(
            bridge, f"host{seed}", "Good evening! Could you open the back door?", maxToolRounds=2
        )
        assert done["method"] == "turn/completed", done
        for call in calls:
            assert_valid_call(call, {"open_door", "roll_dice"})
        assert done["params"]["text"] or calls


async def test_schema_answer_with_tools_available_validates(bridge: Proc) -> None:
    # REQ llama-schema: the answer is constrained to the turn's schema, also when tools
    # could be called first; and a schema feature the grammar cannot enforce is reported.
    schema = {
        "type": "object",
        "properties": {
            "mood": {"type": "string", "enum": ["happy", "grumpy", "tired"]},
            "coins": {"type": "integer", "minimum": -1000000},
        },
        "required": ["mood", "coins"],
    }
    await create(bridge, "clerk", [DICE_TOOL], seed=5)
    done, calls = await run_turn(
        bridge,
        "clerk",
        "How are you, and how many coins do you have?",
        output={"total": 7},
        schema=schema,
        maxToolRounds=1,
    )
    assert done["method"] == "turn/completed", done
    jsonschema.validate(done["params"]["json"], schema)
    assert list(done["params"]["json"]) == ["mood", "coins"], "keys in the schema's order"
    assert any("'minimum'" in w for w in done["params"]["warnings"]), done["params"]["warnings"]
    for call in calls:
        assert_valid_call(call, {"roll_dice"})


async def test_cancel_mid_generation_stops_within_a_few_tokens_and_rolls_back(bridge: Proc) -> None:
    # REQ llama-cancel: cancel reaches the generating thread within a token or two; the
    # turn ends `cancelled` and the transcript holds no trace of it.
    c = bridge.client
    await create(bridge, "bard", [], seed=6, max_tokens=400)
    r = await c.call("npc/respond", {"npcId": "bard", "prompt": "Tell me a very long story about a dragon."})
    tid = r["turnId"]
    with trio.fail_after(60):
        await c.wait_event("turn/textDelta", turnId=tid)
        await c.call("npc/cancel", {"npcId": "bard"})
        at_cancel = len([e for e in c.turn_events(tid) if e["method"] == "turn/textDelta"])
        done = await c.wait_terminal(tid)
    after = len([e for e in c.turn_events(tid) if e["method"] == "turn/textDelta"]) - at_cancel
    assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "cancelled"
    assert after <= 2, f"{after} deltas arrived after the cancel was answered"
    save = await c.call("npc/transcript", {"npcId": "bard"})
    assert save["turns"] == []


async def test_trimming_keeps_a_long_conversation_inside_the_window(bridge: Proc) -> None:
    # REQ llama-trim: with real token counts, the oldest turns are dropped from what the
    # model sees, the game is told, and the turn completes inside a 1024-token window.
    c = bridge.client
    story = "The harbour was quiet that night, and the lanterns swayed over the black water. " * 4
    turns = [
        [{"role": "user", "content": f"Tell me more ({i})."}, {"role": "assistant", "content": story}]
        for i in range(30)
    ]
    save = {
        "version": 1,
        "config": {
            "npcId": "sailor",
            "instructions": "You are an old sailor.",
            "engine": "llama",
            "options": {"maxTokens": 32, "temperature": 0, "seed": 1},
        },
        "turns": turns,
    }
    await c.call("npc/restore", {"save": save})
    before = await c.call("tokens/count", {"npcId": "sailor", "text": story})
    assert before["tokens"] * len(turns) > before["contextSize"], "the restored history must overflow the window"
    assert before["promptTokens"] <= before["contextSize"], (
        "promptTokens is what the model would see: the trimmed prompt"
    )
    done, _ = await run_turn(bridge, "sailor", "And then?")
    assert done["method"] == "turn/completed", done
    trimmed = [e for e in c.turn_events(done["params"]["turnId"]) if e["method"] == "turn/contextTrimmed"]
    assert trimmed, "the game is told what was dropped"
    t = trimmed[0]["params"]
    assert t["droppedTurns"] > 0 and t["promptTokens"] <= t["contextSize"]
    assert done["params"]["usage"]["inputTokens"] <= before["contextSize"]


async def test_stdout_stays_protocol_only_while_llama_logs_verbosely() -> None:
    # REQ llama-stdout: llama.cpp's own logging never reaches the protocol stream.
    async with llama_bridge("--llama-verbose", "--llama-ctx", "512") as p:
        await create(p, "talker", [DOOR_TOOL], max_tokens=16)
        done, _ = await run_turn(p, "talker", "Hello!")
        assert done["method"] == "turn/completed", done
    with trio.fail_after(5):
        await p.client.eof.wait()
    assert b"llama" in bytes(p.stderr) and len(p.stderr) > 2000, "llama.cpp did log (to stderr)"
    assert p.client.responses and p.client.events  # every one of them parsed as JSON by the client


async def test_unknown_model_file_is_a_clear_error() -> None:
    # REQ llama-model-option: a chosen GGUF file that does not exist makes the engine
    # unavailable with the reason, and create fails with model_unavailable.
    async with llama_bridge("--model", "/nonexistent/model.gguf") as p:
        info = {e["name"]: e for e in (await p.client.call("engine/status"))["engines"]}["llama"]
        assert info["available"] is False and "/nonexistent/model.gguf" in info["reason"]
        with pytest.raises(RpcError) as err:
            await p.client.call("npc/create", {"npcId": "x", "engine": "llama"})
        assert err.value.error["data"]["code"] == "model_unavailable"


async def test_an_npc_can_run_on_its_own_gguf_file(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # REQ llama-model-per-npc: `model` in npc/create picks another GGUF file for one NPC;
    # NPCs on the bridge's default model are unaffected, and the choice is saved.
    other = copy_of_the_model(tmp_path)
    async with llama_bridge("--llama-ctx", "512") as p:
        c = p.client
        await create(p, "a", [], max_tokens=8)
        await create(p, "b", [], max_tokens=8, model=other)
        for npc in ("a", "b"):
            done, _ = await run_turn(p, npc, "Hello!")
            assert done["method"] == "turn/completed", done
        save = await c.call("npc/transcript", {"npcId": "b"})
        assert save["config"]["model"] == other
        with pytest.raises(RpcError) as err:
            await create(p, "c", [], model=str(tmp_path / "missing.gguf"))
        assert err.value.code == "model_unavailable" and "missing.gguf" in err.value.error["message"]
        with pytest.raises(RpcError) as err:
            await c.call("npc/create", {"npcId": "d", "engine": "scripted", "model": other})
        assert err.value.code == "invalid_params"


async def test_loading_a_model_does_not_stall_the_other_npcs(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # REQ llama-load-off-loop: a create that loads another GGUF file loads it in a worker
    # thread; meanwhile another NPC's turn keeps streaming (before, the loop stood still for
    # the whole load), and the create is still answered in order.
    other = copy_of_the_model(tmp_path)
    async with llama_bridge("--llama-ctx", "512") as p:
        c = p.client
        await c.call(
            "npc/create", {"npcId": "bard", "engine": "scripted", "script": [{"text": "la " * 3000, "chunkMs": 2}]}
        )
        r = await c.call("npc/respond", {"npcId": "bard", "prompt": "sing"})
        with trio.fail_after(60):
            await c.until("the bard's first 20 events", lambda: len(c.turn_events(r["turnId"])) >= 20 or None)
            arrivals: list[float] = []

            async def watch() -> None:
                seen = len(c.turn_events(r["turnId"]))
                while True:
                    await c.until(
                        "the bard's next event", lambda seen=seen: len(c.turn_events(r["turnId"])) > seen or None
                    )
                    n = len(c.turn_events(r["turnId"]))
                    arrivals.extend([trio.current_time()] * (n - seen))
                    seen = n

            async with trio.open_nursery() as inner:
                inner.start_soon(watch)
                t0 = trio.current_time()
                created = await c.call("npc/create", {"npcId": "sage", "model": other})
                took = trio.current_time() - t0
                inner.cancel_scope.cancel()
        assert created["engine"] == "llama"
        during = [t for t in arrivals if t0 <= t <= t0 + took]
        gaps = [b - a for a, b in zip([t0, *during], [*during, t0 + took], strict=True)]
        assert len(during) >= 5 and max(gaps) < took / 2, (
            f"the load took {took:.3f} s; longest pause in the stream {max(gaps):.3f} s"
        )
        await c.call("npc/cancel", {"npcId": "bard"})
