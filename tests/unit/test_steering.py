"""The steering rules, checked exactly on what the scripted engine was asked."""

from __future__ import annotations

from bridge import ScriptedEngine
from tests.support.harness import DOOR_TOOL, INVENTORY_TOOL, Client, serve_in_memory


def call(id_: str, name: str = "check_inventory", **args: object) -> dict:
    return {"id": id_, "name": name, "arguments": args or {"item": "ale"}}


async def setup(client: Client, engine: ScriptedEngine, script: list, tools: list | None = None) -> None:
    await client.call(
        "npc/create",
        {
            "npcId": "n",
            "instructions": "Be brief.",
            "tools": tools if tools is not None else [INVENTORY_TOOL, DOOR_TOOL],
            "script": script,
        },
    )


async def answer_all(client: Client, turn_id: str, n: int) -> None:
    for i in range(n):
        ev = await client.wait_event("turn/toolCallRequested", turnId=turn_id, callId=f"c{i}")
        await client.call("npc/submit", {"npcId": "n", "callId": ev["params"]["callId"], "output": "ok"})


async def test_required_applies_to_the_first_step_only(client: Client, engine: ScriptedEngine) -> None:
    await setup(client, engine, [{"toolCalls": [call("c0")]}, {"toolCalls": [call("c1")]}, {"text": "done"}])
    r = await client.call("npc/respond", {"npcId": "n", "prompt": "?", "toolChoice": "required"})
    await answer_all(client, r["turnId"], 2)
    await client.wait_terminal(r["turnId"])
    assert [q.tool_mode for q in engine.requests] == ["required", "allowed", "allowed"]


async def test_named_tool_narrows_the_first_step_to_that_tool(client: Client, engine: ScriptedEngine) -> None:
    await setup(client, engine, [{"toolCalls": [call("c0", "open_door", door="north")]}, {"text": "open"}])
    r = await client.call("npc/respond", {"npcId": "n", "prompt": "?", "toolChoice": {"tool": "open_door"}})
    await answer_all(client, r["turnId"], 1)
    await client.wait_terminal(r["turnId"])
    first, second = engine.requests
    assert (first.tool_mode, [t.name for t in first.tools]) == ("required", ["open_door"])
    assert (second.tool_mode, [t.name for t in second.tools]) == ("allowed", ["check_inventory", "open_door"])


async def test_none_hides_the_tools_from_the_model_and_ignores_its_calls(
    client: Client, engine: ScriptedEngine
) -> None:
    await setup(client, engine, [{"text": "hi", "toolCalls": [call("c0")]}])
    tid, done = await client.turn("n", "?", toolChoice="none")
    (q,) = engine.requests
    assert q.tool_mode == "disallowed" and q.tools == []
    assert q.instructions == "Be brief.", "the instructions do not list the tools either"
    assert done["method"] == "turn/completed" and done["params"]["text"] == "hi"
    assert done["params"]["toolCalls"] == [] and any("disallowed" in w for w in done["params"]["warnings"])
    assert not [e for e in client.turn_events(tid) if e["method"].startswith("turn/toolCall")], (
        "the game never sees the call"
    )


async def test_spent_round_budget_disallows_and_hides_tools(client: Client, engine: ScriptedEngine) -> None:
    await setup(client, engine, [{"toolCalls": [call("c0")]}, {"text": "done"}])
    r = await client.call("npc/respond", {"npcId": "n", "prompt": "?", "maxToolRounds": 1})
    await answer_all(client, r["turnId"], 1)
    await client.wait_terminal(r["turnId"])
    assert [(q.tool_mode, len(q.tools)) for q in engine.requests] == [("allowed", 2), ("disallowed", 0)]


async def test_calls_over_the_call_budget_get_an_error_output(client: Client, engine: ScriptedEngine) -> None:
    await setup(client, engine, [{"toolCalls": [call("c0"), call("c1")]}, {"text": "done"}])
    r = await client.call("npc/respond", {"npcId": "n", "prompt": "?", "maxToolCalls": 1})
    await answer_all(client, r["turnId"], 1)
    done = await client.wait_terminal(r["turnId"])
    records = done["params"]["toolCalls"]
    assert records[0]["output"] == "ok"
    assert "budget" in records[1]["error"]
    assert not [
        e
        for e in client.turn_events(r["turnId"])
        if e["method"] == "turn/toolCallRequested" and e["params"]["callId"] == "c1"
    ]
    assert engine.requests[1].tool_mode == "disallowed"
    tool_msgs = [m for m in engine.requests[1].messages if m.role == "tool"]
    assert tool_msgs[1].is_error and "budget" in tool_msgs[1].content


async def test_unknown_tool_and_bad_arguments_become_error_outputs(client: Client, engine: ScriptedEngine) -> None:
    await setup(
        client,
        engine,
        [
            {
                "toolCalls": [
                    {"id": "x", "name": "fly", "arguments": {}},
                    {"id": "y", "name": "open_door", "arguments": {"door": 7}},
                ]
            },
            {"text": "hm"},
        ],
    )
    _, done = await client.turn("n", "?")
    errs = [t["error"] for t in done["params"]["toolCalls"]]
    assert "unknown tool" in errs[0] and "invalid arguments" in errs[1]


async def test_the_model_sees_tool_outputs_then_answers(client: Client, engine: ScriptedEngine) -> None:
    await setup(client, engine, [{"toolCalls": [call("c0")]}, {"text": "3 barrels"}])
    r = await client.call("npc/respond", {"npcId": "n", "prompt": "Ale?"})
    await answer_all(client, r["turnId"], 1)
    await client.wait_terminal(r["turnId"])
    roles = [(m.role, m.content) for m in engine.requests[1].messages]
    assert roles == [("user", "Ale?"), ("assistant", ""), ("tool", "ok")]


async def test_text_after_a_tool_round_is_announced_as_a_reset(client: Client, engine: ScriptedEngine) -> None:
    await setup(client, engine, [{"text": "Let me look.", "toolCalls": [call("c0")]}, {"text": "Three."}])
    r = await client.call("npc/respond", {"npcId": "n", "prompt": "Ale?"})
    await answer_all(client, r["turnId"], 1)
    done = await client.wait_terminal(r["turnId"])
    deltas = [e["params"] for e in client.turn_events(r["turnId"]) if e["method"] == "turn/textDelta"]
    resets = [d for d in deltas if d["isReset"]]
    assert len(resets) == 1 and resets[0]["text"] == "Three."
    assert done["params"]["text"] == "Three."


async def test_trimming_drops_oldest_complete_turns_from_what_the_model_sees() -> None:
    engine = ScriptedEngine(context_size=300)
    async with serve_in_memory(engine) as (server, client):
        await client.initialize()
        await client.call("npc/create", {"npcId": "t", "instructions": "Be brief.", "options": {"maxTokens": 20}})
        for i in range(12):
            _, done = await client.turn("t", f"turn {i} " + "blah " * 20)
            assert done["method"] == "turn/completed"
        last = engine.requests[-1]
        assert last.messages[-1].content.startswith("turn 11")
        assert last.messages[0].content.startswith("turn ") and not last.messages[0].content.startswith("turn 0 ")
        assert engine.count_tokens(last.instructions, last.messages, []) <= 300 - 20
        assert len(server.npcs["t"].turns) == 12  # history itself keeps every turn
        trims = [e["params"] for e in client.events if e["method"] == "turn/contextTrimmed"]
        assert trims and all(t["promptTokens"] <= t["contextSize"] for t in trims)
        _, done = await client.turn("t", "x " * 400)  # cannot fit even alone
        assert done["params"]["error"]["code"] == "context_size_exceeded"
        data = done["params"]["error"]["data"]  # what the game needs to shorten it
        assert data["contextSize"] == 300 and data["promptTokens"] > 300 - 20


async def test_the_first_delta_after_a_tool_only_step_is_a_reset_too(client: Client, engine: ScriptedEngine) -> None:
    # protocol.md: isReset is true on the first delta of every step after a tool round,
    # whether or not the step before showed text
    await setup(client, engine, [{"toolCalls": [call("c0")]}, {"text": "Three barrels."}])
    r = await client.call("npc/respond", {"npcId": "n", "prompt": "Ale?"})
    await answer_all(client, r["turnId"], 1)
    await client.wait_terminal(r["turnId"])
    deltas = [e["params"] for e in client.turn_events(r["turnId"]) if e["method"] == "turn/textDelta"]
    assert [d["isReset"] for d in deltas] == [True, False]
