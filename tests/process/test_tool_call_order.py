"""The calls of one model step reach the game in the model's order, the order of
``turn/completed``'s ``toolCalls``; through the real ``oam-bridge`` subprocess over real pipes.

Failed on commit a76effb, before the fix: each call ran in a task of its own, which trio starts
in either order, so a step calling ``a`` then ``b`` asked the game for ``b`` first in about
half the turns (8 of 20), and a recorded session replayed with other answers.
``OAM_BRIDGE_ROOT=<a checkout of it>`` runs this file's bridges from that tree
(tests/support/harness.py).
"""

from __future__ import annotations

from typing import Any

from tests.support.harness import TERMINAL, initialized_bridge

TOOLS = [
    {"name": name, "description": f"Do {name}.", "parameters": {"type": "object", "properties": {}}}
    for name in ("a", "b", "c")
]
# A step of four calls: the third is the game's second; "nope" is no tool, so the game is not
# asked to run it and its first event is its error (turn/toolCallCompleted).
STEP = {"toolCalls": [{"name": "a"}, {"name": "nope"}, {"name": "b"}, {"name": "c"}]}
FIRST_EVENTS = [("turn/toolCallRequested", "a"), ("turn/toolCallCompleted", "nope")] + [
    ("turn/toolCallRequested", name) for name in ("b", "c")
]
TURNS = 20  # each turn's order was either way round: 20 turns in the right order by chance is 1 in a million


async def test_the_calls_of_a_step_are_requested_in_the_models_order() -> None:
    async with initialized_bridge() as b:
        await b.call("npc/create", {"npcId": "keeper", "tools": TOOLS, "script": [STEP, {"text": "Done."}] * TURNS})
        orders: list[list[tuple[str, str]]] = []
        for _ in range(TURNS):
            turn_id = (await b.call("npc/respond", {"npcId": "keeper", "prompt": "Do it all."}))["turnId"]

            def calls_seen(turn_id: str = turn_id) -> list[dict[str, Any]] | None:
                events = [e for e in b.turn_events(turn_id) if e["method"].startswith("turn/toolCall")]
                return events if len(events) == 4 else None

            events = await b.until("the step's four calls", calls_seen)
            orders.append([(e["method"], e["params"]["name"]) for e in events])
            for e in reversed(events):  # answered in the other order: the requests' order holds
                if e["method"] == "turn/toolCallRequested":
                    await b.call("npc/submit", {"npcId": "keeper", "callId": e["params"]["callId"], "output": "ok"})
            done = await b.wait_terminal(turn_id)
            assert done["method"] == TERMINAL[0], done
            assert [c["name"] for c in done["params"]["toolCalls"]] == ["a", "nope", "b", "c"]
            b.assert_well_formed(turn_id)
        wrong = [o for o in orders if o != FIRST_EVENTS]
        assert not wrong, f"{len(wrong)} of {TURNS} turns asked in another order, e.g. {wrong[0]}"
