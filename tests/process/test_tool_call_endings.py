"""Every tool call the game is asked to run ends exactly once (``turn/toolCallCompleted`` or
``turn/toolCallWithdrawn``), whatever ends its turn and in whatever order the game's answers
and the turn's end arrive; through the real ``oam-bridge`` subprocess over real pipes.

Each test failed on commit d14face, before the fixes; ``OAM_BRIDGE_ROOT=<a checkout of it>``
runs this file's bridges from that tree (tests/support/harness.py). Time limits here are hang
guards, not performance checks.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from tests.support.harness import INIT, INVENTORY_TOOL, Proc, bridge, error_code, note, rpc, words

CALLS = [{"id": f"c{i}", "name": "check_inventory", "arguments": {"item": "ale"}} for i in (1, 2, 3)]


def assert_every_requested_call_ends_once(b: Proc, turn_id: str) -> dict[str, str]:
    """Every call the turn requested ends with exactly one of toolCallCompleted and
    toolCallWithdrawn, after its request; returns each call's ending event."""
    requested: list[str] = []
    ends: dict[str, list[str]] = {}
    for e in b.turn_events(turn_id):
        call_id = e["params"].get("callId")
        if e["method"] == "turn/toolCallRequested":
            requested.append(call_id)
        elif e["method"] in ("turn/toolCallCompleted", "turn/toolCallWithdrawn") and call_id in requested:
            ends.setdefault(call_id, []).append(e["method"])
    assert len(set(requested)) == len(requested), f"a call was requested twice: {requested}"
    wrong = {c: ends.get(c, []) for c in requested if len(ends.get(c, [])) != 1}
    assert not wrong, f"turn {turn_id}: calls without exactly one ending event: {wrong}"
    return {c: ends[c][0] for c in requested}


async def test_submit_after_cancel_in_one_write_is_unknown_and_the_call_is_withdrawn() -> None:
    async with bridge() as b:
        await b.send(INIT)
        await b.request(
            2,
            "npc/create",
            {
                "npcId": "keeper",
                "tools": [INVENTORY_TOOL],
                "script": [
                    {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]},
                    {"text": "Three."},
                ],
            },
        )
        turn_id = (await b.request(3, "npc/respond", {"npcId": "keeper", "prompt": "Ale?"}))["turnId"]
        await b.wait_event("turn/toolCallRequested", turnId=turn_id, callId="c1")
        await b.send(
            rpc(4, "npc/cancel", {"npcId": "keeper"}),
            rpc(5, "npc/submit", {"npcId": "keeper", "callId": "c1", "output": {"count": 3}}),
        )
        assert (await b.result(4))["cancelled"] == [turn_id]
        assert error_code(await b.response(5)) == "unknown_tool_call"
        done = await b.wait_terminal(turn_id)
        assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "cancelled"
        ends = [
            e
            for e in b.turn_events(turn_id)
            if e["method"] in ("turn/toolCallCompleted", "turn/toolCallWithdrawn") and e["params"]["callId"] == "c1"
        ]
        assert [(e["method"], e["params"].get("reason")) for e in ends] == [("turn/toolCallWithdrawn", "cancelled")]
        b.assert_well_formed(turn_id)


async def test_a_failed_restore_leaves_the_npc_and_its_running_turn_alone() -> None:
    bad_save = {
        "version": 1,
        "config": {
            "npcId": "a",
            "tools": [{"name": "t", "parameters": {"type": "object"}}, {"name": "t", "parameters": {"type": "object"}}],
        },
        "turns": [],
    }
    async with bridge() as b:
        await b.send(INIT)
        await b.request(
            2,
            "npc/create",
            {
                "npcId": "a",
                "tools": [INVENTORY_TOOL],
                "script": [
                    {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]},
                    {"text": "Three left."},
                    {"text": "Again."},
                ],
            },
        )
        turn_id = (await b.request(3, "npc/respond", {"npcId": "a", "prompt": "Ale?"}))["turnId"]
        await b.wait_event("turn/toolCallRequested", turnId=turn_id, callId="c1")
        await b.send(rpc(4, "npc/restore", {"save": bad_save}))
        assert error_code(await b.response(4)) == "invalid_params"
        assert (await b.request(5, "npc/submit", {"npcId": "a", "callId": "c1", "output": {"count": 3}})) == {
            "accepted": True
        }
        done = await b.wait_terminal(turn_id)
        assert done["method"] == "turn/completed" and done["params"]["text"] == "Three left."
        second = (await b.request(6, "npc/respond", {"npcId": "a", "prompt": "And now?"}))["turnId"]
        assert (await b.wait_terminal(second))["params"]["text"] == "Again."
        save = await b.request(7, "npc/transcript", {"npcId": "a"})
        assert len(save["turns"]) == 2 and [t["name"] for t in save["config"]["tools"]] == ["check_inventory"]


# found by the 1M-input fuzz run
async def test_a_call_answered_after_its_timeout_fell_due_still_ends_when_the_turn_is_cancelled() -> None:
    # Found by the 1M-input fuzz run (three calls of one turn neither completed nor
    # withdrawn). A call's timeout falls due while the event loop is busy; in the next
    # scheduler pass the reader runs before the call's task (trio orders a pass's tasks
    # either way round, so each round here hits it one time in two): the game's submit is
    # accepted, then npc/cancel ends the turn, and the task, woken by its timeout, saw the
    # turn's cancellation with its call answered and put no ending event at all.
    slow_tool = {
        "name": "slow",
        "parameters": {
            "type": "object",
            "properties": {f"p{i}": {"type": "string", "minLength": 1} for i in range(500)},
        },
    }
    async with bridge("--poll-us", "0", guard=60) as b:
        await b.send(INIT)
        for k in range(12):
            npc = f"a{k}"
            await b.request(
                f"c{k}",
                "npc/create",
                {
                    "npcId": npc,
                    "tools": [INVENTORY_TOOL],
                    "script": [{"toolCalls": CALLS}, {"text": "Three.", "delayMs": 5000}],
                },
            )
            turn_id = (await b.request(f"r{k}", "npc/respond", {"npcId": npc, "prompt": "Ale?", "toolTimeoutMs": 100}))[
                "turnId"
            ]
            for c in CALLS:
                await b.wait_event("turn/toolCallRequested", turnId=turn_id, callId=c["id"])
            # a create whose schema check keeps the loop busy past the calls' timeout
            await b.send(rpc(f"slow{k}", "npc/create", {"npcId": f"slow{k}", "tools": [slow_tool]}))
            await trio.sleep(0.05)
            submits = [
                rpc(f"s{k}.{c['id']}", "npc/submit", {"npcId": npc, "callId": c["id"], "output": 3}) for c in CALLS
            ]
            await b.send(*submits, rpc(f"x{k}", "npc/cancel", {"npcId": npc}))
            done = await b.wait_terminal(turn_id)
            assert done["method"] == "turn/failed"
            b.assert_well_formed(turn_id)
            ends = assert_every_requested_call_ends_once(b, turn_id)
            for c in CALLS:
                accepted = "result" in await b.response(f"s{k}.{c['id']}")
                assert ends[c["id"]] == ("turn/toolCallCompleted" if accepted else "turn/toolCallWithdrawn"), (
                    k,
                    c["id"],
                    accepted,
                    ends,
                )


@pytest.mark.parametrize("how", ["cancel", "delete", "reset", "restore", "shutdown", "stdin_eof", "exit"])
async def test_every_requested_call_of_a_batch_ends_once_whatever_ends_the_turn(how: str) -> None:
    # A batch of four: three the game is asked to run, one whose arguments break the schema
    # (the model gets an error output, the game no request). The game answers one; then the
    # turn is ended while the other two wait.
    calls = [*CALLS, {"id": "bad", "name": "check_inventory", "arguments": {"item": 5}}]
    ending = {
        "cancel": [rpc("end", "npc/cancel", {"npcId": "a"})],
        "delete": [rpc("end", "npc/delete", {"npcId": "a"})],
        "reset": [rpc("end", "npc/reset", {"npcId": "a"})],
        "restore": [rpc("end", "npc/restore", {"save": {"version": 1, "config": {"npcId": "a"}, "turns": []}})],
        "shutdown": [rpc("end", "shutdown")],
        "stdin_eof": [],
        "exit": [note("exit")],
    }[how]
    async with bridge() as b:
        await b.send(INIT)
        await b.request(
            1,
            "npc/create",
            {"npcId": "a", "tools": [INVENTORY_TOOL], "script": [{"toolCalls": calls}, {"text": "Three."}]},
        )
        turn_id = (await b.request(2, "npc/respond", {"npcId": "a", "prompt": "Ale?", "toolTimeoutMs": 0}))["turnId"]
        for c in CALLS:
            await b.wait_event("turn/toolCallRequested", turnId=turn_id, callId=c["id"])
        assert await b.request(3, "npc/submit", {"npcId": "a", "callId": "c2", "output": 3}) == {"accepted": True}
        await b.wait_event("turn/toolCallCompleted", turnId=turn_id, callId="c2")
        await b.send(*ending)
        if how in ("stdin_eof", "exit"):
            await b.close_stdin()
        done = await b.wait_terminal(turn_id)
        assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "cancelled"
        b.assert_well_formed(turn_id)
        reason = "cancelled" if how in ("cancel", "reset") else "turn_ended"
        ends = assert_every_requested_call_ends_once(b, turn_id)
        assert ends == {"c1": "turn/toolCallWithdrawn", "c2": "turn/toolCallCompleted", "c3": "turn/toolCallWithdrawn"}
        withdrawn = [e["params"]["reason"] for e in b.turn_events(turn_id) if e["method"] == "turn/toolCallWithdrawn"]
        assert withdrawn == [reason, reason]
        bad = [e["params"] for e in b.turn_events(turn_id) if e["params"].get("callId") == "bad"]
        assert [(p["error"] or "")[:17] for p in bad] == ["invalid arguments"], (
            "the invalid call: one completed event, with its error"
        )


@pytest.mark.parametrize("then", ["error_step", "context_exceeded", "schema_broken"])
async def test_every_requested_call_ends_once_when_the_turn_fails_after_the_round(then: str) -> None:
    # The step after the round fails the turn: every call of the round had ended before it.
    respond: dict[str, Any] = {"npcId": "a", "prompt": "Ale?"}
    output: Any = 3
    next_step: dict[str, Any] = {"text": "Three."}
    if then == "error_step":
        next_step = {"error": "refusal"}
    elif then == "context_exceeded":
        output = words(5000)  # the next step's prompt no longer fits the 4,096-token window
    else:
        respond["schema"] = {"type": "object"}
    code = {"error_step": "refusal", "context_exceeded": "context_size_exceeded", "schema_broken": "generation_failed"}[
        then
    ]
    async with bridge() as b:
        await b.send(INIT)
        await b.request(
            1, "npc/create", {"npcId": "a", "tools": [INVENTORY_TOOL], "script": [{"toolCalls": CALLS}, next_step]}
        )
        turn_id = (await b.request(2, "npc/respond", respond))["turnId"]
        for c in CALLS:
            await b.wait_event("turn/toolCallRequested", turnId=turn_id, callId=c["id"])
        await b.send(
            *[rpc(f"s{c['id']}", "npc/submit", {"npcId": "a", "callId": c["id"], "output": output}) for c in CALLS]
        )
        done = await b.wait_terminal(turn_id)
        assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == code
        b.assert_well_formed(turn_id)
        assert set(assert_every_requested_call_ends_once(b, turn_id).values()) == {"turn/toolCallCompleted"}


async def test_a_call_repeating_an_id_of_its_batch_gets_an_error_output_and_no_event() -> None:
    # The game is asked to run c1 once; a second call with the same id in the batch is the
    # model's mistake: the model gets an error output for it, and the game no event, since
    # its callId would name the call the game is running (two ending events for one call).
    calls = [CALLS[0], {"id": "c1", "name": "check_inventory", "arguments": {"item": "mead"}}]
    async with bridge() as b:
        await b.send(INIT)
        await b.request(
            1,
            "npc/create",
            {"npcId": "a", "tools": [INVENTORY_TOOL], "script": [{"toolCalls": calls}, {"text": "Three."}]},
        )
        turn_id = (await b.request(2, "npc/respond", {"npcId": "a", "prompt": "Ale?"}))["turnId"]
        await b.wait_event("turn/toolCallRequested", turnId=turn_id, callId="c1")
        assert await b.request(3, "npc/submit", {"npcId": "a", "callId": "c1", "output": 3}) == {"accepted": True}
        done = await b.wait_terminal(turn_id)
        assert done["method"] == "turn/completed"
        b.assert_well_formed(turn_id)
        assert assert_every_requested_call_ends_once(b, turn_id) == {"c1": "turn/toolCallCompleted"}
        c1 = [
            (e["method"], e["params"].get("output"), e["params"].get("error"))
            for e in b.turn_events(turn_id)
            if e["params"].get("callId") == "c1"
        ]
        assert c1 == [("turn/toolCallRequested", None, None), ("turn/toolCallCompleted", 3, None)]
        records = done["params"]["toolCalls"]
        assert [(r["callId"], r.get("output"), (r.get("error") or "")[:9]) for r in records] == [
            ("c1", 3, ""),
            ("c1", None, "duplicate"),
        ]
