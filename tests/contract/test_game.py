"""The game layer: world state and lore, decisions, guardrail policies, prewarm,
NPC-to-NPC speakers, tool_or_answer. Run in-process and through the real ``oam-bridge``
subprocess on the scripted engine and on the native engine (``any_client``)."""

from __future__ import annotations

import pytest

from tests.support.harness import INVENTORY_TOOL, Client, RpcError

req = pytest.mark.req
OPTIONS = [{"name": "let_in", "description": "open the gate"}, {"name": "question", "description": "ask who they are"}]


async def create(c: Client, npc_id: str = "guard", script: list | None = None, **kw) -> dict:
    params = {"npcId": npc_id, "persona": {"name": "Bram", "role": "the gate guard"}, **kw}
    if script is not None:
        params["script"] = script
    return await c.call("npc/create", params)


async def transcript_turns(c: Client, npc_id: str) -> list:
    return (await c.call("npc/transcript", {"npcId": npc_id}))["turns"]


def methods(c: Client, turn_id: str) -> list[str]:
    return [e["method"] for e in c.turn_events(turn_id)]


# ---- world state ----


@req("G-WORLD-1")
async def test_world_set_get_delete_keep_a_revision_and_a_scope(any_client: Client) -> None:
    c = any_client
    await create(c, tags=["gate"])
    await create(c, "keeper", tags=["tavern"])
    assert await c.call("world/set", {"key": "weather", "value": "storm"}) == {"revision": 1}
    assert await c.call("world/set", {"key": "gate", "value": {"open": False}, "tags": ["gate"]}) == {"revision": 2}
    assert await c.call("world/set", {"key": "secret", "value": 7, "npcIds": ["keeper"]}) == {"revision": 3}
    everything = await c.call("world/get", {})
    assert everything["revision"] == 3
    assert [f["key"] for f in everything["facts"]] == ["gate", "secret", "weather"], "sorted by key"
    assert everything["facts"][0] == {
        "key": "gate",
        "value": {"open": False},
        "npcIds": None,
        "tags": ["gate"],
        "lore": False,
    }
    guard = await c.call("world/get", {"npcId": "guard"})
    assert [f["key"] for f in guard["facts"]] == ["gate", "weather"]
    keeper = await c.call("world/get", {"npcId": "keeper"})
    assert [f["key"] for f in keeper["facts"]] == ["secret", "weather"]
    await c.call("npc/setTags", {"npcId": "keeper", "tags": ["tavern", "gate"]})
    assert [f["key"] for f in (await c.call("world/get", {"npcId": "keeper"}))["facts"]] == [
        "gate",
        "secret",
        "weather",
    ]
    assert (await c.call("npc/transcript", {"npcId": "keeper"}))["config"]["tags"] == ["tavern", "gate"], (
        "tags are saved"
    )
    assert await c.call("world/delete", {"key": "weather"}) == {"revision": 4, "deleted": True}
    assert await c.call("world/delete", {"key": "weather"}) == {"revision": 4, "deleted": False}
    with pytest.raises(RpcError) as e:
        await c.call("world/set", {"key": "x", "value": None})
    assert e.value.code == "invalid_params" and e.value.data["reason"] == "null_value"
    with pytest.raises(RpcError) as e:
        await c.call("world/set", {"key": "big", "value": "x" * 20000})
    assert e.value.code == "limit_reached" and e.value.data["limit"] == "maxWorldFactBytes"
    with pytest.raises(RpcError) as e:
        await c.call("world/get", {"npcId": "ghost"})
    assert e.value.code == "unknown_npc"
    assert (await c.call("world/get", {}))["revision"] == 4, "refused changes change nothing"


@req("G-WORLD-2")
async def test_the_world_bound_is_refused_whole_and_the_world_is_unchanged(any_client: Client) -> None:
    c = any_client
    value = "y" * 15000
    n = 0
    with pytest.raises(RpcError) as e:
        for n in range(10):
            await c.call("world/set", {"key": f"k{n}", "value": value})
    assert e.value.code == "limit_reached" and e.value.data["limit"] == "maxWorldBytes"
    assert n == 4, "64 KiB holds four facts of 15,000 bytes"
    world = await c.call("world/get", {})
    assert world["revision"] == 4 and len(world["facts"]) == 4
    # Replacing a fact counts its new size, not both.
    assert await c.call("world/set", {"key": "k0", "value": value}) == {"revision": 5}


@req("G-WORLD-3")
async def test_facts_count_in_the_npcs_prompt_tokens_only_where_visible(any_client: Client) -> None:
    c = any_client
    await create(c, tags=["gate"])
    before = (await c.call("tokens/count", {"npcId": "guard", "text": ""}))["promptTokens"]
    await c.call("world/set", {"key": "tavern rumour", "value": "the brewer has a new cask " * 5, "tags": ["tavern"]})
    assert (await c.call("tokens/count", {"npcId": "guard", "text": ""}))["promptTokens"] == before, (
        "out of scope: not in the prompt"
    )
    await c.call("world/set", {"key": "gate rumour", "value": "the captain is away " * 5, "tags": ["gate"]})
    assert (await c.call("tokens/count", {"npcId": "guard", "text": ""}))["promptTokens"] > before


@req("G-WORLD-4")
async def test_facts_follow_the_persona_sorted_and_a_change_applies_from_the_next_step(any_client: Client) -> None:
    c = any_client
    tool = {**INVENTORY_TOOL}
    await create(
        c,
        tools=[tool],
        tags=["gate"],
        script=[
            {"echo": "instructions"},
            {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]},
            {"echo": "instructions"},
        ],
    )
    await c.call("world/set", {"key": "weather", "value": "storm"})
    await c.call("world/set", {"key": "gate", "value": {"open": False}, "tags": ["gate"]})
    await c.call("world/set", {"key": "elsewhere", "value": "not for the guard", "npcIds": ["keeper"]})
    tid, done = await c.turn("guard", "Status?")
    text = done["params"]["text"]
    assert text.startswith("You are Bram, the gate guard."), "the persona comes first"
    assert text.endswith('Facts you know now:\n- gate: {"open":false}\n- weather: storm'), text
    assert "elsewhere" not in text
    assert done["params"]["worldRevision"] == 3
    r = await c.call("npc/respond", {"npcId": "guard", "prompt": "Any ale?"})
    await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
    # While the call waits, the world changes: the next step sees it.
    assert await c.call("world/set", {"key": "bell", "value": "ringing"}) == {"revision": 4}
    await c.call("npc/submit", {"npcId": "guard", "callId": "c1", "output": 3})
    done = await c.wait_terminal(r["turnId"])
    assert "- bell: ringing\n- gate:" in done["params"]["text"]
    assert done["params"]["worldRevision"] == 4


@req("G-LORE-1")
async def test_lore_is_not_in_the_prompt_and_recall_is_answered_by_the_bridge(any_client: Client) -> None:
    c = any_client
    await c.call("world/set", {"key": "the old keep", "value": "Built by the old king.", "lore": True})
    await c.call(
        "world/set", {"key": "the river", "value": {"name": "Aln", "fords": 2}, "lore": True, "tags": ["river"]}
    )
    await create(
        c,
        tools=[INVENTORY_TOOL],
        script=[
            {
                "toolCalls": [
                    {"id": "r1", "name": "recall", "arguments": {"topic": "the old keep"}},
                    {"id": "r2", "name": "recall", "arguments": {"topic": "the river"}},
                ]
            },
            {"text": "The old king built it."},
        ],
    )
    tid, done = await c.turn("guard", "Who built the keep?")
    assert done["method"] == "turn/completed", done
    assert "turn/toolCallRequested" not in methods(c, tid), "the game is never asked"
    completed = {
        e["params"]["callId"]: e["params"] for e in c.turn_events(tid) if e["method"] == "turn/toolCallCompleted"
    }
    assert completed["r1"]["output"] == "Built by the old king."
    # "the river" is scoped to a tag the guard does not carry: not a topic it can recall.
    assert "invalid arguments" in completed["r2"]["error"]
    assert done["params"]["toolCalls"][0] == {
        "callId": "r1",
        "name": "recall",
        "arguments": {"topic": "the old keep"},
        "output": "Built by the old king.",
    }
    c.assert_well_formed(tid)
    with pytest.raises(RpcError) as e:
        await create(c, "bad", tools=[{"name": "recall", "parameters": {"type": "object"}}])
    assert e.value.code == "invalid_params" and e.value.data["reason"] == "reserved_tool_name"


@req("G-LORE-2")
async def test_lore_facts_stay_out_of_the_rendered_facts(any_client: Client) -> None:
    c = any_client
    await c.call("world/set", {"key": "the old keep", "value": "Built by the old king.", "lore": True})
    await c.call("world/set", {"key": "weather", "value": "fog"})
    await create(c, script=[{"echo": "instructions"}])
    _, done = await c.turn("guard", "Hm?")
    assert done["params"]["text"].endswith("Facts you know now:\n- weather: fog")
    assert "old king" not in done["params"]["text"]


# ---- decisions ----


@req("G-DECIDE-1")
async def test_a_decision_picks_an_option_reasoning_first_and_stays_out_of_the_history(any_client: Client) -> None:
    c = any_client
    await create(
        c,
        script=[
            {"json": {"reasoning": "It is late.", "choice": "question"}},
            {"json": {"reasoning": "Fine.", "choice": "let_in"}},
            {"json": {"reasoning": "Hmm.", "choice": "flee"}},
        ],
    )
    r = await c.call(
        "npc/decide", {"npcId": "guard", "situation": "A stranger walks up after dark.", "options": OPTIONS}
    )
    done = await c.wait_terminal(r["turnId"])
    assert done["method"] == "turn/completed", done
    assert done["params"]["json"] == {"reasoning": "It is late.", "choice": "question"}
    assert list(done["params"]["json"]) == ["reasoning", "choice"]
    started = c.turn_events(r["turnId"])[0]["params"]
    assert started["kind"] == "decide"
    assert started["prompt"] == (
        "A stranger walks up after dark.\n\nChoose one option:\n- let_in: open the gate\n- question: ask who they are"
    )
    assert "turn/partialJson" in methods(c, r["turnId"])
    assert await transcript_turns(c, "guard") == [], "a decision does not enter the history by default"
    r = await c.call("npc/decide", {"npcId": "guard", "situation": "Again.", "options": OPTIONS, "remember": True})
    done = await c.wait_terminal(r["turnId"])
    assert done["params"]["json"]["choice"] == "let_in"
    assert len(await transcript_turns(c, "guard")) == 1, "remember: true keeps it"
    r = await c.call("npc/decide", {"npcId": "guard", "situation": "Once more.", "options": OPTIONS})
    done = await c.wait_terminal(r["turnId"])
    assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "generation_failed", (
        "a choice outside the options"
    )
    c.assert_well_formed(r["turnId"])


@req("G-DECIDE-2")
async def test_decision_options_with_arguments_and_without_reasoning(any_client: Client) -> None:
    c = any_client
    bell = {
        "name": "call_help",
        "description": "ring the bell",
        "parameters": {
            "type": "object",
            "properties": {"urgency": {"type": "string", "enum": ["low", "high"]}},
            "required": ["urgency"],
        },
    }
    await create(
        c,
        script=[
            {"json": {"choice": "call_help", "arguments": {"urgency": "high"}}},
            {"json": {"choice": "call_help", "arguments": {"urgency": "panic"}}},
            {"json": {"choice": "question"}},
        ],
    )
    options = [*OPTIONS, bell]
    r = await c.call("npc/decide", {"npcId": "guard", "situation": "Smoke!", "options": options, "reasoning": False})
    done = await c.wait_terminal(r["turnId"])
    assert done["params"]["json"] == {"choice": "call_help", "arguments": {"urgency": "high"}}
    r = await c.call("npc/decide", {"npcId": "guard", "situation": "Smoke!", "options": options, "reasoning": False})
    done = await c.wait_terminal(r["turnId"])
    assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "generation_failed", (
        "arguments outside the option's schema"
    )
    r = await c.call("npc/decide", {"npcId": "guard", "situation": "Quiet.", "options": options, "reasoning": False})
    assert (await c.wait_terminal(r["turnId"]))["params"]["json"] == {"choice": "question"}
    for bad, why in (
        ({"options": []}, "no options"),
        ({"options": [OPTIONS[0], OPTIONS[0]]}, "repeated names"),
        ({"options": [{"name": "x", "parameters": {"type": "string"}}]}, "arguments that are not an object"),
    ):
        with pytest.raises(RpcError) as e:
            await c.call("npc/decide", {"npcId": "guard", "situation": "?", **bad})
        assert e.value.code in ("invalid_params", "invalid_schema"), why


# ---- tool_or_answer ----


@req("G-ROUTE-1")
async def test_tool_or_answer_respond_directly_never_reaches_the_game(any_client: Client) -> None:
    c = any_client
    await create(
        c,
        tools=[INVENTORY_TOOL],
        script=[
            {"toolCalls": [{"id": "d1", "name": "respond_directly", "arguments": {}}]},
            {"text": "Evening, traveller."},
            {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]},
            {"text": "Three barrels."},
        ],
    )
    tid, done = await c.turn("guard", "Good evening!", toolChoice="tool_or_answer")
    assert done["method"] == "turn/completed", done
    assert (
        done["params"]["text"] == "Evening, traveller."
        and done["params"]["toolCalls"] == []
        and done["params"]["steps"] == 2
    )
    assert not [m for m in methods(c, tid) if m.startswith("turn/toolCall")]
    assert (await transcript_turns(c, "guard"))[-1] == [
        {"role": "user", "content": "Good evening!"},
        {"role": "assistant", "content": "Evening, traveller."},
    ]
    r = await c.call("npc/respond", {"npcId": "guard", "prompt": "Any ale?", "toolChoice": "tool_or_answer"})
    await c.wait_event("turn/toolCallRequested", turnId=r["turnId"], callId="c1")
    await c.call("npc/submit", {"npcId": "guard", "callId": "c1", "output": 3})
    done = await c.wait_terminal(r["turnId"])
    assert done["params"]["text"] == "Three barrels." and [t["name"] for t in done["params"]["toolCalls"]] == [
        "check_inventory"
    ]


# ---- guardrails ----

FALLBACKS = {"guardrailViolation": ["Let's talk of other things.", "I'd rather not say."], "refusal": ["No."]}


@req("G-GUARD-1")
async def test_guardrail_policies_fail_fallback_in_turn_and_the_npc_keeps_working(any_client: Client) -> None:
    c = any_client
    blocked = {"error": "guardrail_violation", "message": "blocked"}
    await create(
        c,
        fallbacks=FALLBACKS,
        script=[blocked, blocked, blocked, {"error": "refusal", "message": "no"}, {"text": "Hello."}, blocked],
    )
    _, done = await c.turn("guard", "x")
    assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "guardrail_violation", (
        "fail is the default"
    )
    tid, done = await c.turn("guard", "y", guardrail="fallback")
    p = done["params"]
    assert (
        done["method"] == "turn/completed"
        and p["text"] == "Let's talk of other things."
        and p["finishReason"] == "fallback"
    )
    assert p["warnings"] == ["guardrail_violation: blocked"]
    deltas = [e["params"] for e in c.turn_events(tid) if e["method"] == "turn/textDelta"]
    assert [d["delta"] for d in deltas] == ["Let's talk of other things."]
    c.assert_well_formed(tid)
    _, done = await c.turn("guard", "z", guardrail="fallback")
    assert done["params"]["text"] == "I'd rather not say.", "the lines are used in turn"
    _, done = await c.turn("guard", "w", guardrail="fallback")
    assert done["params"]["text"] == "No." and done["params"]["warnings"] == ["refusal: no"]
    assert await transcript_turns(c, "guard") == [], "a fallback turn does not enter the history"
    _, done = await c.turn("guard", "hi", guardrail="fallback")
    assert done["params"]["text"] == "Hello." and done["params"]["finishReason"] == "stop"
    await create(c, "plain", script=[blocked])
    _, done = await c.turn("plain", "q", guardrail="fallback")
    assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "guardrail_violation", (
        "no fallback line: it fails"
    )


@req("G-GUARD-2")
async def test_guardrail_retry_runs_a_schema_turn_once_more_as_text(any_client: Client) -> None:
    c = any_client
    blocked = {"error": "guardrail_violation", "message": "blocked"}
    schema = {"type": "object", "properties": {"line": {"type": "string"}}, "required": ["line"]}
    await create(c, fallbacks=FALLBACKS, script=[blocked, {"text": "Have at you!"}, blocked, blocked])
    tid, done = await c.turn("guard", "Challenge me.", schema=schema, guardrail="retry")
    p = done["params"]
    assert done["method"] == "turn/completed", done
    assert (
        p["text"] == "Have at you!" and p["json"] is None and p["finishReason"] == "retried_as_text" and p["steps"] == 2
    )
    assert p["warnings"] == ["guardrail_violation: blocked"]
    assert (await transcript_turns(c, "guard"))[-1][-1] == {"role": "assistant", "content": "Have at you!"}
    _, done = await c.turn("guard", "Again.", schema=schema, guardrail="retry")
    assert done["params"]["finishReason"] == "fallback" and done["params"]["text"] == "Let's talk of other things."
    assert done["params"]["warnings"] == ["guardrail_violation: blocked"]


# ---- prewarm and speakers ----


@req("G-PREWARM-1")
async def test_prewarm_is_a_turn_that_changes_nothing(any_client: Client) -> None:
    c = any_client
    await create(c, script=[{"text": "First line."}])
    r = await c.call("npc/prewarm", {"npcId": "guard"})
    done = await c.wait_terminal(r["turnId"])
    assert done["method"] == "turn/completed"
    assert (done["params"]["text"], done["params"]["steps"], done["params"]["finishReason"]) == ("", 0, "prewarmed")
    assert methods(c, r["turnId"]) == ["turn/started", "turn/completed"]
    assert c.turn_events(r["turnId"])[0]["params"]["kind"] == "prewarm"
    assert await transcript_turns(c, "guard") == []
    _, done = await c.turn("guard", "Hello")
    assert done["params"]["text"] == "First line.", "a prewarm plays no script step"
    with pytest.raises(RpcError) as e:
        await c.call("npc/prewarm", {"npcId": "ghost"})
    assert e.value.code == "unknown_npc"


@req("G-PREWARM-2")
async def test_a_prewarm_for_a_speaker_says_who_and_how_the_line_starts(any_client: Client) -> None:
    c = any_client
    await create(c, script=[{"text": "Aye."}])
    await create(c, "keeper", persona={"name": "Greta"})
    r = await c.call("npc/prewarm", {"npcId": "guard", "speaker": "keeper", "promptPrefix": "Storm"})
    done = await c.wait_terminal(r["turnId"])
    assert done["params"]["finishReason"] == "prewarmed"
    started = c.turn_events(r["turnId"])[0]["params"]
    assert (started["kind"], started["speaker"], started["prompt"]) == ("prewarm", "Greta", "Storm")
    assert await transcript_turns(c, "guard") == []
    for bad in ({"speaker": 5}, {"promptPrefix": ["x"]}, {"prefix": "x"}):
        with pytest.raises(RpcError) as e:
            await c.call("npc/prewarm", {"npcId": "guard", **bad})
        assert e.value.code == "invalid_params", bad
    _, done = await c.turn("guard", "Storm coming?", speaker="keeper")
    assert done["params"]["text"] == "Aye.", "a prewarm plays no script step"


@req("G-SPEAKER-1")
async def test_another_npc_speaks_a_prompt_and_the_transcript_keeps_its_name(any_client: Client) -> None:
    c = any_client
    await create(c, script=[{"text": "Aye, a storm."}, {"text": "Good."}])
    await create(c, "keeper", persona={"name": "Greta"})
    tid, done = await c.turn("guard", "Storm coming?", speaker="keeper")
    assert c.turn_events(tid)[0]["params"]["speaker"] == "Greta", "an NPC id stands for its persona's name"
    assert c.turn_events(tid)[0]["params"]["kind"] == "respond"
    tid, _ = await c.turn("guard", "Who goes there?", speaker="a wandering bard")
    assert c.turn_events(tid)[0]["params"]["speaker"] == "a wandering bard"
    turns = await transcript_turns(c, "guard")
    assert turns[0][0] == {"role": "user", "content": "Storm coming?", "name": "Greta"}
    assert turns[1][0]["name"] == "a wandering bard"
    tid, _ = await c.turn("guard", "Hi")
    assert c.turn_events(tid)[0]["params"]["speaker"] is None, "the player"


@req("G-SPEAKER-2")
async def test_the_model_reads_who_speaks(any_client: Client) -> None:
    c = any_client
    await create(c, script=[{"echo": "prompt"}, {"echo": "prompt"}])
    await create(c, "keeper", persona=None, instructions="You keep the tavern.")
    _, done = await c.turn("guard", "Storm coming?", speaker="keeper")
    assert done["params"]["text"] == "keeper: Storm coming?", "an NPC without a persona: its id"
    _, done = await c.turn("guard", "Storm coming?")
    assert done["params"]["text"] == "Storm coming?"


@req("G-GUARD-3")
async def test_a_fallback_after_shown_text_replaces_it_and_keeps_the_tool_records(any_client: Client) -> None:
    c = any_client
    blocked = {"error": "refusal", "message": "no"}
    await create(
        c,
        tools=[INVENTORY_TOOL],
        fallbacks=FALLBACKS,
        script=[
            {
                "text": "Let me look.",
                "toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}],
            },
            blocked,
        ],
    )
    r = await c.call("npc/respond", {"npcId": "guard", "prompt": "Any ale?", "guardrail": "fallback"})
    await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
    await c.call("npc/submit", {"npcId": "guard", "callId": "c1", "output": 3})
    done = await c.wait_terminal(r["turnId"])
    assert (
        done["params"]["text"] == "No."
        and done["params"]["finishReason"] == "fallback"
        and done["params"]["steps"] == 2
    )
    assert [t["callId"] for t in done["params"]["toolCalls"]] == ["c1"], "the game ran the call: it stays on record"
    deltas = [e["params"] for e in c.turn_events(r["turnId"]) if e["method"] == "turn/textDelta"]
    assert deltas[-1] == {**deltas[-1], "delta": "No.", "text": "No.", "isReset": True}, "replaces what was shown"
    c.assert_well_formed(r["turnId"])
