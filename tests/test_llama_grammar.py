"""The llama engine's grammar and call parsing, without a model: GBNF built from tools and
schemas, the bounded-repetition compaction, the warnings for keywords the grammar cannot
enforce, and the parsing of a (possibly cut-off) call batch. Loading a model is not needed
(and would fail the test: see ``no_model_is_loaded``)."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from typing import Any

import pytest

from bridge.engines.base import ToolCall, GenerationOptions, Message, StepRequest, ToolMode, ToolSpec
from bridge.engines.llama import _grammar as g
from bridge.engines.llama._prompt import PromptRenderer

HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
# Under CI a missing llama-cpp-python fails these tests instead of skipping them.
needs_converter = pytest.mark.skipif(
    not HAVE_LLAMA_CPP and os.environ.get("CI") != "true", reason="llama-cpp-python is not installed"
)

NOTE = ToolSpec("note", "Write", {"type": "object", "properties": {
    "text": {"type": "string"}, "n": {"type": "integer", "minimum": 1}}, "required": ["text", "n"]})
DOOR = ToolSpec("door", "Open", {"type": "object", "properties": {
    "which": {"type": "string", "enum": ["front", "back"]}}, "required": ["which"]})


def req(tools: list[ToolSpec], mode: ToolMode, schema: dict[str, Any] | None = None) -> StepRequest:
    return StepRequest("a", "", [Message("user", "hi")], tools, mode, schema, GenerationOptions(), 0)


@pytest.fixture(autouse=True)
def no_model_is_loaded(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    if HAVE_LLAMA_CPP:
        import llama_cpp

        def refuse(*a: Any, **k: Any) -> None:
            raise AssertionError("a grammar test loaded a model")

        monkeypatch.setattr(llama_cpp, "Llama", refuse)
    yield


@needs_converter
def test_free_strings_are_bounded_compactly_and_unenforced_keywords_are_named() -> None:
    text, warnings = g.build_grammar(req([NOTE], "required"))
    assert text is not None
    assert f"char{{0,{g.TOOL_STRING_MAX}}}" in text.replace(" ", ""), "one bounded repetition, not 256 nested rules"
    assert warnings == ["tool note.n: 'minimum' is not enforced while generating (checked afterwards)"]


@needs_converter
def test_the_same_request_gives_the_cached_grammar_and_the_same_warnings() -> None:
    first = g.build_grammar(req([NOTE], "required"))
    warnings = first[1]
    warnings.append("changed by the caller")
    again = g.build_grammar(req([NOTE], "required"))
    assert again[0] == first[0] and again[1] == ["tool note.n: 'minimum' is not enforced while generating (checked afterwards)"]


@needs_converter
def test_required_allows_only_a_call_allowed_a_call_or_text() -> None:
    required, _ = g.build_grammar(req([NOTE, DOOR], "required"))
    allowed, _ = g.build_grammar(req([NOTE, DOOR], "allowed"))
    assert required is not None and required.rstrip().endswith("root ::= oamcall")
    assert allowed is not None and allowed.rstrip().endswith("root ::= oamcall | oamtext")
    assert '\\"note\\"' in required and '\\"door\\"' in required


@needs_converter
def test_a_step_without_tools_has_no_call_in_its_grammar() -> None:
    assert g.build_grammar(req([], "disallowed")) == (None, [])
    schema = {"type": "object", "properties": {"mood": {"type": "string"}}, "required": ["mood"]}
    text, _ = g.build_grammar(req([], "disallowed", schema))
    assert text is not None and "oamcall" not in text and "mood" in text


@needs_converter
def test_tools_are_used_as_given_whatever_the_mode() -> None:
    # The agent decides what a step shows (it sends no tools on a disallowed step); the
    # engine never filters them again, so a misbehaving model's call can be reported.
    text, _ = g.build_grammar(req([DOOR], "disallowed"))
    assert text is not None and "oamcall" in text


@needs_converter
def test_schema_answer_beside_calls_keeps_rule_names_apart() -> None:
    schema = {"type": "object", "properties": {"coins": {"type": "integer", "maximum": 9}}, "required": ["coins"]}
    text, warnings = g.build_grammar(req([DOOR], "allowed", schema))
    assert text is not None and text.rstrip().endswith("root ::= oamcall | oamans-root")
    assert "oamans-root ::=" in text
    assert warnings == ["schema.coins: 'maximum' is not enforced while generating (checked afterwards)"]


@needs_converter
def test_schema_property_order_decides_the_grammar() -> None:
    ab = {"type": "object", "properties": {"a": {"type": "string"}, "b": {"type": "string"}}, "required": ["a", "b"]}
    ba = {"type": "object", "properties": {"b": {"type": "string"}, "a": {"type": "string"}}, "required": ["b", "a"]}
    t1, _ = g.build_grammar(req([], "allowed", ab))
    t2, _ = g.build_grammar(req([], "allowed", ba))
    assert t1 is not None and t2 is not None and t1 != t2


def test_formats_the_grammar_cannot_enforce_are_warned_and_strings_bounded() -> None:
    warnings: list[str] = []
    out = g.for_grammar({"type": "object", "properties": {"e": {"type": "string", "format": "email"},
                                                          "d": {"type": "string", "format": "date"}}}, "tool t", warnings, 10)
    assert warnings == ["tool t.e: format 'email' is not enforced while generating (checked afterwards)"]
    assert "maxLength" not in out["properties"]["e"] and "maxLength" not in out["properties"]["d"]
    free: list[str] = []
    assert g.for_grammar({"type": "string"}, "x", free, 10) == {"type": "string", "maxLength": 10}
    assert g.for_grammar({"type": "string"}, "x", free, None) == {"type": "string"}, "answers are not bounded"


def test_cut_off_call_batch_keeps_the_calls_generated_whole() -> None:
    text = '{"tool_calls":[{"name":"give","arguments":{"item":"apple"}}, {"name":"wave","argu'
    assert g.complete_calls(text) == [{"name": "give", "arguments": {"item": "apple"}}]
    assert g.complete_calls('{"tool_calls":[{"na') == []
    assert g.complete_calls("no call here") == []
    assert len(g.complete_calls('{"tool_calls":[{"name":"a","arguments":{}},{"name":"b","arguments":{}}]}')) == 2


def test_prompt_shows_the_tools_given_and_says_must_on_a_required_step() -> None:
    r = PromptRenderer(None, "", "")
    allowed = r.render("You are a guard.", [Message("user", "hi")], [DOOR], "allowed")
    required = r.render("You are a guard.", [Message("user", "hi")], [DOOR], "required")
    bare = r.render("You are a guard.", [Message("user", "hi")], [], "disallowed")
    assert "- door with which (one of front, back): Open" in allowed and "Call one of these tools now." not in allowed
    assert "Call one of these tools now." in required
    assert "tool" not in bare and bare.endswith("<|im_start|>assistant\n")


def test_tool_rounds_are_told_as_facts_and_never_shown_as_json() -> None:
    # A small model imitates what its history shows: no call envelopes, no tool labels,
    # no braces; the game's answer is a fact in words, only for the turn being generated.
    r = PromptRenderer(None, "", "")
    call = Message("assistant", "", [ToolCall("c1", "check_inventory", {"item": "ale"})])
    result = Message("tool", '{"item":"ale","inStock":3}', tool_call_id="c1", name="check_inventory")
    earlier = [Message("user", "Any ale?"), call, result, Message("assistant", "Three left.")]
    now = r.render("You keep the inn.", [*earlier, Message("user", "And bread?"),
                                         Message("assistant", "", [ToolCall("c2", "check_inventory", {"item": "bread"})]),
                                         Message("tool", '{"item":"bread","inStock":12}', tool_call_id="c2", name="check_inventory")], [])
    assert "Facts for your answer: item bread, in stock 12." in now
    assert "in stock 3" not in now, "an earlier turn's facts are in its spoken line"
    assert "{" not in now and "check_inventory" not in now and "tool" not in now
    assert now.count("<|im_start|>user") == 2 and "Three left." in now


def test_a_template_without_a_system_role_gets_the_system_text_in_the_first_user_message() -> None:
    strict = ("{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
              "[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    r = PromptRenderer(strict, "", "")
    out = r.render("You are a guard.", [Message("user", "hi")], [])
    assert out == "[user] You are a guard.\n\nhi\n"