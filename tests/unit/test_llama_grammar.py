"""The llama engine's grammar and call parsing, without a model: GBNF built from tools and
schemas, the bounded-repetition compaction, the warnings for keywords the grammar cannot
enforce, and the parsing of a (possibly cut-off) call batch. Loading a model is not needed
(and would fail the test: see ``no_model_is_loaded``)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Iterator
from typing import Any

import pytest

from bridge.engines._text import _grammar as g
from bridge.engines._text._prompt import PromptRenderer, turn_start
from bridge.engines.base import GenerationOptions, Message, StepRequest, ToolCall, ToolMode, ToolSpec

HAVE_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
# Under CI a missing llama-cpp-python fails these tests instead of skipping them.
needs_converter = pytest.mark.skipif(
    not HAVE_LLAMA_CPP and os.environ.get("CI") != "true", reason="llama-cpp-python is not installed"
)

NOTE = ToolSpec(
    "note",
    "Write",
    {
        "type": "object",
        "properties": {"text": {"type": "string"}, "n": {"type": "integer", "minimum": 1}},
        "required": ["text", "n"],
    },
)
DOOR = ToolSpec(
    "door",
    "Open",
    {"type": "object", "properties": {"which": {"type": "string", "enum": ["front", "back"]}}, "required": ["which"]},
)


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
    assert again[0] == first[0] and again[1] == [
        "tool note.n: 'minimum' is not enforced while generating (checked afterwards)"
    ]


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
    out = g.for_grammar(
        {
            "type": "object",
            "properties": {"e": {"type": "string", "format": "email"}, "d": {"type": "string", "format": "date"}},
        },
        "tool t",
        warnings,
        10,
    )
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
    # the same call twice in one batch is one call; the same tool with other arguments is another
    twice = '{"tool_calls":[{"name":"a","arguments":{"n":1}},{"name":"a","arguments":{"n":1}},{"name":"a"}]}'
    assert g.complete_calls(twice) == [{"name": "a", "arguments": {"n": 1}}, {"name": "a"}]
    assert (
        len(g.complete_calls('{"tool_calls":[{"name":"a","arguments":{"n":1}},{"name":"a","arguments":{"n":2}}]}')) == 2
    )


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
    now = r.render(
        "You keep the inn.",
        [
            *earlier,
            Message("user", "And bread?"),
            Message("assistant", "", [ToolCall("c2", "check_inventory", {"item": "bread"})]),
            Message("tool", '{"item":"bread","inStock":12}', tool_call_id="c2", name="check_inventory"),
        ],
        [],
    )
    assert "Facts for your answer: item bread, in stock 12." in now
    assert "in stock 3" not in now, "an earlier turn's facts are in its spoken line"
    assert "{" not in now and "check_inventory" not in now and "tool" not in now
    assert now.count("<|im_start|>user") == 2 and "Three left." in now


def test_a_template_without_a_system_role_gets_the_system_text_in_the_first_user_message() -> None:
    strict = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    )
    r = PromptRenderer(strict, "", "")
    out = r.render("You are a guard.", [Message("user", "hi")], [])
    assert out == "[user] You are a guard.\n\nhi\n"


# -- speakers -----------------------------------------------------------------------------


def test_a_line_another_npc_said_is_read_as_name_colon_line() -> None:
    r = PromptRenderer(None, "", "")
    msgs = [
        Message("user", "Any ale?"),
        Message("assistant", "Plenty."),
        Message("user", "Who are you, stranger?", name="Brom"),
    ]
    chat = r.chat_messages("You keep the inn.", msgs)
    assert [m["content"] for m in chat[1:]] == ["Any ale?", "Plenty.", "Brom: Who are you, stranger?"]
    out = r.render("You keep the inn.", msgs, [])
    assert "<|im_start|>user\nBrom: Who are you, stranger?<|im_end|>" in out
    assert "<|im_start|>user\nAny ale?<|im_end|>" in out, "the player's lines carry no name"
    # the turn being generated starts at the other NPC's line, as at a player's
    assert turn_start(msgs) == 2


# -- prewarm ------------------------------------------------------------------------------


def test_the_prewarm_prefix_starts_every_next_step_and_leaves_out_the_last_turns_facts() -> None:
    r = PromptRenderer(None, "", "")
    call = Message("assistant", "", [ToolCall("c1", "check_inventory", {"item": "ale"})])
    result = Message("tool", '{"item":"ale","inStock":3}', tool_call_id="c1", name="check_inventory")
    for history in ([], [Message("user", "Any ale?"), call, result, Message("assistant", "Three left.")]):
        prefix = r.render_prefix("You keep the inn.", history, [DOOR], "allowed")
        assert prefix.startswith("<|im_start|>system\nYou keep the inn.") and "- door with which" in prefix
        assert "in stock 3" not in prefix, "the next step shows no earlier turn's facts"
        for line in (Message("user", "And bread?"), Message("user", "Hail!", name="Brom"), Message("user", "")):
            step = r.render("You keep the inn.", [*history, line], [DOOR], "allowed")
            assert step.startswith(prefix) and len(step) > len(prefix)
        assert prefix.endswith("<|im_start|>user\n")


def test_the_prewarm_prefix_holds_for_a_template_without_a_system_role() -> None:
    strict = (
        "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
        "[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}"
    )
    r = PromptRenderer(strict, "", "")
    prefix = r.render_prefix("You are a guard.", [], [])
    assert prefix == "[user] You are a guard.\n\n"
    assert r.render("You are a guard.", [Message("user", "hi")], []).startswith(prefix)


# -- decisions (npc/decide) -----------------------------------------------------------------

DECIDE = {
    "type": "object",
    "properties": {
        "reasoning": {"type": "string", "description": "why, in one short sentence"},
        "choice": {"type": "string", "enum": ["let_in", "question"]},
    },
    "required": ["reasoning", "choice"],
}
URGENCY = {
    "type": "object",
    "properties": {"urgency": {"type": "string", "enum": ["low", "high"]}},
    "required": ["urgency"],
}
DECIDE_ARGS = {
    "anyOf": [
        {
            "type": "object",
            "properties": {
                "reasoning": {"type": "string", "description": "why, in one short sentence"},
                "choice": {"type": "string", "enum": ["let_in", "question"]},
            },
            "required": ["reasoning", "choice"],
        },
        {
            "type": "object",
            "properties": {
                "reasoning": {"type": "string", "description": "why, in one short sentence"},
                "choice": {"const": "call_help"},
                "arguments": URGENCY,
            },
            "required": ["reasoning", "choice", "arguments"],
        },
    ]
}


class Gbnf:
    """A recognizer for the GBNF the grammar module writes (literals, character classes,
    rule references, groups, alternatives, ``? * + {m,n}``): does a grammar accept a
    text? Only to test grammars without a model; every match set is computed, so a
    repetition bounded at 256 costs 256 steps."""

    def __init__(self, text: str) -> None:
        self.rules: dict[str, Any] = {}
        for line in text.splitlines():
            if "::=" in line:
                name, body = line.split("::=", 1)
                self.src, self.i = body, 0
                self.rules[name.strip()] = self._alt()
                assert self._peek() == "", f"unparsed: {body[self.i :]!r}"

    def _peek(self) -> str:
        while self.i < len(self.src) and self.src[self.i] in " \t":
            self.i += 1
        return self.src[self.i] if self.i < len(self.src) else ""

    def _char(self) -> str:
        c = self.src[self.i]
        self.i += 1
        if c != "\\":
            return c
        e = self.src[self.i]
        self.i += 1
        if e == "x":
            self.i += 2
            return chr(int(self.src[self.i - 2 : self.i], 16))
        return {"n": "\n", "t": "\t", "r": "\r"}.get(e, e)

    def _alt(self) -> Any:
        seqs = [self._seq()]
        while self._peek() == "|":
            self.i += 1
            seqs.append(self._seq())
        return ("alt", seqs)

    def _seq(self) -> Any:
        items = []
        while (c := self._peek()) and c not in "|)":
            items.append(self._postfix(self._atom()))
        return ("seq", items)

    def _atom(self) -> Any:
        c = self._peek()
        if c == '"':
            self.i += 1
            lit = ""
            while self.src[self.i] != '"':
                lit += self._char()
            self.i += 1
            return ("lit", lit)
        if c == "[":
            self.i += 1
            negate = self.src[self.i] == "^"
            self.i += negate
            ranges = []
            while self.src[self.i] != "]":
                lo = self._char()
                hi = lo
                if self.src[self.i] == "-" and self.src[self.i + 1] != "]":
                    self.i += 1
                    hi = self._char()
                ranges.append((lo, hi))
            self.i += 1
            return ("cls", negate, ranges)
        if c == "(":
            self.i += 1
            node = self._alt()
            assert self._peek() == ")"
            self.i += 1
            return node
        m = re.match(r"[A-Za-z0-9-]+", self.src[self.i :])
        assert m, f"unexpected {self.src[self.i :]!r}"
        self.i += m.end()
        return ("ref", m.group())

    def _postfix(self, node: Any) -> Any:
        while True:
            c = self._peek()
            if c in ("?", "*", "+"):
                self.i += 1
                node = ("rep", node, 1 if c == "+" else 0, 1 if c == "?" else None)
            elif c == "{":
                m = re.match(r"\{(\d+)(,(\d*))?\}", self.src[self.i :])
                assert m
                self.i += m.end()
                lo = int(m.group(1))
                hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
                node = ("rep", node, lo, hi)
            else:
                return node

    def _ends(self, node: Any, s: str, pos: int, memo: dict[tuple[str, int], set[int]]) -> set[int]:
        kind = node[0]
        if kind == "lit":
            return {pos + len(node[1])} if s.startswith(node[1], pos) else set()
        if kind == "cls":
            if pos >= len(s):
                return set()
            inside = any(lo <= s[pos] <= hi for lo, hi in node[2])
            return {pos + 1} if inside != node[1] else set()
        if kind == "ref":
            key = (node[1], pos)
            if key not in memo:
                memo[key] = set()
                memo[key] = self._ends(self.rules[node[1]], s, pos, memo)
            return memo[key]
        if kind == "alt":
            return set().union(*(self._ends(x, s, pos, memo) for x in node[1]))
        if kind == "seq":
            cur = {pos}
            for item in node[1]:
                cur = set().union(*(self._ends(item, s, p, memo) for p in cur))
                if not cur:
                    break
            return cur
        _, inner, lo, hi = node
        out = {pos} if lo == 0 else set()
        cur, seen, n = {pos}, {pos}, 0
        while cur and (hi is None or n < hi):
            cur = set().union(*(self._ends(inner, s, p, memo) for p in cur))
            n += 1
            if hi is None:
                cur -= seen
                seen |= cur
            if n >= lo:
                out |= cur
        return out

    def accepts(self, text: str) -> bool:
        return len(text) in self._ends(("ref", "root"), text, 0, {})


def decision(schema: dict[str, Any]) -> StepRequest:
    return StepRequest(
        "guard",
        "You guard the gate.",
        [Message("user", "A stranger walks up.")],
        [],
        "disallowed",
        schema,
        GenerationOptions(),
        0,
    )


def answer(reasoning: str, choice: str, **arguments: Any) -> str:
    value: dict[str, Any] = {"reasoning": reasoning, "choice": choice}
    if arguments:
        value["arguments"] = arguments
    return json.dumps(value)


@needs_converter
def test_a_decision_grammar_accepts_exactly_the_options_with_the_reasoning_first() -> None:
    text, warnings = g.build_grammar(decision(DECIDE))
    assert text is not None and warnings == []
    gr = Gbnf(text)
    for choice in ("let_in", "question"):
        assert gr.accepts(answer("He looks cold and tired.", choice))
        assert gr.accepts(answer("", choice).replace(" ", ""))  # the spaces are optional
    for wrong in ("call_help", "Question", "let in", ""):
        assert not gr.accepts(answer("He looks shifty.", wrong)), wrong
    assert not gr.accepts('{"choice": "question", "reasoning": "x"}'), "reasoning comes first"
    assert not gr.accepts('{"choice": "question"}')
    assert not gr.accepts('{"reasoning": "x"}')


@needs_converter
def test_a_decision_grammar_with_arguments_ties_each_option_to_its_arguments() -> None:
    text, warnings = g.build_grammar(decision(DECIDE_ARGS))
    assert text is not None and warnings == []
    gr = Gbnf(text)
    assert gr.accepts(answer("Friendly face.", "let_in"))
    assert gr.accepts(answer("A hood after dark.", "question"))
    assert gr.accepts(answer("Armed men behind him.", "call_help", urgency="high"))
    assert not gr.accepts(answer("Armed men.", "call_help", urgency="medium"))
    assert not gr.accepts(answer("Armed men.", "call_help")), "an option with parameters needs its arguments"
    assert not gr.accepts(answer("Friendly.", "let_in", urgency="low")), "arguments only for that option"
    assert not gr.accepts(answer("Hm.", "run_away"))


@needs_converter
def test_json_strings_in_the_grammar_hold_no_raw_control_characters() -> None:
    # JSON forbids them inside a string; the answer would not parse.
    text, _ = g.build_grammar(decision(DECIDE))
    assert text is not None
    gr = Gbnf(text)
    assert gr.accepts(answer("one line\nthen another", "question")), "an escaped line break is fine"
    assert not gr.accepts(answer("one line", "question").replace("one line", "one\nline"))
    assert not gr.accepts(answer("tab", "question").replace("tab", "\ttab"))
    call, _ = g.build_grammar(req([NOTE], "required"))
    assert call is not None and JSON_CHAR_EXCLUDES_CONTROLS in call


JSON_CHAR_EXCLUDES_CONTROLS = r'[^"\\\x7F\x00-\x1F]'


def test_the_prompt_names_a_decisions_fields_in_order_and_leaves_the_options_to_the_grammar() -> None:
    for schema in (DECIDE, DECIDE_ARGS):
        system = PromptRenderer.system_text("You guard the gate.", [], "disallowed", schema)
        said = system.split("\n\n")[-1]
        assert said.startswith(
            "Reply with a JSON object with the fields reasoning (why, in one short sentence); choice"
        )
        assert "{" not in said and "anyOf" not in said, "never the JSON Schema itself"
        for name in ("let_in", "question", "call_help", "low", "high"):
            assert name not in said, "the options' names are the grammar's to enforce"
    args = PromptRenderer.system_text("", [], "disallowed", DECIDE_ARGS)
    assert args == "Reply with a JSON object with the fields reasoning (why, in one short sentence); choice; arguments."


@needs_converter
@pytest.mark.parametrize("reasoning", [True, False])
def test_the_services_decision_schemas_give_grammars_of_only_the_options(reasoning: bool) -> None:
    # The schemas npc/decide really sends (bridge.core._service.decision_schema), both shapes.
    import msgspec

    from bridge.core import _messages as m
    from bridge.core._service import decision_schema

    params = msgspec.convert(
        {
            "npcId": "guard",
            "situation": "A stranger.",
            "reasoning": reasoning,
            "options": [
                {"name": "let_in", "description": "open the gate"},
                {"name": "question"},
                {"name": "call_help", "parameters": URGENCY},
            ],
        },
        m.DecideParams,
    )
    plain = msgspec.structs.replace(params, options=params.options[:2])
    why = {"reasoning": "Because the hour is late."} if reasoning else {}
    for schema in (decision_schema(plain), decision_schema(params)):
        text, warnings = g.build_grammar(decision(schema))
        assert text is not None and warnings == []
        gr = Gbnf(text)
        assert gr.accepts(json.dumps({**why, "choice": "question"}))
        assert not gr.accepts(json.dumps({**why, "choice": "run"}))
        said = PromptRenderer.system_text("", [], "disallowed", schema)
        assert "let_in" not in said and "{" not in said
        assert said.startswith(
            "Reply with a JSON object with the fields " + ("reasoning (" if reasoning else "choice (")
        )
    text, _ = g.build_grammar(decision(decision_schema(params)))
    assert text is not None
    assert Gbnf(text).accepts(json.dumps({**why, "choice": "call_help", "arguments": {"urgency": "low"}}))
    assert not Gbnf(text).accepts(json.dumps({**why, "choice": "let_in", "arguments": {"urgency": "low"}}))


def calls_req(tools: list[ToolSpec], mode: ToolMode, max_calls: int | None, pinned: Any = None) -> StepRequest:
    return StepRequest(
        "a",
        "",
        [Message("user", "hi")],
        tools,
        mode,
        None,
        GenerationOptions(),
        0,
        max_calls=max_calls,
        pinned=pinned or {},
    )


def batch(*calls: tuple[str, dict[str, Any]]) -> str:
    return json.dumps({"tool_calls": [{"name": n, "arguments": args} for n, args in calls]})


@needs_converter
@pytest.mark.parametrize("mode", ["required", "allowed"])
def test_a_batch_holds_at_most_the_steps_call_limit(mode: ToolMode) -> None:
    front, back = ("door", {"which": "front"}), ("door", {"which": "back"})
    one, _ = g.build_grammar(calls_req([DOOR], mode, 1))
    assert one is not None
    assert Gbnf(one).accepts(batch(front))
    assert not Gbnf(one).accepts(batch(front, back)), "maxToolCalls 1: one call, never a second"
    two, _ = g.build_grammar(calls_req([DOOR], mode, 2))
    assert two is not None and Gbnf(two).accepts(batch(front, back))
    assert not Gbnf(two).accepts(batch(front, back, front))
    # no limit from the agent, or a budget past it: the grammar's own MAX_CALLS
    for limit in (None, 8):
        text, _ = g.build_grammar(calls_req([DOOR], mode, limit))
        assert text is not None
        assert Gbnf(text).accepts(batch(*[front] * g.MAX_CALLS))
        assert not Gbnf(text).accepts(batch(*[front] * (g.MAX_CALLS + 1)))


@needs_converter
def test_a_pinned_argument_can_take_only_its_value() -> None:
    pinned, _ = g.build_grammar(calls_req([DOOR, NOTE], "required", None, {"door": {"which": "back"}}))
    assert pinned is not None
    gr = Gbnf(pinned)
    assert gr.accepts(batch(("door", {"which": "back"})))
    assert not gr.accepts(batch(("door", {"which": "front"})))
    assert gr.accepts(batch(("note", {"text": "hi", "n": 1}))), "other tools as they were"
    free, _ = g.build_grammar(calls_req([DOOR], "required", None))
    assert free is not None and free != pinned and Gbnf(free).accepts(batch(("door", {"which": "front"})))
    # a pin for a tool the step does not show changes nothing
    other, _ = g.build_grammar(calls_req([DOOR], "required", None, {"cellar": {"which": "back"}}))
    assert other == free


@needs_converter
def test_the_bridges_decision_reasoning_is_a_sentence_that_gives_a_reason() -> None:
    # npc/decide's reasoning ("x-oam-prose": "reason"): a sentence that opens "Because the"
    # (the bundled model otherwise writes a line of dialogue there: "Let's talk about the storm.")
    from bridge.core._messages import DecideParams, DecisionOption
    from bridge.core._service import decision_schema

    p = DecideParams(
        npc_id="bram", situation="A stranger.", options=[DecisionOption("let_in"), DecisionOption("question")]
    )
    text, warnings = g.build_grammar(decision(decision_schema(p)))
    assert text is not None and warnings == []
    gr = Gbnf(text)
    assert gr.accepts(answer("Because the storm is coming and he looks cold.", "let_in"))
    for not_a_reason in ("Let's talk about the storm.", "Because.", "He looks cold.", "Because the"):
        assert not gr.accepts(answer(not_a_reason, "let_in")), not_a_reason
