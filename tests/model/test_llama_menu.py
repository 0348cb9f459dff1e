"""A menu answered by the game is said as the game gave it, on the real bundled model through
the real ``oam-bridge`` subprocess, temperature 0.7, several seeds: the line names the dishes
the player asked about (all of them, up to four, when the player asked about none) each with
its own price, and says no price of its own (``_prompt.entries_to_say``,
``_worker.EntryValue``). The sampler's promise on made-up logits, whatever the model prefers:
tests/model/test_llama_grounding.py; the rates: ``bench/bench_quality.py``."""

from __future__ import annotations

import re
from functools import partial

import trio

from tests.support.harness import initialized_bridge

SEEDS = range(1, 5)
MENU = {
    "menu": [
        {"item": "ale", "price": "2 copper"},
        {"item": "mead", "price": "3 copper"},
        {"item": "lamb stew", "price": "5 copper"},
        {"item": "bread", "price": "1 copper"},
    ]
}
GET_MENU = {
    "name": "get_menu",
    "description": "Look up the tavern's menu: every dish and drink with its price.",
    "parameters": {"type": "object", "properties": {}},
}
# (the player's line, the dishes it must name with their prices)
LINES = [
    ("How much is the mead?", ["mead"]),
    ("How much for a bowl of lamb stew?", ["lamb stew"]),
    ("What can I buy from you?", ["ale", "mead", "lamb stew", "bread"]),
]
PRICE = {e["item"]: e["price"] for e in MENU["menu"]}

llama_bridge = partial(initialized_bridge, "--engine", "llama", guard=None)


def names_with_price(text: str, item: str) -> bool:
    """The line names ``item`` (or its last word: "the stew") with its price close by."""
    name = rf"(?:{re.escape(item)}|{re.escape(item.split()[-1])})"
    price = re.escape(PRICE[item])
    return bool(re.search(rf"\b{name}\b[^.!?]{{0,40}}?\b{price}\b|\b{price}\b[^.!?]{{0,25}}?\b{name}\b", text, re.I))


async def test_the_line_names_the_dishes_asked_about_with_their_prices_and_no_other_price() -> None:
    seen = []
    async with llama_bridge("--llama-ctx", "1024") as p:
        for seed in SEEDS:
            for i, (line, items) in enumerate(LINES):
                npc = f"keeper{seed}-{i}"
                await p.client.call(
                    "npc/create",
                    {
                        "npcId": npc,
                        "persona": {"name": "Greta", "role": "tavern keeper"},
                        "tools": [GET_MENU],
                        "options": {"temperature": 0.7, "maxTokens": 96, "seed": seed},
                    },
                )
                with trio.fail_after(120):
                    done, _calls = await p.client.turn_answering_calls(
                        npc, line, MENU, toolChoice={"tool": "get_menu"}, maxToolRounds=1
                    )
                assert done["method"] == "turn/completed", done
                seen.append((line, items, done["params"]["text"]))
    for row in seen:
        print(row)
    for line, items, text in seen:
        assert all(names_with_price(text, item) for item in items), (line, text)
        prices = re.findall(r"\d+(?:[.,]\d+)?|[½⅓¼¾]", text)
        assert sorted(prices) == sorted(PRICE[item].split()[0] for item in items), (line, text)
