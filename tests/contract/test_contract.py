"""Conformance scenarios, each tied to a requirement id, run in-process and against the
real ``oam-bridge`` subprocess over pipes (the ``any_client`` fixture)."""

from __future__ import annotations

import msgspec
import pytest

import bridge
from bridge import Limits
from tests.support.harness import DOOR_TOOL, INVENTORY_TOOL, Client, RpcError

req = pytest.mark.req


async def create(
    c: Client, npc_id: str = "keeper", script: list | None = None, tools: list | None = None, **kw
) -> dict:
    params = {
        "npcId": npc_id,
        "persona": {"name": "Greta", "role": "tavern keeper", "traits": ["gruff"]},
        "tools": tools if tools is not None else [INVENTORY_TOOL],
        **kw,
    }
    if script is not None:
        params["script"] = script
    return await c.call("npc/create", params)


@req("P-INIT-1")
async def test_initialize_reports_version_engines_and_limits(any_client: Client, contract_limits: Limits) -> None:
    init = any_client.init_result
    assert init is not None
    assert init["protocolVersion"] == 1
    assert init["serverInfo"] == {"name": "oam-bridge", "version": bridge.__version__}
    assert init["limits"] == msgspec.to_builtins(contract_limits), "the limits the bridge was started with"
    assert {e["name"] for e in init["engines"]} >= {"scripted", "llama", "native"}
    status = await any_client.call("engine/status", {})
    names = {e["name"]: e for e in status["engines"]}
    assert names["scripted"]["available"] is True
    assert {"llama", "native"} <= set(names)
    assert all("reason" in e for e in status["engines"])


@req("T-TOOL-1")
async def test_engine_executed_tool_round_trip(any_client: Client) -> None:
    c = any_client
    await create(
        c,
        script=[
            {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]},
            {"text": "We have 3 barrels."},
        ],
    )
    r = await c.call("npc/respond", {"npcId": "keeper", "prompt": "Any ale?"})
    ev = await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
    assert ev["params"]["name"] == "check_inventory" and ev["params"]["arguments"] == {"item": "ale"}
    assert await c.call("npc/submit", {"npcId": "keeper", "callId": "c1", "output": {"count": 3}}) == {"accepted": True}
    done = await c.wait_terminal(r["turnId"])
    assert done["method"] == "turn/completed"
    assert done["params"]["text"] == "We have 3 barrels."
    assert done["params"]["toolCalls"] == [
        {"callId": "c1", "name": "check_inventory", "arguments": {"item": "ale"}, "output": {"count": 3}}
    ]
    assert done["params"]["steps"] == 2
    c.assert_well_formed(r["turnId"])
    deltas = [e["params"] for e in c.turn_events(r["turnId"]) if e["method"] == "turn/textDelta"]
    assert "".join(d["delta"] for d in deltas) == "We have 3 barrels." == deltas[-1]["text"]


@req("T-WARN-1")
async def test_engine_warnings_reach_the_completed_turn_once(any_client: Client) -> None:
    c = any_client
    w = "schema: 'pattern' is not enforced while generating (checked afterwards)"
    await create(
        c,
        script=[
            {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}], "warnings": [w]},
            {"text": "ok", "warnings": [w, "second"]},
        ],
    )
    r = await c.call("npc/respond", {"npcId": "keeper", "prompt": "Any ale?"})
    await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
    await c.call("npc/submit", {"npcId": "keeper", "callId": "c1", "output": 1})
    done = await c.wait_terminal(r["turnId"])
    assert done["params"]["warnings"] == [w, "second"], "each step's warnings, each once, in order"


@req("C-CONTRACT-1")
async def test_calls_on_a_disallowed_step_are_ignored_with_a_warning(any_client: Client) -> None:
    c = any_client
    await create(
        c,
        script=[
            {
                "text": "No tools today.",
                "toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}],
            }
        ],
    )
    tid, done = await c.turn("keeper", "Any ale?", toolChoice="none")
    assert done["method"] == "turn/completed", done
    assert done["params"]["text"] == "No tools today." and done["params"]["toolCalls"] == []
    assert any("disallowed" in w for w in done["params"]["warnings"])
    assert not [e for e in c.turn_events(tid) if e["method"].startswith("turn/toolCall")]
    c.assert_well_formed(tid)


@req("C-CONTRACT-2")
async def test_a_required_step_answered_with_text_fails_generation_failed(any_client: Client) -> None:
    c = any_client
    await create(c, tools=[INVENTORY_TOOL, DOOR_TOOL], script=[{"text": "I will not."}, {"text": "Nor will I."}])
    for choice in ("required", {"tool": "open_door"}):
        tid, done = await c.turn("keeper", "Open up.", toolChoice=choice)
        assert done["method"] == "turn/failed", done
        assert done["params"]["error"]["code"] == "generation_failed" and done["params"]["error"]["retryable"] is True
        assert "without calling a tool" in done["params"]["error"]["message"]
        c.assert_well_formed(tid)
    assert (await c.call("npc/transcript", {"npcId": "keeper"}))["turns"] == []


@req("C-CONTRACT-3")
async def test_a_call_to_a_tool_not_shown_gets_an_error_output_and_the_turn_goes_on(any_client: Client) -> None:
    c = any_client
    calls = [
        {"id": "a", "name": "check_inventory", "arguments": {"item": "ale"}},
        {"id": "b", "name": "fly", "arguments": {}},
    ]
    await create(c, tools=[INVENTORY_TOOL, DOOR_TOOL], script=[{"toolCalls": calls}, {"text": "The door stays shut."}])
    tid, done = await c.turn("keeper", "Open the north door.", toolChoice={"tool": "open_door"})
    assert done["method"] == "turn/completed", done
    assert done["params"]["text"] == "The door stays shut."
    errors = {t["callId"]: t["error"] for t in done["params"]["toolCalls"]}
    assert "not offered on this step" in errors["a"] and "unknown tool" in errors["b"]
    assert not [e for e in c.turn_events(tid) if e["method"] == "turn/toolCallRequested"], "the game never sees them"
    t = await c.call("npc/transcript", {"npcId": "keeper"})
    assert [(m["toolCallId"], m.get("isError")) for m in t["turns"][0] if m["role"] == "tool"] == [
        ("a", True),
        ("b", True),
    ]
    c.assert_well_formed(tid)


@req("T-TOOL-2")
async def test_submit_for_unknown_or_answered_call_is_an_error(any_client: Client) -> None:
    c = any_client
    await create(
        c,
        script=[{"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]}, {"text": "ok"}],
    )
    with pytest.raises(RpcError) as e:
        await c.call("npc/submit", {"npcId": "keeper", "callId": "nope", "output": 1})
    assert e.value.code == "unknown_tool_call" and e.value.error["code"] == -31021
    r = await c.call("npc/respond", {"npcId": "keeper", "prompt": "Any ale?"})
    await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
    await c.call("npc/submit", {"npcId": "keeper", "callId": "c1", "output": 1})
    with pytest.raises(RpcError) as e:
        await c.call("npc/submit", {"npcId": "keeper", "callId": "c1", "output": 2})
    assert e.value.code == "unknown_tool_call"
    assert (await c.wait_terminal(r["turnId"]))["method"] == "turn/completed"


@req("T-TOOL-3")
async def test_tool_error_becomes_the_output_and_the_turn_completes(any_client: Client) -> None:
    c = any_client
    await create(
        c,
        script=[
            {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]},
            {"text": "Sorry, the cellar is locked."},
        ],
    )
    r = await c.call("npc/respond", {"npcId": "keeper", "prompt": "Any ale?"})
    await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
    await c.call("npc/submit", {"npcId": "keeper", "callId": "c1", "error": "cellar locked"})
    done = await c.wait_terminal(r["turnId"])
    assert done["method"] == "turn/completed"
    assert done["params"]["toolCalls"][0]["error"] == "cellar locked"
    completed = await c.wait_event("turn/toolCallCompleted", turnId=r["turnId"])
    assert completed["params"]["error"] == "cellar locked"


@req("T-TOOL-4")
async def test_parallel_calls_are_requested_together_and_outputs_keep_call_order(any_client: Client) -> None:
    c = any_client
    calls = [
        {"id": "a", "name": "check_inventory", "arguments": {"item": "ale"}},
        {"id": "b", "name": "check_inventory", "arguments": {"item": "mead"}},
    ]
    await create(c, script=[{"toolCalls": calls}, {"text": "done"}])
    r = await c.call("npc/respond", {"npcId": "keeper", "prompt": "Ale and mead?"})
    await c.wait_event("turn/toolCallRequested", turnId=r["turnId"], callId="a")
    await c.wait_event("turn/toolCallRequested", turnId=r["turnId"], callId="b")
    await c.call("npc/submit", {"npcId": "keeper", "callId": "b", "output": "mead: 1"})
    await c.call("npc/submit", {"npcId": "keeper", "callId": "a", "output": "ale: 3"})
    done = await c.wait_terminal(r["turnId"])
    assert [(t["callId"], t["output"]) for t in done["params"]["toolCalls"]] == [("a", "ale: 3"), ("b", "mead: 1")]
    t = await c.call("npc/transcript", {"npcId": "keeper"})
    tool_msgs = [m for m in t["turns"][0] if m["role"] == "tool"]
    assert [m["toolCallId"] for m in tool_msgs] == ["a", "b"]


@req("T-TOOL-5")
async def test_tool_timeout_withdraws_the_call_and_the_model_gets_an_error(any_client: Client) -> None:
    c = any_client
    await create(
        c,
        script=[
            {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]},
            {"text": "The cellar boy is slow."},
        ],
    )
    tid, done = await c.turn("keeper", "Any ale?", toolTimeoutMs=50)
    assert done["method"] == "turn/completed"
    w = await c.wait_event("turn/toolCallWithdrawn", turnId=tid)
    assert w["params"]["reason"] == "timeout" and w["params"]["callId"] == "c1"
    assert "did not answer" in done["params"]["toolCalls"][0]["error"]
    c.assert_well_formed(tid)


@req("T-CANCEL-1")
async def test_cancel_while_awaiting_a_tool_withdraws_it_and_rolls_back(any_client: Client) -> None:
    c = any_client
    await create(
        c,
        script=[
            {"text": "Welcome."},
            {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]},
        ],
    )
    await c.turn("keeper", "Hello")
    before = await c.call("npc/transcript", {"npcId": "keeper"})
    r = await c.call("npc/respond", {"npcId": "keeper", "prompt": "Any ale?"})
    await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
    assert (await c.call("npc/cancel", {"npcId": "keeper"}))["cancelled"] == [r["turnId"]]
    done = await c.wait_terminal(r["turnId"])
    assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "cancelled"
    w = await c.wait_event("turn/toolCallWithdrawn", turnId=r["turnId"])
    assert w["params"]["reason"] == "cancelled"
    assert await c.call("npc/transcript", {"npcId": "keeper"}) == before
    c.assert_well_formed(r["turnId"])


@req("T-CANCEL-2")
async def test_cancel_mid_stream_ends_cancelled(any_client: Client) -> None:
    c = any_client
    await create(c, script=[{"text": "one two three four five six seven eight nine ten", "chunkMs": 30}])
    r = await c.call("npc/respond", {"npcId": "keeper", "prompt": "Tell me a story"})
    await c.wait_event("turn/textDelta", turnId=r["turnId"])
    await c.call("npc/cancel", {"npcId": "keeper"})
    done = await c.wait_terminal(r["turnId"])
    assert done["params"]["error"] == {"code": "cancelled", "message": "turn cancelled", "retryable": False}
    assert (await c.call("npc/transcript", {"npcId": "keeper"}))["turns"] == []


@req("T-ROLLBACK-1")
async def test_failed_turn_rolls_back_and_reports_the_stable_code(any_client: Client) -> None:
    c = any_client
    await create(
        c,
        script=[
            {"text": "Hi."},
            {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]},
            {"error": "guardrail_violation"},
        ],
    )
    await c.turn("keeper", "Hello")
    r = await c.call("npc/respond", {"npcId": "keeper", "prompt": "Threaten me"})
    await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
    await c.call("npc/submit", {"npcId": "keeper", "callId": "c1", "output": 1})
    done = await c.wait_terminal(r["turnId"])
    assert done["params"]["error"]["code"] == "guardrail_violation"
    t = await c.call("npc/transcript", {"npcId": "keeper"})
    assert len(t["turns"]) == 1 and t["turns"][0][0]["content"] == "Hello"


@req("T-ORDER-1")
async def test_turns_of_one_npc_run_in_order_and_npcs_run_concurrently(any_client: Client) -> None:
    c = any_client
    await create(c, "a", script=[{"text": "a1", "delayMs": 100}, {"text": "a2"}])
    await create(c, "b", script=[{"text": "b1", "delayMs": 100}])
    r1 = await c.call("npc/respond", {"npcId": "a", "prompt": "1"})
    r2 = await c.call("npc/respond", {"npcId": "a", "prompt": "2"})
    r3 = await c.call("npc/respond", {"npcId": "b", "prompt": "1"})
    for r in (r1, r2, r3):
        await c.wait_terminal(r["turnId"])
    order = [
        (e["method"], e["params"]["turnId"]) for e in c.events if e["method"] in ("turn/started", "turn/completed")
    ]
    assert order.index(("turn/completed", r1["turnId"])) < order.index(("turn/started", r2["turnId"]))
    # b started while a's first turn was still running
    assert order.index(("turn/started", r3["turnId"])) < order.index(("turn/completed", r1["turnId"]))
    texts = [
        m["content"]
        for t in (await c.call("npc/transcript", {"npcId": "a"}))["turns"]
        for m in t
        if m["role"] == "assistant"
    ]
    assert texts == ["a1", "a2"]


@req("T-SCHEMA-1")
async def test_structured_answer_streams_partial_json_and_follows_schema_order(any_client: Client) -> None:
    c = any_client
    schema = {
        "type": "object",
        "properties": {"reasoning": {"type": "string"}, "choice": {"enum": ["serve", "refuse"]}},
        "required": ["reasoning", "choice"],
    }
    await create(c, script=[{"json": {"choice": "serve", "reasoning": "They paid."}}])
    tid, done = await c.turn("keeper", "Serve them?", schema=schema)
    assert done["method"] == "turn/completed"
    assert list(done["params"]["json"]) == ["reasoning", "choice"]
    partial = [e for e in c.turn_events(tid) if e["method"] == "turn/partialJson"]
    assert len(partial) > 1 and partial[-1]["params"]["json"] == done["params"]["text"]


@req("T-SCHEMA-2")
async def test_invalid_schema_is_refused_with_invalid_schema(any_client: Client) -> None:
    c = any_client
    await create(c)
    with pytest.raises(RpcError) as e:
        await c.call("npc/respond", {"npcId": "keeper", "prompt": "x", "schema": {"type": "objekt"}})
    assert e.value.code == "invalid_schema" and e.value.error["code"] == -31007
    with pytest.raises(RpcError) as e:
        await c.call("npc/create", {"npcId": "x", "tools": [{"name": "t", "parameters": {"type": 5}}]})
    assert e.value.code == "invalid_schema"


@req("T-SCHEMA-3")
async def test_answer_that_breaks_the_schema_fails_the_turn(any_client: Client) -> None:
    c = any_client
    await create(c, script=[{"json": {"choice": "dance"}}])
    schema = {"type": "object", "properties": {"choice": {"enum": ["serve", "refuse"]}}, "required": ["choice"]}
    _, done = await c.turn("keeper", "?", schema=schema)
    assert done["params"]["error"]["code"] == "generation_failed"


@req("S-SAVE-1")
async def test_transcript_restores_exactly_in_another_npc(any_client: Client) -> None:
    c = any_client
    await create(
        c,
        script=[
            {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]},
            {"text": "Three."},
        ],
    )
    r = await c.call("npc/respond", {"npcId": "keeper", "prompt": "Ale?"})
    await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
    await c.call("npc/submit", {"npcId": "keeper", "callId": "c1", "output": 3})
    await c.wait_terminal(r["turnId"])
    save = await c.call("npc/transcript", {"npcId": "keeper"})
    assert (await c.call("npc/restore", {"save": save, "npcId": "copy"})) == {"npcId": "copy", "turns": 1}
    copy = await c.call("npc/transcript", {"npcId": "copy"})
    assert copy["turns"] == save["turns"] and copy["config"]["tools"] == save["config"]["tools"]


@req("E-ERR-1")
async def test_errors_carry_code_string_and_retryable(any_client: Client) -> None:
    c = any_client
    with pytest.raises(RpcError) as e:
        await c.call("npc/respond", {"npcId": "ghost", "prompt": "hi"})
    assert e.value.error["code"] == -31020 and e.value.error["data"] == {
        "code": "unknown_npc",
        "retryable": False,
        "npcId": "ghost",
    }
    with pytest.raises(RpcError) as e:
        await c.call("npc/dance", {})
    assert e.value.error["code"] == -32601
    with pytest.raises(RpcError) as e:
        await c.call("npc/create", {"npcId": "x", "bogus": 1})
    assert e.value.error["code"] == -32602 and e.value.code == "invalid_params"
    await create(c, "dup")
    with pytest.raises(RpcError) as e:
        await create(c, "dup")
    assert e.value.code == "npc_exists"


NULL_STEPS = [
    {"toolCalls": None},
    {"error": None},
    {"error": "busy", "message": None},
    {"toolCalls": [{"name": "check_inventory", "id": None}]},
    {"text": None},
    {"text": "hi", "warnings": None},
]


@req("S-SCRIPT-1")
async def test_a_null_in_a_script_step_is_refused_at_create_except_a_null_json_answer(any_client: Client) -> None:
    # null is not "absent": a step key given null is refused where the script is given, on
    # every engine (it once failed the turn later: internal_error, or a retryable
    # generation_failed, or a turn/failed whose message was null).
    c = any_client
    for k, step in enumerate(NULL_STEPS):
        with pytest.raises(RpcError) as e:
            await create(c, f"n{k}", script=[step])
        assert (e.value.code, e.value.error["data"].get("reason")) == ("invalid_params", "invalid_script"), step
        with pytest.raises(RpcError) as e:
            await c.call(
                "npc/restore", {"save": {"version": 1, "config": {"npcId": f"n{k}", "script": [step]}, "turns": []}}
            )
        assert e.value.code == "invalid_params", step
    assert (await c.call("npc/list", {}))["npcs"] == []
    await create(c, script=[{"json": None}, {"error": "busy"}])
    _, done = await c.turn("keeper", "Anything?")
    assert done["method"] == "turn/completed" and done["params"]["text"] == "null"
    _, failed = await c.turn("keeper", "And now?")
    err = failed["params"]["error"]
    assert err["code"] == "busy" and err["retryable"] is True and isinstance(err["message"], str) and err["message"]


@req("N-LIFE-1")
async def test_reset_list_and_delete(any_client: Client) -> None:
    c = any_client
    engine = (await create(c, script=[{"text": "Hi."}]))["engine"]
    await c.turn("keeper", "Hello")
    listed = (await c.call("npc/list", {}))["npcs"]
    assert listed == [{"npcId": "keeper", "engine": engine, "turns": 1, "busy": False, "queued": 0}]
    await c.call("npc/reset", {"npcId": "keeper"})
    assert (await c.call("npc/transcript", {"npcId": "keeper"}))["turns"] == []
    await c.call("npc/delete", {"npcId": "keeper"})
    assert (await c.call("npc/list", {}))["npcs"] == []
    tokens = await c.call("tokens/count", {"text": "three little words"})
    assert tokens["tokens"] > 0 and tokens["contextSize"] > 0


@req("T-TRIM-1")
async def test_long_conversations_are_trimmed_and_announced(any_client: Client) -> None:
    c = any_client
    await create(c, tools=[], options={"maxTokens": 16})
    for _ in range(40):
        tid, done = await c.turn("keeper", "word " * 60)
        assert done["method"] == "turn/completed"
    trims = [e for e in c.events if e["method"] == "turn/contextTrimmed"]
    assert trims, "a 4096-token window cannot hold 40 turns of 120+ words without trimming"
    last = trims[-1]["params"]
    assert last["droppedTurns"] > 0 and last["promptTokens"] <= last["contextSize"]
    # the saved transcript keeps everything; only what the model sees is trimmed
    assert len((await c.call("npc/transcript", {"npcId": "keeper"}))["turns"]) == 40


@req("P-MODEL-1")
async def test_a_model_that_is_no_path_is_invalid_params_and_the_bridge_serves_on(any_client: Client) -> None:
    """npc/create's model: empty, with a NUL (no file can be named so) or longer than a path
    can be is refused by name on every engine, before any engine is asked."""
    c = any_client
    for engine in ("llama", "native", "scripted"):
        for model in ("", "a\0b", "m" * 5000):
            with pytest.raises(RpcError) as e:
                await c.call("npc/create", {"npcId": "m", "engine": engine, "model": model})
            assert e.value.code == "invalid_params", (engine, model[:10])
    assert (await c.call("npc/create", {"npcId": "m", "engine": "scripted"}))["npcId"] == "m"
