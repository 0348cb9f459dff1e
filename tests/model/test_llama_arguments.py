"""Tool-call arguments from the player's words, and one call per forced step, on the real
bundled model through the real ``oam-bridge`` subprocess, at temperature 0.7 over several
seeds (the figures the change was measured by: protocol.md, "Arguments from the player's
words").

- an enum value the player names is the call's value (``_arguments.py``: the grammar holds
  the enum to it on the llama engine, and the agent replaces a differing value on any engine);
- a free string argument gets the noun the player asked about, not a name the model made up;
- a forced step makes no more calls than ``maxToolCalls`` allows (the grammar's limit), so
  no over-budget error reaches the spoken line.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from functools import partial
from typing import Any

import pytest
import trio

from tests.support.harness import Proc, initialized_bridge

SEEDS = range(1, 11)

INVENTORY_ENUM = {
    "name": "check_inventory",
    "description": "Look up how many of an item the tavern has.",
    "parameters": {
        "type": "object",
        "properties": {"item": {"type": "string", "enum": ["ale", "bread", "stew"]}},
        "required": ["item"],
    },
}
INVENTORY_FREE = {
    "name": "check_inventory",
    "description": "Look up how many of an item the tavern has.",
    "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
}
GET_MENU = {
    "name": "get_menu",
    "description": "Read today's menu.",
    "parameters": {"type": "object", "properties": {}},
}
TAKE_ORDER = {
    "name": "take_order",
    "description": "Take a guest's order to the kitchen.",
    "parameters": {
        "type": "object",
        "properties": {"dish": {"type": "string", "enum": ["ale", "bread", "stew"]}},
        "required": ["dish"],
    },
}

llama_bridge = partial(initialized_bridge, "--engine", "llama", guard=None)


@pytest.fixture
async def bridge() -> AsyncIterator[Proc]:
    async with llama_bridge("--llama-ctx", "1024") as p:
        yield p


async def turn(
    p: Proc, npc: str, tools: list[dict[str, Any]], seed: int, prompt: str, **kw: Any
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    await p.client.call(
        "npc/create",
        {
            "npcId": npc,
            "persona": {"name": "Greta", "role": "tavern keeper"},
            "tools": tools,
            "options": {"temperature": 0.7, "maxTokens": 96, "seed": seed},
        },
    )
    with trio.fail_after(120):
        return await p.client.turn_answering_calls(npc, prompt, {"count": 3}, **kw)


async def test_a_named_enum_value_is_the_calls_value(bridge: Proc) -> None:
    items = []
    for seed in SEEDS:
        done, calls = await turn(
            bridge, f"keeper{seed}", [INVENTORY_ENUM], seed, "Do you have any ale left?", toolChoice="required"
        )
        assert done["method"] == "turn/completed", done
        items.append(calls[0]["arguments"]["item"] if calls else None)
    print("enum item per seed:", items)
    assert items.count("ale") >= 0.9 * len(SEEDS), items


async def test_a_free_string_argument_takes_the_players_noun(bridge: Proc) -> None:
    items = []
    for seed in SEEDS:
        done, calls = await turn(
            bridge, f"cellar{seed}", [INVENTORY_FREE], seed, "Do you have any ale left?", toolChoice="required"
        )
        assert done["method"] == "turn/completed", done
        items.append(calls[0]["arguments"]["item"] if calls else None)
    print("free item per seed:", items)
    assert items.count("ale") >= 0.9 * len(SEEDS), items


async def test_one_call_on_a_forced_step_with_max_tool_calls_1(bridge: Proc) -> None:
    seen = []
    for seed in SEEDS:
        done, calls = await turn(
            bridge,
            f"cook{seed}",
            [GET_MENU, TAKE_ORDER],
            seed,
            "Bring me a bowl of stew.",
            toolChoice="required",
            maxToolCalls=1,
        )
        assert done["method"] == "turn/completed", done
        p = done["params"]
        seen.append(([(r["name"], r["arguments"], r.get("error")) for r in p["toolCalls"]], p["text"]))
    for records, text in seen:
        print("records:", records, "line:", repr(text))
    assert all(len(records) == 1 for records, _ in seen), seen
    assert all(error is None for records, _ in seen for _, _, error in records), seen
    words = ("error", "budget", "exceeded")
    assert not [text for _, text in seen if any(w in text.lower() for w in words)], seen
