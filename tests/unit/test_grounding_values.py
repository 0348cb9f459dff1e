"""A spoken line after a tool round says the numbers the game's tools answered; without a
model: which values a line must say (``_prompt.values_to_say``: counts and amounts, not ids,
flags or menus) and where a line says one (``_lines.value_pattern``). The sampler's promise to
say them: tests/model/test_llama_grounding.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from bridge.engines._text._prompt import (
    LIST_MAX_ENTRIES,
    SAY_MAX_VALUES,
    Entry,
    PromptRenderer,
    entries_to_say,
    values_to_say,
)
from bridge.engines.base import Message, ToolCall
from bridge.engines.llama._lines import value_pattern


# -- which values a line must say -----------------------------------------------------------
@pytest.mark.parametrize(
    "outputs, said",
    [
        ([{"item": "ale", "inStock": 3}], ["3"]),  # the demo: the count, not the item's name
        ([{"ok": True}], []),  # a tool that only says it worked: nothing to recite
        ([{"ok": True, "gold": 50}], ["50"]),
        ([{"id": 4711}, {"orderId": 17, "total": 12}], ["12"]),  # identifiers are never said
        ([{"npc_id": 3, "createdAt": 1700000000, "version": 2}], []),
        ([{"x": 10, "y": 20}], []),  # a position
        ([{"price": 2.5}], ["2.5"]),
        ([{"ratio": 0.7312}, {"weight": 4.0}], ["4"]),  # a ratio is the game's; 4.0 is said "4"
        ([{"debt": -3}, {"big": 12345678}], []),  # negative, and too long to be a count
        ([{"inStock": 3, "price": 3}], ["3"]),  # the same number once
        ([{"hp": 35, "maxHp": 50}], ["35", "50"]),
        ([{"menu": [{"dish": "stew", "price": 4}, {"dish": "pie", "price": 6}, {"dish": "ale", "price": 2}]}], []),
        ([7], ["7"]),  # a tool that answers a bare number
        (["three left"], []),  # text: the model reads it, nothing is forced
        ([{"fare": "4 copper", "departures": "every hour"}], ["4 copper"]),  # an amount written out
        ([{"price": "12 gold coins"}, {"note": "3 copper"}], ["12 gold coins"]),  # only under a price key
        ([{"price": "about 4 copper"}, {"cost": "4 copper, or a song"}], []),  # not an amount alone
    ],
)
def test_the_numbers_a_line_must_say_are_counts_and_amounts_not_ids_flags_or_menus(
    outputs: list[Any], said: list[str]
) -> None:
    assert values_to_say(outputs) == said


def test_more_numbers_than_the_cap_make_none_of_them_required() -> None:
    counts = {f"item{i}": i + 1 for i in range(SAY_MAX_VALUES + 1)}
    assert values_to_say([counts]) == []
    assert values_to_say([dict(list(counts.items())[:SAY_MAX_VALUES])]) == [str(i + 1) for i in range(SAY_MAX_VALUES)]


def test_only_the_tool_results_of_the_turn_being_generated_count_and_never_an_error() -> None:
    call = ToolCall("c1", "check_inventory", {"item": "ale"})
    messages = [
        Message("user", "How much is the stew?"),
        Message("assistant", "", tool_calls=[ToolCall("c0", "price", {})]),
        Message("tool", json.dumps({"price": 4}), tool_call_id="c0", name="price"),
        Message("assistant", "Four copper."),
        Message("user", "Any ale left?"),
        Message("assistant", "", tool_calls=[call]),
        Message("tool", json.dumps({"inStock": 3}), tool_call_id="c1", name="check_inventory"),
        Message("tool", json.dumps({"retryAfter": 9}), tool_call_id="c2", name="check_inventory", is_error=True),
        Message("tool", "not json at all", tool_call_id="c3", name="check_inventory"),
    ]
    assert PromptRenderer.said_values(messages) == ["3"]
    assert PromptRenderer.said_values(messages[:4]) == ["4"]
    assert PromptRenderer.said_values([Message("user", "Hello")]) == []


# -- where a line says a value ----------------------------------------------------------------
@pytest.mark.parametrize(
    "value, text, says",
    [
        ("3", "I have 3 ale left.", True),
        ("3", "Three barrels, friend.", True),
        ("3", "Aye, three.", True),
        ("3", "I have 30 ale.", False),
        ("3", "It's the 3rd barrel.", False),
        ("3", "About 2.3 gallons.", False),
        ("3", "Only 13 left.", False),
        ("3", "3.5 mugs.", False),
        ("3", "At 3:10 tonight.", False),
        ("3", "3/4 full.", False),
        ("1200", "That's 1,200 gold.", True),
        ("2.5", "2.5 silver a mug.", True),
        ("2.5", "2.55 silver.", False),
    ],
)
def test_a_value_is_said_as_a_whole_number_in_digits_or_words(value: str, text: str, says: bool) -> None:
    assert bool(value_pattern(value).search(text)) is says


# -- which entries of a list a line must name ---------------------------------------------------
MENU = {
    "menu": [
        {"item": "ale", "price": "2 copper"},
        {"item": "mead", "price": "3 copper"},
        {"item": "lamb stew", "price": "5 copper"},
        {"item": "bread", "price": "1 copper"},
        {"item": "cheese", "price": "2 copper"},
    ]
}


@pytest.mark.parametrize(
    "player, said",
    [
        ("How much is the mead?", ["mead for 3 copper"]),  # the entry asked about, with its price
        ("A bowl of stew and two ales, please.", ["ale for 2 copper", "lamb stew for 5 copper"]),  # menu order
        ("Is the BREAD fresh?", ["bread for 1 copper"]),
        # none asked about: the first LIST_MAX_ENTRIES
        (
            "What can I buy from you?",
            ["ale for 2 copper", "mead for 3 copper", "lamb stew for 5 copper", "bread for 1 copper"],
        ),
    ],
)
def test_the_entries_a_line_must_name_are_those_the_player_asked_about(player: str, said: list[str]) -> None:
    assert [e.text for e in entries_to_say([MENU], player)] == said
    assert len(entries_to_say([MENU], "Anything good?")) == LIST_MAX_ENTRIES


@pytest.mark.parametrize(
    "output, said",
    [
        (
            {"wares": [{"name": "rope", "price": 3, "currency": "silver"}]},
            ["rope for 3 silver"],
        ),  # a number and its coin
        ([{"product": "lantern", "cost": 12}], ["lantern for 12"]),
        ({"stock": [{"item": "arrows", "count": 20}]}, ["20 arrows"]),  # a count before its name
        ({"quests": [{"title": "The lost ring", "giver": "Mara"}]}, []),  # no price, no count: not an entry
        ({"npcs": [{"id": 3, "x": 4}]}, []),
        ({"menu": [{"item": "a very long description of a dish nobody names", "price": 2}]}, []),
    ],
)
def test_a_list_entry_has_a_name_and_a_price_or_a_count(output: Any, said: list[str]) -> None:
    assert [e.text for e in entries_to_say([output], "anything")] == said


def test_a_menus_prices_are_said_with_their_entries_not_as_numbers_alone() -> None:
    menu = {"menu": [{"dish": "stew", "price": 4}, {"dish": "pie", "price": 6}]}
    call = ToolCall("c1", "get_menu", {})
    messages = [
        Message("user", "What's the pie?"),
        Message("assistant", "", tool_calls=[call]),
        Message("tool", json.dumps(menu), tool_call_id="c1", name="get_menu"),
    ]
    assert values_to_say([menu]) == []
    assert [e.text if isinstance(e, Entry) else e for e in PromptRenderer.said_values(messages)] == ["pie for 6"]


@pytest.mark.parametrize(
    "text, says",
    [
        ("Mead for 3 copper.", True),
        ("The mead is 3 copper, friend.", True),
        ("Three copper for a mead.", True),
        ("Mead? That's 3 copper.", False),  # another sentence: not said together
        ("The mead is 30 copper.", False),
        ("Ale for 3 copper.", False),
        ("The mead is 3 silver.", False),
    ],
)
def test_where_a_line_names_an_entry_with_its_price(text: str, says: bool) -> None:
    from bridge.engines.llama._worker import EntryValue

    value = EntryValue(Entry("mead", "3 copper", "mead for 3 copper"), lambda s: [1])
    assert bool(value.pattern.search(text)) is says
