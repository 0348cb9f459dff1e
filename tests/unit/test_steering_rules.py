"""Each steering rule on its own, as the plain function it is: the turn's parameters and its
``TurnProgress`` in, tools, a mode, a verdict or an error out. No NPC, no engine, no events
(``test_steering.py`` checks the same rules end to end, on what the engine was asked)."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.core import _messages as m
from bridge.core._world import RECALL, RESPOND_DIRECTLY, RESPOND_DIRECTLY_TOOL, View
from bridge.core.agent._steering import (
    TurnProgress,
    call_problem,
    call_problems,
    finish_reason,
    guardrail_action,
    hand_back,
    judge_step,
    offered_tools,
    repeats,
    round_messages,
    steer,
    structured_answer,
)
from bridge.engines.base import ToolCall, ToolSpec
from bridge.errors import BridgeError

INVENTORY = ToolSpec("check_inventory", "Count an item.", {"type": "object"})
DOOR = ToolSpec("open_door", "Open a door.", {"type": "object"})
TOOLS = [INVENTORY, DOOR]
SHOWN = {t.name: t for t in TOOLS}
KNOWN = set(SHOWN)


def params(**kw: Any) -> m.RespondParams:
    return m.RespondParams(npc_id="n", prompt="?", **kw)


def progress(**kw: Any) -> TurnProgress:
    return TurnProgress([], **kw)


def call(id_: str, name: str = "check_inventory") -> ToolCall:
    return ToolCall(id_, name, {"item": "ale"})


def no_argument_error(call: ToolCall) -> str | None:
    return None


def problem_of(the_call: ToolCall, check: Any = no_argument_error, known: set[str] = KNOWN) -> str | None:
    """``call_problem`` for a call within budget and not repeated, nothing pending."""
    return call_problem(the_call, known, SHOWN, (), check, over_budget=False, duplicate=False)


# ---- which tools a step shows, and in which mode ----


def test_the_world_offers_recall_beside_the_npcs_tools_while_it_shows_lore() -> None:
    assert offered_tools(TOOLS, View(1, "", {})) == TOOLS
    with_lore = offered_tools(TOOLS, View(1, "", {"mill": "old"}))
    assert [t.name for t in with_lore] == ["check_inventory", "open_door", RECALL]


def test_required_applies_to_the_first_step_only() -> None:
    assert steer(params(tool_choice="required"), progress(), TOOLS) == (TOOLS, "required")
    assert steer(params(tool_choice="required"), progress(step=1), TOOLS) == (TOOLS, "allowed")


def test_a_named_tool_is_the_only_one_shown_and_required_on_the_first_step() -> None:
    p = params(tool_choice=m.NamedTool(tool="open_door"))
    assert steer(p, progress(), TOOLS) == ([DOOR], "required")
    assert steer(p, progress(step=1), TOOLS) == (TOOLS, "allowed")


def test_a_named_tool_the_npc_does_not_have_is_invalid_params() -> None:
    with pytest.raises(BridgeError) as e:
        steer(params(tool_choice=m.NamedTool(tool="fly")), progress(), TOOLS)
    assert e.value.code == "invalid_params"


def test_tool_or_answer_adds_respond_directly_to_the_first_step_only() -> None:
    p = params(tool_choice="tool_or_answer")
    assert steer(p, progress(), TOOLS) == ([*TOOLS, RESPOND_DIRECTLY_TOOL], "required")
    assert steer(p, progress(step=1), TOOLS) == (TOOLS, "allowed")


@pytest.mark.parametrize(
    ("why", "p", "state", "tools"),
    [
        ("toolChoice none", params(tool_choice="none"), progress(), TOOLS),
        ("rounds spent", params(max_tool_rounds=2), progress(step=2, rounds=2), TOOLS),
        ("calls spent", params(max_tool_calls=3), progress(step=1, rounds=1, calls_made=3), TOOLS),
        ("a direct answer", params(tool_choice="required"), progress(direct=True), TOOLS),
        ("no tools at all", params(tool_choice="required"), progress(), []),
    ],
)
def test_a_disallowed_step_shows_no_tools(
    why: str, p: m.RespondParams, state: TurnProgress, tools: list[ToolSpec]
) -> None:
    assert steer(p, state, tools) == ([], "disallowed"), why


def test_a_budget_not_yet_spent_still_allows_tools() -> None:
    state = progress(step=1, rounds=1, calls_made=2)
    assert steer(params(max_tool_rounds=2, max_tool_calls=3), state, TOOLS) == (TOOLS, "allowed")


# ---- what a step's calls lead to ----


def test_calls_on_a_disallowed_step_are_ignored_with_one_warning() -> None:
    state = progress()
    for _ in range(2):
        assert judge_step([call("c1")], "disallowed", [], state) == ("answer", [])
    assert state.warnings == ["the model made 1 tool call(s) on a step where tools were disallowed; ignored"]


def test_a_required_step_answered_without_a_call_fails_generation_failed() -> None:
    with pytest.raises(BridgeError) as e:
        judge_step([], "required", TOOLS, progress())
    assert e.value.code == "generation_failed"


def test_an_allowed_step_without_calls_is_the_answer() -> None:
    state = progress()
    assert judge_step([], "allowed", TOOLS, state) == ("answer", [])
    assert state.warnings == []


def test_respond_directly_alone_means_answer_in_words() -> None:
    state = progress()
    shown = [*TOOLS, RESPOND_DIRECTLY_TOOL]
    assert judge_step([call("d", RESPOND_DIRECTLY)], "required", shown, state) == ("direct", [])
    assert state.direct


def test_respond_directly_beside_other_calls_is_dropped_and_the_others_run() -> None:
    state = progress()
    shown = [*TOOLS, RESPOND_DIRECTLY_TOOL]
    outcome, calls = judge_step([call("d", RESPOND_DIRECTLY), call("c1")], "required", shown, state)
    assert (outcome, calls) == ("calls", [call("c1")])
    assert not state.direct


def test_respond_directly_on_a_step_that_did_not_show_it_is_an_ordinary_call() -> None:
    calls = [call("d", RESPOND_DIRECTLY)]
    assert judge_step(calls, "allowed", TOOLS, progress()) == ("calls", calls)


# ---- calls the game must not get ----


def test_a_batch_marks_each_repeated_id() -> None:
    assert repeats([call("a"), call("b"), call("a"), call("a")]) == [False, False, True, True]


@pytest.mark.parametrize(
    ("why", "the_call", "kw", "want"),
    [
        ("over budget", call("c1"), {"over_budget": True}, "tool call budget exceeded"),
        ("repeated in the batch", call("c1"), {"duplicate": True}, "duplicate tool call id 'c1'"),
        ("already pending", call("p1"), {}, "duplicate tool call id 'p1'"),
        ("an unknown tool", call("c1", "fly"), {}, "unknown tool 'fly'"),
        ("a tool not offered", call("c1", "hidden"), {}, "tool 'hidden' is not offered on this step"),
    ],
)
def test_a_refused_call_gets_the_reason_as_its_output(
    why: str, the_call: ToolCall, kw: dict[str, Any], want: str
) -> None:
    flags = {"over_budget": False, "duplicate": False, **kw}
    problem = call_problem(the_call, KNOWN | {"hidden"}, SHOWN, {"p1"}, no_argument_error, **flags)
    assert problem is not None and problem.startswith(want), why


def test_a_tool_not_offered_names_the_ones_that_are() -> None:
    problem = problem_of(call("c1", "hidden"), known={"hidden"})
    assert problem == "tool 'hidden' is not offered on this step; call one of: check_inventory, open_door"


def test_arguments_the_schema_refuses_are_invalid_arguments() -> None:
    problem = problem_of(call("c1"), lambda c: "'item' is required")
    assert problem == "invalid arguments: 'item' is required"


def test_arguments_that_cannot_be_checked_are_refused_not_raised() -> None:
    def broken(call: ToolCall) -> str | None:
        raise RuntimeError("a schema jsonschema cannot apply")

    problem = problem_of(call("c1"), broken)
    assert problem == "invalid arguments: they could not be checked against the tool's schema"


def test_a_good_call_has_no_problem() -> None:
    assert problem_of(call("c1")) is None


def test_calls_past_the_turns_call_budget_are_refused_in_batch_order() -> None:
    batch = [call("a"), call("b"), call("c")]
    state = progress(calls_made=3)
    problems = call_problems(batch, params(max_tool_calls=5), state, KNOWN, SHOWN, (), no_argument_error)
    assert problems[:2] == [None, None]
    assert problems[2] is not None and problems[2].startswith("tool call budget exceeded")


def test_a_repeated_id_in_a_batch_is_refused_after_its_first_use() -> None:
    batch = [call("a"), call("a")]
    problems = call_problems(batch, params(), progress(), KNOWN, SHOWN, (), no_argument_error)
    assert problems == [None, "duplicate tool call id 'a'"]


# ---- calls handed back, and outputs the model sees ----


def test_handed_back_calls_are_recorded_without_output_and_refused_ones_dropped() -> None:
    state = progress()
    batch = [call("a"), call("b", "fly"), call("r", RECALL)]
    handed = hand_back(batch, [None, "unknown tool 'fly'", None], state)
    assert handed == [call("a")]
    assert state.records == [m.ToolRecord("a", "check_inventory", {"item": "ale"}, None, None)]
    assert state.warnings == [
        "tool call b (fly) dropped: unknown tool 'fly'",
        "tool call r (recall) dropped: the bridge answers it only within a turn",
    ]


def test_when_every_call_is_refused_nothing_is_handed_back_or_recorded() -> None:
    state = progress()
    assert hand_back([call("b", "fly")], ["unknown tool 'fly'"], state) == []
    assert state.records == [] and state.warnings == []


def test_errors_are_tool_outputs_the_model_sees() -> None:
    state = progress()
    batch = [call("a"), call("b"), call("c")]
    results: list[tuple[Any, str | None]] = [("3 barrels", None), ({"n": 3}, None), (None, "unknown tool 'fly'")]
    msgs = round_messages("Let me look.", batch, results, state)
    assert msgs[0].role == "assistant" and msgs[0].content == "Let me look." and msgs[0].tool_calls == batch
    assert [(x.content, x.tool_call_id, x.is_error) for x in msgs[1:]] == [
        ("3 barrels", "a", False),
        ('{"n":3}', "b", False),
        ("Error: unknown tool 'fly'", "c", True),
    ]
    assert [r.call_id for r in state.records] == ["a", "b", "c"]
    assert state.records[2].error == "unknown tool 'fly'"


# ---- guardrails and structured answers ----


def guardrail(code: str = "guardrail_violation") -> BridgeError:
    return BridgeError(code, "blocked")


def test_the_fail_policy_and_other_errors_fail_the_turn() -> None:
    assert guardrail_action(guardrail(), params(), progress()) == "raise"
    assert guardrail_action(BridgeError("generation_failed", "x"), params(guardrail="retry"), progress()) == "raise"


def test_the_retry_policy_retries_once_as_text_then_falls_back() -> None:
    state = progress(schema={"type": "object"}, step=0)
    assert guardrail_action(guardrail("refusal"), params(guardrail="retry"), state) == "retry"
    assert (state.retried, state.direct, state.schema, state.step) == (True, True, None, 1)
    assert guardrail_action(guardrail("refusal"), params(guardrail="retry"), state) == "fallback"
    assert state.warnings == ["refusal: blocked"], "the same warning once"


def test_the_fallback_policy_falls_back_with_a_warning() -> None:
    state = progress()
    assert guardrail_action(guardrail(), params(guardrail="fallback"), state) == "fallback"
    assert state.warnings == ["guardrail_violation: blocked"] and not state.retried


def test_a_turn_retried_as_text_says_so_in_its_finish_reason() -> None:
    assert finish_reason("stop", progress()) == "stop"
    assert finish_reason("stop", progress(retried=True)) == "retried_as_text"


SCHEMA = {"type": "object", "properties": {"mood": {"type": "string"}, "n": {"type": "integer"}}, "required": ["mood"]}


def test_a_structured_answer_comes_back_in_the_schemas_key_order() -> None:
    assert list(structured_answer('{"n": 2, "mood": "glad"}', SCHEMA, "stop")) == ["mood", "n"]


@pytest.mark.parametrize(
    ("text", "finish", "want"),
    [
        ('{"mood": "gl', "length", 'not valid JSON (cut off by maxTokens: finish_reason "length")'),
        ('{"mood": "gl', "stop", "not valid JSON"),
        ('{"n": 2}', "stop", "does not match the schema: 'mood' is a required property"),
    ],
)
def test_a_bad_structured_answer_fails_generation_failed_saying_why(text: str, finish: str, want: str) -> None:
    with pytest.raises(BridgeError) as e:
        structured_answer(text, SCHEMA, finish)
    assert e.value.code == "generation_failed" and e.value.message.endswith(want)


def test_a_warning_is_kept_once() -> None:
    state = progress()
    state.warn("w")
    state.warn("w")
    assert state.warnings == ["w"]
