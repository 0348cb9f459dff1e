"""LlamaEngine on the bundled model, in-process. Under CI=true a missing model or
llama-cpp-python fails these tests (test_the_model_is_available names why) instead of
skipping them. Grammar tests that need no model are in test_llama_grammar.py; timings are
in bench/bench_llama.py."""

import os

import jsonschema
import pytest
import trio

from bridge.engines.base import (GenerationOptions, Message, StepDone, StepRequest, TextChunk,
                                 ToolCallsChunk, ToolSpec)
from bridge.engines.llama import LlamaEngine, availability
from bridge.engines.llama._worker import Generator

pytestmark = pytest.mark.skipif(not availability()[0] and os.environ.get("CI") != "true",
                                reason=f"llama engine unavailable: {availability()[1]}")


def test_the_model_is_available():
    assert availability() == (True, None)

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
async def test_leaving_a_step_stops_its_thread_within_a_token(engine, monkeypatch):
    after_stop: list[object] = []
    generate = Generator.generate

    def spy(self, npc_id, tokens, grammar, opts, spoken, speaker, stop, emit, *rest):
        def counting_emit(item):
            if stop.is_set():
                after_stop.append(item)
            emit(item)
        return generate(self, npc_id, tokens, grammar, opts, spoken, speaker, stop, counting_emit, *rest)

    monkeypatch.setattr(Generator, "generate", spy)
    first = None
    with trio.fail_after(60):
        async for c in engine.stream_step(req(max_tokens=200)):
            if isinstance(c, TextChunk):
                first = c
                break
        assert first is not None
        out = await collect(engine, req(max_tokens=4))  # waits for the first step's thread
    assert isinstance(out[-1], StepDone)
    assert len(after_stop) <= 1, after_stop


async def test_count_tokens_from_threads_while_a_step_generates(engine):
    # blocking_count: the agent counts in worker threads, also while another NPC's step
    # holds the model; tokenizing only reads the vocabulary, so the counts are exact.
    assert engine.blocking_count is True
    prompts = [[Message("user", "Tell me about the gate." + " and the wall" * i)] for i in range(6)]
    expected = [engine.count_tokens("You are a guard.", p, [GIVE]) for p in prompts]
    engine._counts.clear()  # count afresh below, not from the cache
    counts: list[int] = []

    async def step():
        await collect(engine, req(max_tokens=16))

    with trio.fail_after(60):
        async with trio.open_nursery() as n:
            n.start_soon(step)
            for p in prompts:
                counts.append(await trio.to_thread.run_sync(engine.count_tokens, "You are a guard.", p, [GIVE]))
    assert counts == expected and expected == sorted(set(expected))


@pytest.mark.trio
async def test_returning_npc_cache(engine):
    msgs_a = [Message("user", "I am Alice, tell me about the castle gate.")]
    await collect(engine, req("A", msgs_a, max_tokens=4))
    await collect(engine, req("B", [Message("user", "Totally different words from Bob here.")], max_tokens=4))
    out = await collect(engine, req("A", msgs_a + [Message("assistant", "ok"), Message("user", "and?")], max_tokens=4))
    assert out[-1].usage.cached_tokens > 20

