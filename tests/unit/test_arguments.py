"""Tool-call arguments from the player's words (``bridge/core/agent/_arguments.py``): the
pinning rules as pure functions, then the agent on the scripted engine, which plays a call
with the model's wrong value and must hand the game the player's."""

from __future__ import annotations

from typing import Any

import pytest

from bridge import ScriptedEngine
from bridge.core import _messages as m
from bridge.core.agent import _arguments as a
from bridge.core.agent._steering import TurnProgress, call_room, pin_arguments, player_line, step_pins
from bridge.engines.base import Message, ToolCall, ToolSpec
from tests.support.harness import Client

STOCK = ["ale", "bread", "stew"]
PLAYERS = "the player's line"
INVENTORY = ToolSpec(
    "check_inventory",
    "How many of an item the tavern has",
    {"type": "object", "properties": {"item": {"type": "string", "enum": STOCK}}, "required": ["item"]},
)
FREE = ToolSpec(
    "check_inventory",
    "How many of an item the tavern has",
    {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
)
NOTE = ToolSpec(
    "write_note",
    "Write in the ledger",
    {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
)


def pinned(line: str, tool: ToolSpec, **args: Any) -> dict[str, Any]:
    call, _ = a.pin_call(ToolCall("c0", tool.name, args), tool, line)
    return call.arguments


# ---- closed sets ----


@pytest.mark.parametrize(
    ("line", "value"),
    [
        ("Do you have any ale left?", "ale"),
        ("Any ALE left?", "ale"),  # case
        ("Two ales, please.", "ale"),  # a plural names its singular
        ("A loaf of bread for the road.", "bread"),
        ("Got any stews?", "stew"),
    ],
)
def test_the_one_value_the_line_names_is_pinned(line: str, value: str) -> None:
    assert a.named_value(line, STOCK) == value
    assert pinned(line, INVENTORY, item="bread" if value != "bread" else "ale") == {"item": value}


def test_plurals_go_both_ways_and_take_the_simple_forms() -> None:
    assert a.named_value("one berry", ["berries"]) == "berries"
    assert a.named_value("two berries", ["berry"]) == "berry"
    assert a.named_value("potatoes!", ["potato"]) == "potato"
    assert a.named_value("the boxes", ["box"]) == "box"
    assert a.named_value("the alehouse", ["ale"]) is None, "a word, not a part of one"


def test_values_of_several_words_match_those_words_in_a_row() -> None:
    doors = ["front door", "back_door", "cellar-door"]
    assert a.named_value("Could you open the back door?", doors) == "back_door"
    assert a.named_value("the cellar door, quick", doors) == "cellar-door"
    assert a.named_value("the door at the back", doors) is None
    # "door" inside "back door" does not count as naming "door" as well
    assert a.named_value("open the back door", ["door", "back door"]) == "back door"


def test_a_line_naming_no_value_leaves_the_models_choice() -> None:
    assert a.named_value("What's good tonight?", STOCK) is None
    assert pinned("What's good tonight?", INVENTORY, item="stew") == {"item": "stew"}


def test_values_of_function_words_only_are_never_pinned() -> None:
    assert a.named_value("I'd like a drink", ["a", "b"]) is None
    assert a.named_value("Is the lamp on the table?", ["on", "off"]) is None


def test_a_line_naming_two_values_pins_none() -> None:
    assert a.named_value("Ale or bread?", STOCK) is None
    assert pinned("Ale or bread?", INVENTORY, item="stew") == {"item": "stew"}
    assert a.named_value("ale, and more ale", STOCK) == "ale", "the same value twice is one value"


def test_closed_sets_are_enums_or_consts_of_strings() -> None:
    assert a.closed_values({"enum": ["a", 1, "b"]}) == ["a", "b"]
    assert a.closed_values({"anyOf": [{"const": "x"}, {"const": "y"}]}) == ["x", "y"]
    assert a.closed_values({"oneOf": [{"const": "x"}, {"type": "string"}]}) is None
    assert a.closed_values({"type": "string"}) is None
    assert a.closed_values({"enum": [1, 2]}) is None


def test_enum_pins_per_tool_for_the_request() -> None:
    door = ToolSpec("open_door", "", {"type": "object", "properties": {"door": {"enum": ["front", "back"]}}})
    assert a.enum_pins("Open the back door and pour an ale.", [INVENTORY, door, NOTE]) == {
        "check_inventory": {"item": "ale"},
        "open_door": {"door": "back"},
    }
    assert a.enum_pins("Hello!", [INVENTORY, door]) == {}


def test_a_replaced_value_is_reported_and_an_equal_one_is_not() -> None:
    call, warnings = a.pin_call(ToolCall("c7", "check_inventory", {"item": "bread"}), INVENTORY, "Any ale?")
    assert call.arguments == {"item": "ale"}
    assert warnings == [
        f'tool call c7 (check_inventory): argument \'item\' set to "ale" from {PLAYERS} (the model gave "bread")'
    ]
    same = ToolCall("c8", "check_inventory", {"item": "ale"})
    assert a.pin_call(same, INVENTORY, "Any ale?") == (same, [])


# ---- free strings ----


@pytest.mark.parametrize(
    ("line", "span"),
    [
        ("Do you have any ale left?", "ale"),  # the words after a determiner, up to a stop word
        ("Bring me a bowl of stew.", "stew"),  # "a bowl of stew": the words after "of"
        ("Could you open the back door?", "back door"),
        ("Have you seen Marcus?", "Marcus"),  # a capitalised name inside the line
        ("Greta, any mead left?", "mead"),  # not the name the line starts with
        ('Look up "Dragon\'s Breath" for me', "Dragon's Breath"),  # a quoted phrase first
    ],
)
def test_a_free_string_takes_the_one_span_of_the_line(line: str, span: str) -> None:
    assert pinned(line, FREE, item="alice-1234567890") == {"item": span}


def test_a_free_string_keeps_the_models_value_when_no_single_span_fits() -> None:
    assert pinned("Did Marcus buy the red potion?", FREE, item="x") == {"item": "x"}, "two candidates"
    assert pinned("What's good?", FREE, item="x") == {"item": "x"}, "none"
    assert pinned("Do you have any ales left?", FREE, item="Ale") == {"item": "Ale"}, "already the line's words"
    short = ToolSpec("t", "", {"type": "object", "properties": {"item": {"type": "string", "maxLength": 2}}})
    assert pinned("Any ale left?", short, item="x") == {"item": "x"}, "the span breaks maxLength"


def test_prose_arguments_take_a_quote_but_not_a_noun_for_the_models_sentence() -> None:
    said = "Write down that the bard owes us the silver."
    prose = "The bard owes three silver coins to the tavern."
    assert pinned(said, NOTE, text=prose) == {"text": prose}
    assert pinned("Note 'bard owes 3' in the ledger", NOTE, text=prose) == {"text": "bard owes 3"}


def test_free_strings_are_left_alone_when_the_tool_has_several() -> None:
    give = ToolSpec(
        "give", "", {"type": "object", "properties": {"item": {"type": "string"}, "to": {"type": "string"}}}
    )
    assert pinned("Give 'the key' to the guard", give, item="x", to="y") == {"item": "x", "to": "y"}


# ---- when: the player's line only ----


def params(**kw: Any) -> m.RespondParams:
    return m.RespondParams(npc_id="n", prompt="Any ale left?", **kw)


def test_only_the_first_step_on_the_players_line_pins() -> None:
    line = [Message("user", "Any ale left?")]
    assert player_line(params(), 0, line) == "Any ale left?"
    assert player_line(params(), 1, line) is None, "a step after a tool round"
    resumed = [*line, Message("assistant", "", [ToolCall("c0", "check_inventory", {"item": "ale"})])]
    assert player_line(params(), 0, [*resumed, Message("tool", "3", tool_call_id="c0")]) is None
    assert player_line(params(pin_arguments=False), 0, line) is None
    progress = TurnProgress(list(line))
    assert step_pins(params(), progress, [INVENTORY]) == {"check_inventory": {"item": "ale"}}
    calls = [ToolCall("c0", "check_inventory", {"item": "bread"})]
    assert pin_arguments(calls, 0, [INVENTORY], params(), progress)[0].arguments == {"item": "ale"}
    assert progress.warnings and "the player's line" in progress.warnings[0]
    assert pin_arguments(calls, 1, [INVENTORY], params(), TurnProgress(list(line))) == calls


def test_the_call_room_is_what_is_left_of_max_tool_calls() -> None:
    assert call_room(params(max_tool_calls=3), TurnProgress([], calls_made=1)) == 2
    assert call_room(params(max_tool_calls=1), TurnProgress([], calls_made=4)) == 0


# ---- on the scripted engine ----

INVENTORY_WIRE = {
    "name": "check_inventory",
    "description": "How many of an item the tavern has",
    "parameters": {"type": "object", "properties": {"item": {"type": "string", "enum": STOCK}}, "required": ["item"]},
}


async def scripted_turn(client: Client, script: list[Any], **kw: Any) -> dict[str, Any]:
    await client.call("npc/create", {"npcId": "n", "tools": [INVENTORY_WIRE], "script": script})
    r = await client.call("npc/respond", {"npcId": "n", "prompt": "Do you have any ale left?", **kw})
    seen = []
    for call_id in ("c0", "c1"):
        if call_id not in [s for step in script for s in [c["id"] for c in step.get("toolCalls", [])]]:
            continue
        ev = await client.wait_event("turn/toolCallRequested", turnId=r["turnId"], callId=call_id)
        seen.append(ev["params"]["arguments"])
        await client.call("npc/submit", {"npcId": "n", "callId": call_id, "output": {"count": 3}})
    done = await client.wait_terminal(r["turnId"])
    done["seen"] = seen
    return done


def inventory_call(id_: str, item: str) -> dict[str, Any]:
    return {"id": id_, "name": "check_inventory", "arguments": {"item": item}}


async def test_the_game_gets_the_players_value_and_a_warning(client: Client, engine: ScriptedEngine) -> None:
    done = await scripted_turn(
        client,
        [{"toolCalls": [inventory_call("c0", "bread")]}, {"text": "Three barrels."}],
        toolChoice="required",
    )
    assert done["method"] == "turn/completed"
    assert done["seen"] == [{"item": "ale"}], "turn/toolCallRequested carries the player's value"
    assert done["params"]["toolCalls"][0]["arguments"] == {"item": "ale"}
    assert done["params"]["warnings"] == [
        f'tool call c0 (check_inventory): argument \'item\' set to "ale" from {PLAYERS} (the model gave "bread")'
    ]
    first, second = engine.requests
    assert first.pinned == {"check_inventory": {"item": "ale"}}, "the engine is told the pinned value"
    assert second.pinned == {}, "a step after the tool round pins nothing"
    said = [c for msg in second.messages for c in msg.tool_calls]
    assert said[0].arguments == {"item": "ale"}, "the model reads the call as the game ran it"


async def test_later_steps_keep_the_models_values(client: Client, engine: ScriptedEngine) -> None:
    done = await scripted_turn(
        client,
        [
            {"toolCalls": [inventory_call("c0", "ale")]},
            {"toolCalls": [inventory_call("c1", "bread")]},
            {"text": "Ale and bread."},
        ],
    )
    assert done["seen"] == [{"item": "ale"}, {"item": "bread"}]
    assert done["params"]["warnings"] == []


async def test_pin_arguments_false_leaves_the_models_value(client: Client, engine: ScriptedEngine) -> None:
    done = await scripted_turn(
        client, [{"toolCalls": [inventory_call("c0", "bread")]}, {"text": "Bread."}], pinArguments=False
    )
    assert done["seen"] == [{"item": "bread"}] and done["params"]["warnings"] == []
    assert engine.requests[0].pinned == {}


async def test_the_steps_call_limit_is_the_budget_left(client: Client, engine: ScriptedEngine) -> None:
    await scripted_turn(
        client,
        [{"toolCalls": [inventory_call("c0", "ale")]}, {"toolCalls": [inventory_call("c1", "ale")]}, {"text": "ok"}],
        toolChoice="required",
        maxToolCalls=2,
    )
    assert [(q.tool_mode, q.max_calls) for q in engine.requests] == [
        ("required", 2),
        ("allowed", 1),
        ("disallowed", None),
    ]


# ---- where the bridge routes (semantic): spans of the line, and values the line means ----


def test_a_verb_names_its_ing_and_ed_forms() -> None:
    kinds = ["hunt", "escort", "delivery"]
    assert a.named_value("Any monsters that need hunting?", kinds) == "hunt"
    assert a.named_value("I escorted the merchant.", kinds) == "escort"
    assert a.named_value("Trading today?", ["trade", "rest"]) == "trade", "a final e dropped before -ing"
    assert a.named_value("Any beds?", ["be", "bed"]) == "bed", "short words take no verb forms ('be' -> 'bed')"


def test_i_contractions_are_the_player_not_a_name() -> None:
    assert a.noun_phrases("Please, I'm bleeding badly.") == []
    assert a.noun_phrases("Have you seen Marcus?") == ["Marcus"]


@pytest.mark.parametrize(
    ("line", "span"),
    [
        ("I took an arrow in the leg, can you patch me up?", "took an arrow in the leg"),
        ("Please, I'm bleeding badly.", "bleeding badly"),
        ("My arm is broken, help me.", "arm"),  # one noun phrase
        ("I delivered the letter to the mill.", "delivered the letter to the mill"),
        ("I'm sorry, the merchant I escorted died on the road.", "merchant I escorted died on the road"),
        ("Deliver 'the red box' now.", "the red box"),  # a quote first
        (
            "I got wounded in a fight with three bandits near the old mill by the river.",
            "got wounded in a fight with three bandits",
        ),
        ("Help me, please!", None),  # nothing but asking
    ],
)
def test_a_free_strings_span_is_a_quote_a_noun_phrase_or_the_main_clause(line: str, span: str | None) -> None:
    assert a.line_span(line) == span


INJURY = ToolSpec(
    "heal_wounds",
    "Heal the player's wounds.",
    {"type": "object", "properties": {"injury": {"type": "string", "maxLength": 60}}, "required": ["injury"]},
)


def test_where_the_bridge_routes_a_free_string_takes_the_span_whatever_the_model_wrote() -> None:
    line = "Please, I'm bleeding badly."
    call = ToolCall("c0", "heal_wounds", {"injury": "I'm"})  # words of the line, but not the injury
    assert a.pin_call(call, INJURY, line)[0] == call, "the model's value stands where it routes"
    got, warnings = a.pin_call(call, INJURY, line, routed=True)
    assert got.arguments == {"injury": "bleeding badly"}
    assert warnings == [
        "tool call c0 (heal_wounds): argument 'injury' set to \"bleeding badly\" from "
        f'{PLAYERS} (the model gave "I\'m")'
    ]
    short = ToolSpec("t", "", {"type": "object", "properties": {"injury": {"type": "string", "maxLength": 5}}})
    assert a.pin_call(ToolCall("c0", "t", {"injury": "x"}), short, line, routed=True)[0].arguments == {"injury": "x"}


REPORT = ToolSpec(
    "report_quest",
    "Record a quest's report.",
    {"type": "object", "properties": {"outcome": {"type": "string", "enum": ["done", "failed"]}}},
)


def test_a_value_the_line_means_is_pinned_unless_its_words_name_another() -> None:
    call = ToolCall("c0", "report_quest", {"outcome": "failed"})
    got, warnings = a.pin_call(call, REPORT, "I killed the wolves.", meant={"outcome": "done"})
    assert got.arguments == {"outcome": "done"} and len(warnings) == 1
    got, _ = a.pin_call(call, REPORT, "The hunt failed.", meant={"outcome": "done"})
    assert got.arguments == {"outcome": "failed"}, "the words the line says win over what it seems to mean"


def test_step_pins_carry_the_meant_values_under_the_words() -> None:
    line = [Message("user", "I killed the wolves.")]
    progress = TurnProgress(list(line), meant={"report_quest": {"outcome": "done"}, "gone": {"x": "y"}})
    p = m.RespondParams(npc_id="n", prompt="I killed the wolves.")
    assert step_pins(p, progress, [REPORT]) == {"report_quest": {"outcome": "done"}}, "only tools the step shows"
    assert step_pins(m.RespondParams(npc_id="n", prompt="x", pin_arguments=False), progress, [REPORT]) == {}


# ---- counts ----

ORDER = ToolSpec(
    "take_order",
    "Take an order.",
    {
        "type": "object",
        "properties": {
            "item": {"type": "string", "enum": STOCK},
            "quantity": {"type": "integer", "minimum": 1, "maximum": 20},
        },
    },
)


@pytest.mark.parametrize(
    ("line", "count"),
    [
        ("I'll have two ales, please.", 2),
        ("3 loaves of bread", 3),
        ("A dozen ales for my crew!", 12),
        ("Two ales and three stews.", None),  # several counts
        ("It costs 1.5 silver.", None),  # not a count
        ("The ale in room 12b.", None),
        ("An ale.", None),  # an article is a count only where the bridge routes
    ],
)
def test_a_count_the_line_says_is_the_integer_arguments(line: str, count: int | None) -> None:
    assert a.line_number(line) == count


def test_the_one_integer_argument_takes_the_count_within_its_bounds() -> None:
    assert pinned("I'll have two ales, please.", ORDER, item="ale", quantity=5) == {"item": "ale", "quantity": 2}
    assert pinned("Forty ales!", ORDER, item="ale", quantity=5)["quantity"] == 5, "no number word past twelve"
    assert pinned("I'll have 40 ales.", ORDER, item="ale", quantity=5)["quantity"] == 5, "over the maximum"
    call = ToolCall("c0", "take_order", {"item": "stew", "quantity": 2})
    assert a.pin_call(call, ORDER, "A bowl of stew for me.")[0] == call
    assert a.pin_call(call, ORDER, "A bowl of stew for me.", routed=True)[0].arguments == {
        "item": "stew",
        "quantity": 1,
    }
