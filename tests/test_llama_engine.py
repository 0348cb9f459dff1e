import time

import jsonschema
import pytest
import trio

from bridge.engines.base import (GenerationOptions, Message, StepDone, StepRequest, TextChunk,
                                 ToolCallsChunk, ToolSpec)
from bridge.engines.llama import LlamaEngine, availability

pytestmark = pytest.mark.skipif(not availability()[0], reason="llama model unavailable")

GIVE = ToolSpec("give", "Give an item", {"type": "object", "properties": {
    "item": {"type": "string", "enum": ["sword", "apple"]}}, "required": ["item"]})
WAVE = ToolSpec("wave", "Wave", {"type": "object", "properties": {
    "polite": {"type": "boolean"}}, "required": ["polite"]})


@pytest.fixture(scope="module")
def engine():
    return LlamaEngine()


def req(npc="a", msgs=None, tools=(), mode="disallowed", schema=None, max_tokens=24):
    return StepRequest(npc, "You are a guard.", msgs or [Message("user", "Hello there!")],
                       list(tools), mode, schema, GenerationOptions(max_tokens=max_tokens, temperature=0), 0)


async def collect(engine, r):
    return [c async for c in engine.stream_step(r)]


@pytest.mark.trio
async def test_required_single_tool(engine):
    out = await collect(engine, req(tools=[GIVE], mode="required", max_tokens=40))
    calls = [c for c in out if isinstance(c, ToolCallsChunk)]
    assert len(calls) == 1 and out[-1].finish_reason == "tool_calls"
    for call in calls[0].calls:
        assert call.name == "give"
        jsonschema.validate(call.arguments, GIVE.parameters)


@pytest.mark.trio
async def test_disallowed_no_tools(engine):
    out = await collect(engine, req(max_tokens=12))
    assert not any(isinstance(c, ToolCallsChunk) for c in out)
    assert isinstance(out[-1], StepDone)
    assert any(isinstance(c, TextChunk) for c in out)


@pytest.mark.trio
async def test_schema(engine):
    import json
    schema = {"type": "object", "properties": {"mood": {"type": "string", "enum": ["happy", "sad"]}},
              "required": ["mood"]}
    out = await collect(engine, req(schema=schema, max_tokens=30))
    text = "".join(c.delta for c in out if isinstance(c, TextChunk))
    jsonschema.validate(json.loads(text), schema)


def test_count_tokens_grows(engine):
    a = engine.count_tokens("x", [Message("user", "hi")], [])
    b = engine.count_tokens("x", [Message("user", "hi"), Message("assistant", "hello, traveller")], [])
    assert b > a > 0


@pytest.mark.trio
async def test_cancel(engine):
    t = None
    with trio.move_on_after(30):
        async for c in engine.stream_step(req(max_tokens=200)):
            if isinstance(c, TextChunk):
                t = time.monotonic()
                break
    assert t is not None and time.monotonic() - t < 1.0
    out = await collect(engine, req(max_tokens=4))
    assert isinstance(out[-1], StepDone)


@pytest.mark.trio
async def test_returning_npc_cache(engine):
    msgs_a = [Message("user", "I am Alice, tell me about the castle gate.")]
    await collect(engine, req("A", msgs_a, max_tokens=4))
    await collect(engine, req("B", [Message("user", "Totally different words from Bob here.")], max_tokens=4))
    out = await collect(engine, req("A", msgs_a + [Message("assistant", "ok"), Message("user", "and?")], max_tokens=4))
    assert out[-1].usage.cached_tokens > 20


def test_cut_off_call_batch_keeps_the_calls_generated_whole():
    from bridge.engines.llama import _complete_calls

    text = '{"tool_calls":[{"name":"give","arguments":{"item":"apple"}}, {"name":"wave","argu'
    assert _complete_calls(text) == [{"name": "give", "arguments": {"item": "apple"}}]
    assert _complete_calls('{"tool_calls":[{"na') == []
    assert len(_complete_calls('{"tool_calls":[{"name":"a","arguments":{}},{"name":"b","arguments":{}}]}')) == 2


def test_grammar_bounds_free_strings_and_names_what_it_cannot_enforce():
    from bridge.engines.llama import TOOL_STRING_MAX, _build_grammar

    note = ToolSpec("note", "Write", {"type": "object", "properties": {
        "text": {"type": "string"}, "n": {"type": "integer", "minimum": 1}}, "required": ["text", "n"]})
    text, warnings = _build_grammar(req(tools=[note], mode="required"))
    assert f"{{0,{TOOL_STRING_MAX}}}" in text.replace(" ", "")
    assert warnings == ["tool note.n: 'minimum' is not enforced while generating (checked afterwards)"]
    text2, warnings2 = _build_grammar(req(tools=[note], mode="required"))
    assert text2 == text and warnings2 == warnings, "cached grammar, same warnings"
    text3, _ = _build_grammar(req(tools=[note], mode="disallowed"))
    assert text3 is None, "a disallowed step has no call in its grammar"
