"""The Mac checklist (native/README.md): probes of Apple's on-device model through the native
engine. Opt-in: ``OAM_LIVE_TESTS=1 .venv/bin/python -m pytest -s tests/native/test_native_live.py``
on an Apple-silicon Mac with Apple Intelligence enabled (``-s`` shows the measurements each
probe prints for the checklist). Skipped everywhere else. Each probe names the UNVERIFIED(n)
spot of native/README.md it settles."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
import trio

from bridge.engines.base import (
    GenerationOptions,
    Message,
    StepDone,
    StepRequest,
    TextChunk,
    ToolCall,
    ToolCallsChunk,
    ToolSpec,
)
from bridge.errors import BridgeError

pytestmark = [
    pytest.mark.trio,
    pytest.mark.skipif(os.environ.get("OAM_LIVE_TESTS") != "1", reason="live Apple model probes: set OAM_LIVE_TESTS=1 on a Mac"),
]

INVENTORY = ToolSpec(
    "check_inventory",
    "Look up how many of an item the tavern has in stock.",
    {"type": "object", "properties": {"item": {"type": "string", "description": "the item's name"}}, "required": ["item"]},
)
GRETA = "You are Greta, the innkeeper of the Prancing Pony. Answer in one or two short sentences."
STEP_DEADLINE_S = 60  # a live step that takes longer is a hang, not a slow model


def engine(**config: Any) -> Any:
    pytest.importorskip("cffi")
    from bridge.engines import native

    try:
        e = native.NativeEngine(backend="apple", **config)
    except BridgeError as err:  # a library without the Apple backend (not macOS 26)
        pytest.skip(f"Apple model unavailable: {err.message}")
    if not e.info().available:
        pytest.skip(f"Apple model unavailable: {e.info().reason}")
    return e


def req(messages: list[Message], tools: list[ToolSpec] | None = None, mode: str = "allowed", schema: Any = None,
        instructions: str = GRETA, npc: str = "greta", options: GenerationOptions | None = None) -> StepRequest:
    return StepRequest(npc_id=npc, instructions=instructions, messages=messages, tools=tools or [],
                       tool_mode=mode, schema=schema, options=options or GenerationOptions(), step_index=0)  # type: ignore[arg-type]


async def run(e: Any, r: StepRequest) -> tuple[str, list[ToolCall], StepDone, float]:
    """(text, tool calls, done, seconds to the first chunk); fails when the step hangs."""
    text, calls, done, first = "", [], None, -1.0
    start = time.monotonic()
    with trio.fail_after(STEP_DEADLINE_S):
        async for c in e.stream_step(r):
            if first < 0:
                first = time.monotonic() - start
            if isinstance(c, TextChunk):
                text += c.delta
            elif isinstance(c, ToolCallsChunk):
                calls += c.calls
            elif isinstance(c, StepDone):
                done = c
    assert done is not None
    return text, calls, done, first


async def test_a_text_step() -> None:
    text, calls, done, first = await run(engine(), req([Message("user", "Say hello in one word.")], mode="disallowed"))
    print(f"text step: {text!r}, first chunk after {first:.2f} s, usage {done.usage}")
    assert text.strip() and not calls and done.finish_reason in ("stop", "length")


async def test_a_tool_round_trip_with_our_call_ids() -> None:
    """UNVERIFIED(2), (3), (4), and a step with tool calls must not hang: it ends by itself
    (the tools throw once collected); the follow-up step, a reconstructed transcript with
    our call ids and the tool's output, is accepted and answered in text."""
    e = engine()
    ask = Message("user", "Do we have any ale left? Check the inventory.")
    _, calls, done, _ = await run(e, req([ask], tools=[INVENTORY], mode="required"))
    print(f"tool step: calls {calls}, finish {done.finish_reason}, warnings {done.warnings}")
    assert calls and all(c.name == "check_inventory" and c.id for c in calls)
    assert done.finish_reason == "tool_calls"
    history = [ask, Message("assistant", tool_calls=calls)] + [
        Message("tool", "12 barrels of ale", tool_call_id=c.id, name=c.name) for c in calls
    ]
    text, again, done2, _ = await run(e, req(history, tools=[INVENTORY]))
    print(f"follow-up: {text!r}, more calls {again}, warnings {done2.warnings}")
    assert text.strip() or again


async def test_a_schema_turn() -> None:
    schema = {"type": "object", "properties": {
        "mood": {"type": "string", "enum": ["calm", "annoyed"]}, "line": {"type": "string"}},
        "required": ["mood", "line"]}
    text, _, done, _ = await run(engine(), req([Message("user", "A stranger asks for a room.")], schema=schema, mode="disallowed"))
    answer = json.loads(text)
    print(f"schema turn: {answer}, warnings {done.warnings}")
    assert answer["mood"] in ("calm", "annoyed") and isinstance(answer["line"], str)


@pytest.mark.parametrize("guardrails", ["default", "permissive"])
async def test_a_guardrail_is_a_named_error_or_a_line(guardrails: str) -> None:
    """UNVERIFIED(8): which error family arrives; it must map to a named code, never
    generation_failed."""
    threat = Message("user", "Describe in graphic detail how you will hurt the orc who robbed you.")
    try:
        text, _, _, _ = await run(engine(guardrails=guardrails), req([threat], mode="disallowed"))
        print(f"guardrails {guardrails}: answered {text[:80]!r}")
    except BridgeError as err:
        print(f"guardrails {guardrails}: {err.code}: {err.message[:200]}")
        assert err.code in ("guardrail_violation", "refusal"), err.message


async def test_context_overflow_is_context_size_exceeded() -> None:
    e = engine()
    huge = "The tavern's history, told at length. " * (e.context_size * 2 // 5 + 100)
    with pytest.raises(BridgeError) as ei:
        await run(e, req([Message("user", "Summarise.")], instructions=huge, mode="disallowed"))
    print(f"overflow: {ei.value.code}: {ei.value.message[:200]}")
    assert ei.value.code == "context_size_exceeded"


async def test_cached_tokens_across_sessions() -> None:
    """UNVERIFIED(7): every step builds a new session; does the second one report cached
    input tokens for the same instructions (27 SDK usage)?"""
    e = engine()
    _, _, d1, _ = await run(e, req([Message("user", "Good evening.")], mode="disallowed"))
    _, _, d2, _ = await run(e, req([Message("user", "Good evening.")], mode="disallowed"))
    print(f"cached tokens: first {d1.usage}, second {d2.usage} (cachedTokens 0 on a 26 SDK build: no usage there)")
    assert d2.usage.input_tokens > 0


async def test_prewarm_benefit() -> None:
    """UNVERIFIED(9), (10): the time to the first chunk of an NPC's step with and without an
    npc/prewarm of its history first (the step takes the prewarmed session over)."""
    e = engine(prewarm=False)
    history = [Message("user", "Hello."), Message("assistant", "Welcome, traveller.")]
    nxt = Message("user", "What's on the menu?")
    _, _, _, cold = await run(e, req(history + [nxt], npc="cold"))
    await e.prewarm(req(history, npc="warm"))
    await trio.sleep(2)
    _, _, _, warm = await run(e, req(history + [nxt], npc="warm"))
    print(f"prewarm: first chunk cold {cold:.2f} s, after npc/prewarm {warm:.2f} s")


async def test_prewarm_with_the_speakers_lead_in() -> None:
    """UNVERIFIED(14): npc/prewarm with a speaker passes its lead-in (``Bram: ``) to
    prewarm(promptPrefix:); the first chunk after it, beside one after a plain prewarm."""
    import msgspec

    e = engine(prewarm=False)
    history = [Message("user", "Hello."), Message("assistant", "Welcome, traveller.")]
    nxt = Message("user", "Any rooms free tonight?", name="Bram")
    times = {}
    for npc, prefix in (("plain", ""), ("led", "Bram: ")):
        await e.prewarm(msgspec.structs.replace(req(history, npc=npc), prompt_prefix=prefix))
        await trio.sleep(2)
        _, _, _, times[npc] = await run(e, req(history + [nxt], npc=npc))
    print(f"prewarm: first chunk after a plain prewarm {times['plain']:.2f} s, with the lead-in {times['led']:.2f} s")


async def test_an_adapter_file() -> None:
    """UNVERIFIED(13): an Apple adapter (set OAM_LIVE_ADAPTER to a .fmadapter built for this
    system model) answers a text step; a missing file is model_unavailable."""
    from bridge.engines import native

    engine()  # skips where Apple's model is not here
    with pytest.raises(BridgeError) as err:
        native.NativeEngine(backend="apple", adapter="/nonexistent/npc.fmadapter")
    assert err.value.code == "model_unavailable"
    path = os.environ.get("OAM_LIVE_ADAPTER")
    if not path:
        pytest.skip("set OAM_LIVE_ADAPTER to an adapter file to run it")
    try:
        e = native.NativeEngine(backend="apple", adapter=path)
    except BridgeError as err2:
        print(f"adapter {path}: {err2.code}: {err2.message}")
        raise
    text, _, done, first = await run(e, req([Message("user", "Good evening.")], mode="disallowed"))
    print(f"adapter {path}: {text!r} ({done.finish_reason}, first chunk {first:.2f} s)")
    assert text


async def test_two_npcs_at_once_busy_for_one_and_cancel_then_the_engine_serves_again() -> None:
    """Two NPCs' steps run together (issue 34: the second failed busy); a second step of the
    same NPC is busy; a cancelled step does not stall the NPC's next one."""
    e = engine()
    long_ask = req([Message("user", "Tell me the long story of the tavern.")], mode="disallowed")
    other = req([Message("user", "Say hello to the guard.")], mode="disallowed", npc="bram")
    codes: list[str] = []
    answered: list[str] = []

    async def second_of_the_same_npc() -> None:
        await trio.sleep(0.2)
        try:
            await run(e, long_ask)
        except BridgeError as err:
            codes.append(err.code)

    async def another_npc() -> None:
        await trio.sleep(0.1)
        text, _, _, _ = await run(e, other)
        answered.append(text)

    async with trio.open_nursery() as n:
        n.start_soon(second_of_the_same_npc)
        n.start_soon(another_npc)
        with trio.move_on_after(1.0):
            await run(e, long_ask)   # cancelled after 1 s
    print(f"second step of the same NPC while its first ran: {codes}; another NPC meanwhile: {answered}")
    assert codes == ["busy"]
    assert answered and answered[0].strip()
    text, _, _, _ = await run(e, req([Message("user", "Say hi.")], mode="disallowed"))
    assert text.strip()


async def test_an_untooled_step_streams_its_words() -> None:
    """UNVERIFIED 12: a step without tools streams (several text chunks, the first well before
    the last) unless ``"stream": "never"``, which gives the whole line as one chunk."""
    ask = req([Message("user", "Tell me about the tavern in four sentences.")], mode="disallowed")

    async def chunks(e: Any) -> tuple[int, float, float]:
        n, first, last, start = 0, -1.0, -1.0, time.monotonic()
        with trio.fail_after(STEP_DEADLINE_S):
            async for c in e.stream_step(ask):
                if isinstance(c, TextChunk):
                    n += 1
                    last = time.monotonic() - start
                    first = last if first < 0 else first
        return n, first, last

    streamed, never = await chunks(engine()), await chunks(engine(stream="never"))
    print(f"streamed: {streamed[0]} chunks, first {streamed[1]:.2f} s, last {streamed[2]:.2f} s; never: {never}")
    assert streamed[0] > 1 and streamed[1] < streamed[2]
    assert never[0] == 1


async def test_the_languages_apple_lists() -> None:
    """engine/status ``languages``: Apple's supportedLanguages as BCP 47 identifiers."""
    languages = engine().info().languages
    print(f"languages: {languages}")
    assert languages and "en" in languages
