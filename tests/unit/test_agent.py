"""The agent on its own: one ``Npc`` with a fake event sink and the scripted engine, no
server. Each test names the rule it checks: seq under cancellation, cancel then submit, turn
cost, schema hardening, script validation, internal errors, bounded memory, and the one
engine contract."""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import pytest
import trio
import trio.testing

from bridge.core import _messages as m
from bridge.core.agent import COUNT_CHUNK, check_schema, count_text_tokens
from bridge.engines.base import Chunk, Message, StepDone, StepRequest, TextChunk, ToolSpec
from bridge.engines.scripted import ScriptedEngine, validate_script
from bridge.errors import BridgeError
from tests.support.agent import Sink, history, make_npc, respond, running

INVENTORY = ToolSpec(
    "check_inventory",
    "Count an item.",
    {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
)
DOOR = ToolSpec(
    "open_door", "Open a door.", {"type": "object", "properties": {"door": {"type": "string"}}, "required": ["door"]}
)
MAIL = ToolSpec(
    "send_mail",
    "Mail someone.",
    {
        "type": "object",
        "properties": {"to": {"type": "string", "format": "email"}, "on": {"type": "string", "format": "date"}},
    },
)


def call(id_: str, name: str = "check_inventory", **args: Any) -> dict[str, Any]:
    return {"id": id_, "name": name, "arguments": args or {"item": "ale"}}


# ---- seq and cancellation: gap-free while the game does not read, and cancel before submit ----


async def test_seq_stays_gap_free_when_cancelled_while_the_sink_is_full() -> None:
    engine = ScriptedEngine()
    sink = Sink(room=20)
    npc = make_npc(engine, sink)
    engine.set_script("n", [{"text": "word " * 500}])
    async with running(npc):
        tid = respond(npc)
        await sink.wait_for(lambda: len(sink.events) >= 20)  # the game stopped reading
        await trio.testing.wait_all_tasks_blocked()
        assert npc.cancel() == [tid]
        done = await sink.terminal(tid)
    assert isinstance(done, m.TurnFailed) and done.error.code == "cancelled"
    assert done.seq == 20, "the cancelled wait for room took no seq"
    sink.assert_well_formed(tid)


async def test_cancel_then_submit_in_one_go_refuses_the_submit_and_withdraws_the_call() -> None:
    engine = ScriptedEngine()
    sink = Sink()
    npc = make_npc(engine, sink, [INVENTORY])
    engine.set_script("n", [{"toolCalls": [call("c1"), call("c2", item="mead")]}, {"text": "never"}])
    async with running(npc):
        tid = respond(npc)
        await sink.wait_for(lambda: len([e for e in sink.of(tid) if isinstance(e, m.ToolCallRequested)]) == 2)
        # one write: cancel, then a submit for the same call, with no checkpoint between
        assert npc.cancel() == [tid]
        with pytest.raises(BridgeError) as e:
            npc.submit(m.SubmitParams(npc_id="n", call_id="c1", output=3))
        assert e.value.code == "unknown_tool_call"
        done = await sink.terminal(tid)
    evs = sink.of(tid)
    withdrawn = [e for e in evs if isinstance(e, m.ToolCallWithdrawn)]
    assert sorted((w.call_id, w.reason) for w in withdrawn) == [("c1", "cancelled"), ("c2", "cancelled")]
    assert not [e for e in evs if isinstance(e, m.ToolCallCompleted)]
    assert isinstance(done, m.TurnFailed) and done.error.code == "cancelled"
    assert all(w.seq < done.seq for w in withdrawn)
    sink.assert_well_formed(tid)
    assert npc.turns == [], "rolled back"


async def test_an_answered_call_is_reported_completed_even_when_the_turn_is_cancelled_at_once() -> None:
    engine = ScriptedEngine()
    sink = Sink()
    npc = make_npc(engine, sink, [INVENTORY])
    engine.set_script("n", [{"toolCalls": [call("c1"), call("c2", item="mead")]}, {"text": "never"}])
    async with running(npc):
        tid = respond(npc)
        await sink.wait_for(lambda: len([e for e in sink.of(tid) if isinstance(e, m.ToolCallRequested)]) == 2)
        npc.submit(m.SubmitParams(npc_id="n", call_id="c1", output=3))
        npc.cancel()
        await sink.terminal(tid)
    evs = sink.of(tid)
    assert [(e.call_id, e.output) for e in evs if isinstance(e, m.ToolCallCompleted)] == [("c1", 3)]
    assert [(e.call_id, e.reason) for e in evs if isinstance(e, m.ToolCallWithdrawn)] == [("c2", "cancelled")]
    sink.assert_well_formed(tid)


async def test_a_timed_out_call_is_withdrawn_and_the_model_gets_an_error() -> None:
    engine = ScriptedEngine()
    sink = Sink()
    npc = make_npc(engine, sink, [INVENTORY])
    engine.set_script("n", [{"toolCalls": [call("c1")]}, {"text": "slow cellar"}])
    async with running(npc):
        tid = respond(npc, tool_timeout_ms=20)
        done = await sink.terminal(tid)
    assert isinstance(done, m.TurnCompleted) and "did not answer" in (done.tool_calls[0].error or "")
    assert [(e.call_id, e.reason) for e in sink.of(tid) if isinstance(e, m.ToolCallWithdrawn)] == [("c1", "timeout")]
    assert not [e for e in sink.of(tid) if isinstance(e, m.ToolCallCompleted)], (
        "a withdrawn call ends once: no toolCallCompleted"
    )
    sink.assert_well_formed(tid)


async def test_cancel_reports_each_turn_once_and_queued_turns_still_end() -> None:
    engine = ScriptedEngine()
    sink = Sink()
    npc = make_npc(engine, sink)
    engine.set_script("n", [{"text": "slow", "delayMs": 5000}])
    async with running(npc):
        first, second = respond(npc), respond(npc)
        await sink.first(first, m.TurnStarted)
        assert npc.cancel() == [first, second]
        assert npc.cancel() == [], "nothing left to cancel"
        for tid in (first, second):
            done = await sink.terminal(tid)
            assert isinstance(done, m.TurnFailed) and done.error.code == "cancelled"
            sink.assert_well_formed(tid)
        with pytest.raises(BridgeError):
            npc.submit(m.SubmitParams(npc_id="n", call_id="x"))


class GateEngine(ScriptedEngine):
    """Answers "done" once ``gate`` is set."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = trio.Event()

    async def stream_step(self, request: StepRequest) -> AsyncIterator[Chunk]:
        await self.gate.wait()
        yield TextChunk("done")
        yield StepDone()


async def test_a_cancel_that_lands_as_the_answer_arrives_still_rolls_back() -> None:
    engine = GateEngine()
    sink = Sink(checkpoint=False)
    npc = make_npc(engine, sink)
    async with running(npc):
        tid = respond(npc)
        await trio.testing.wait_all_tasks_blocked()
        engine.gate.set()  # the turn's task is scheduled to go on...
        assert npc.cancel() == [tid]  # ...and is cancelled before it runs
        done = await sink.terminal(tid)
    assert isinstance(done, m.TurnFailed) and done.error.code == "cancelled"
    assert npc.turns == [], "a cancelled turn never commits"
    sink.assert_well_formed(tid)


async def test_a_worker_cancelled_from_outside_still_ends_every_turn() -> None:
    engine = ScriptedEngine()
    sink = Sink()
    npc = make_npc(engine, sink, [INVENTORY])
    engine.set_script("n", [{"toolCalls": [call("c1")]}])
    async with trio.open_nursery() as nursery:
        nursery.start_soon(npc.worker)
        first, second = respond(npc), respond(npc)
        await sink.first(first, m.ToolCallRequested)
        nursery.cancel_scope.cancel()
    for tid in (first, second):
        assert isinstance(sink.of(tid)[-1], m.TurnFailed)
        sink.assert_well_formed(tid)
    assert [e.reason for e in sink.of(first) if isinstance(e, m.ToolCallWithdrawn)] == ["cancelled"]


# ---- our own bugs are internal_error ----


async def test_an_unexpected_exception_fails_the_turn_as_internal_error(caplog: pytest.LogCaptureFixture) -> None:
    def broken(request: StepRequest) -> dict[str, Any]:
        raise ValueError("secret detail")

    engine = ScriptedEngine()
    sink = Sink()
    npc = make_npc(engine, sink)
    engine.set_script("n", [broken])
    with caplog.at_level(logging.ERROR, logger="oam_bridge.agent"):
        async with running(npc):
            done = await sink.terminal(respond(npc))
    assert isinstance(done, m.TurnFailed)
    assert (done.error.code, done.error.retryable) == ("internal_error", False)
    assert "ValueError" in done.error.message and "secret" not in done.error.message
    assert any(r.exc_info and "secret detail" in str(r.exc_info[1]) for r in caplog.records), "traceback logged"


async def test_an_engine_error_keeps_its_stable_code() -> None:
    engine = ScriptedEngine()
    sink = Sink()
    npc = make_npc(engine, sink)
    engine.set_script("n", [{"error": "guardrail_violation", "message": "no"}])
    async with running(npc):
        done = await sink.terminal(respond(npc))
    assert isinstance(done, m.TurnFailed) and (done.error.code, done.error.message) == ("guardrail_violation", "no")
    assert done.error.data is None and "data" not in msgspec.json.decode(msgspec.json.encode(done.error))


async def test_a_rate_limits_retry_after_reaches_turn_failed_as_data() -> None:
    """A game backs off as long as the engine said (``turn/failed`` ``error.data``), and only
    the figures a game acts on are passed on."""
    engine = ScriptedEngine()
    sink = Sink()
    npc = make_npc(engine, sink)
    engine.set_script("n", [{"error": "rate_limited", "data": {"retryAfterMs": 1500}}])
    async with running(npc):
        done = await sink.terminal(respond(npc))
    assert isinstance(done, m.TurnFailed)
    assert (done.error.code, done.error.retryable, done.error.data) == ("rate_limited", True, {"retryAfterMs": 1500})
    assert BridgeError("rate_limited", "x", status=429, retryAfterMs=5).to_event()["data"] == {"retryAfterMs": 5}


@pytest.mark.parametrize(
    "data", [{"retryAfterMs": -1}, {"retryAfterMs": "soon"}, {"when": 3}, {"retryAfterMs": 2**53}, None]
)
def test_an_error_steps_data_is_checked(data: object) -> None:
    with pytest.raises(BridgeError) as e:
        validate_script([{"error": "rate_limited", "data": data}])
    assert e.value.data["reason"] == "invalid_script"


# ---- the engine contract ----


async def test_calls_on_a_disallowed_step_are_ignored_with_a_warning() -> None:
    engine = ScriptedEngine()
    sink = Sink()
    npc = make_npc(engine, sink, [INVENTORY])
    engine.set_script("n", [{"text": "No tools today.", "toolCalls": [call("c1")]}])
    async with running(npc):
        tid = respond(npc, tool_choice="none")
        done = await sink.terminal(tid)
    assert isinstance(done, m.TurnCompleted) and done.text == "No tools today." and done.tool_calls == []
    assert any("disallowed" in w for w in done.warnings)
    assert not [e for e in sink.of(tid) if isinstance(e, (m.ToolCallRequested, m.ToolCallCompleted))]
    assert engine.requests[0].tools == [] and engine.requests[0].tool_mode == "disallowed"


async def test_a_required_step_answered_with_text_fails_generation_failed() -> None:
    engine = ScriptedEngine()
    sink = Sink()
    npc = make_npc(engine, sink, [INVENTORY, DOOR])
    engine.set_script("n", [{"text": "I will not."}, {"text": "Nor I."}])
    async with running(npc):
        for choice in ("required", m.NamedTool(tool="open_door")):
            done = await sink.terminal(respond(npc, tool_choice=choice))
            assert isinstance(done, m.TurnFailed)
            assert (done.error.code, done.error.retryable) == ("generation_failed", True)
            assert "without calling a tool" in done.error.message
    assert npc.turns == []


async def test_a_call_to_a_tool_not_shown_on_the_step_is_an_error_output_and_the_turn_goes_on() -> None:
    engine = ScriptedEngine()
    sink = Sink()
    npc = make_npc(engine, sink, [INVENTORY, DOOR])
    engine.set_script("n", [{"toolCalls": [call("a"), call("b", "fly")]}, {"text": "Hm."}])
    async with running(npc):
        tid = respond(npc, tool_choice=m.NamedTool(tool="open_door"))
        done = await sink.terminal(tid)
    assert isinstance(done, m.TurnCompleted) and done.text == "Hm."
    errors = {t.call_id: t.error for t in done.tool_calls}
    assert "not offered on this step" in (errors["a"] or "") and "unknown tool" in (errors["b"] or "")
    assert not [e for e in sink.of(tid) if isinstance(e, m.ToolCallRequested)], "the game never sees them"
    tool_msgs = [(x.tool_call_id, x.is_error) for x in engine.requests[1].messages if x.role == "tool"]
    assert tool_msgs == [("a", True), ("b", True)], "the model sees the errors"


async def test_format_violations_become_error_outputs_and_never_reach_the_game() -> None:
    engine = ScriptedEngine()
    sink = Sink()
    npc = make_npc(engine, sink, [MAIL])
    good = {"to": "greta@tavern.example", "on": "2026-12-02"}
    engine.set_script(
        "n",
        [
            {
                "toolCalls": [
                    {"id": "bad1", "name": "send_mail", "arguments": {"to": "not an address"}},
                    {"id": "bad2", "name": "send_mail", "arguments": {"on": "yesterday"}},
                    {"id": "ok", "name": "send_mail", "arguments": good},
                ]
            },
            {"text": "Sent one."},
        ],
    )
    async with running(npc):
        tid = respond(npc)
        req = await sink.first(tid, m.ToolCallRequested)
        npc.submit(m.SubmitParams(npc_id="n", call_id=req.call_id, output="sent"))
        done = await sink.terminal(tid)
    assert [e.call_id for e in sink.of(tid) if isinstance(e, m.ToolCallRequested)] == ["ok"]
    assert isinstance(done, m.TurnCompleted)
    errors = {t.call_id: t.error for t in done.tool_calls}
    assert "email" in (errors["bad1"] or "") and "date" in (errors["bad2"] or "") and errors["ok"] is None


async def test_a_structured_answer_cut_off_by_max_tokens_says_so() -> None:
    engine = ScriptedEngine()
    sink = Sink()
    npc = make_npc(engine, sink)
    engine.set_script(
        "n", [{"text": '{"mood": "hap', "finishReason": "length"}, {"text": "{oops", "finishReason": "stop"}]
    )
    schema = {"type": "object", "properties": {"mood": {"type": "string"}}}
    async with running(npc):
        cut = await sink.terminal(respond(npc, schema=schema))
        bad = await sink.terminal(respond(npc, schema=schema))
    assert isinstance(cut, m.TurnFailed) and cut.error.code == "generation_failed" and "maxTokens" in cut.error.message
    assert (
        isinstance(bad, m.TurnFailed) and bad.error.code == "generation_failed" and "maxTokens" not in bad.error.message
    )


# ---- trimming and turn cost: a turn's cost does not grow with the history ----


def old_visible(
    engine: ScriptedEngine,
    instructions: str,
    history: list[list[Message]],
    working: list[Message],
    tools: list[ToolSpec],
    budget: int,
) -> list[Message] | None:
    """The trimming of commit d14face: drop the oldest turn until the prompt fits."""
    for dropped in range(len(history) + 1):
        msgs = [x for t in history[dropped:] for x in t] + working
        if engine.count_tokens(instructions, msgs, tools) <= budget:
            return msgs
    return None


async def test_trimming_shows_what_dropping_the_oldest_turn_until_it_fits_showed() -> None:
    engine = ScriptedEngine(context_size=400)
    sink = Sink()
    npc = make_npc(engine, sink, [INVENTORY, DOOR], options=m.GenerationOptions(max_tokens=40))
    mismatches: list[int] = []
    checked = 0

    def check(reply: dict[str, Any]) -> Callable[[StepRequest], dict[str, Any]]:
        def step(req: StepRequest) -> dict[str, Any]:
            nonlocal checked
            last_user = max(i for i, x in enumerate(req.messages) if x.role == "user")
            working = req.messages[last_user:]
            want = old_visible(engine, req.instructions, npc.turns, working, req.tools, 400 - 40)
            checked += 1
            if req.messages != want:
                mismatches.append(req.step_index)
            return reply

        return step

    script: list[Any] = []
    for i in range(30):
        if i % 3 == 0:
            script += [
                check({"toolCalls": [call(f"c{i}", item="ale " * (i % 7))]}),
                check({"text": "counted " * (i % 5 + 1)}),
            ]
        else:
            script.append(check({"text": "fine " * (i % 11 + 1)}))
    engine.set_script("n", script)
    async with running(npc):
        for i in range(30):
            tid = respond(
                npc,
                f"turn {i} " + "blah " * (i % 13 + 3),
                tool_choice="none" if i % 3 == 2 else "auto",
                tool_timeout_ms=1,
            )
            done = await sink.terminal(tid)
            assert isinstance(done, m.TurnCompleted), done
    assert checked == 40 and mismatches == []
    trims = [e for e in sink.events if isinstance(e, m.ContextTrimmed)]
    assert trims and all(t.prompt_tokens <= 400 - 40 for t in trims)
    assert len(npc.turns) == 30, "history keeps every turn"


@pytest.mark.parametrize(("context_size", "kept"), [(60, 3), (59, 2), (47, 2), (46, 1), (34, 1), (33, 0)])
async def test_a_prompt_that_fills_the_window_exactly_still_fits(context_size: int, kept: int) -> None:
    # instructions 6 tokens, each turn 13, the prompt "?" 5, maxTokens 10 reserved
    engine = ScriptedEngine(context_size=context_size)
    sink = Sink()
    npc = make_npc(engine, sink, options=m.GenerationOptions(max_tokens=10))
    npc.set_history(history(3))
    async with running(npc):
        done = await sink.terminal(respond(npc))
    assert isinstance(done, m.TurnCompleted)
    assert len(engine.requests[-1].messages) == 2 * kept + 1


async def test_a_prompt_that_cannot_fit_fails_context_size_exceeded() -> None:
    engine = ScriptedEngine(context_size=300)
    sink = Sink()
    npc = make_npc(engine, sink, options=m.GenerationOptions(max_tokens=20))
    async with running(npc):
        done = await sink.terminal(respond(npc, "x " * 400))
    assert isinstance(done, m.TurnFailed) and done.error.code == "context_size_exceeded"
    assert len(engine.requests) == 0, "the engine was never asked"


class CountingEngine(ScriptedEngine):
    """Counts count_tokens calls, the messages they cover, and the threads they run on."""

    def __init__(self, *a: Any, blocking: bool = False, **kw: Any) -> None:
        super().__init__(*a, **kw)
        self.blocking_count = blocking  # type: ignore[misc]
        self.calls = 0
        self.messages = 0
        self.threads: set[bool] = set()

    def count_tokens(self, instructions: str, messages: list[Message], tools: list[ToolSpec]) -> int:
        self.calls += 1
        self.messages += len(messages)
        self.threads.add(threading.current_thread() is threading.main_thread())
        return super().count_tokens(instructions, messages, tools)


@pytest.mark.parametrize("size", [100, 10_000])
async def test_a_turn_counts_only_its_new_messages_whatever_the_history(size: int) -> None:
    engine = CountingEngine(context_size=4096)
    sink = Sink()
    npc = make_npc(engine, sink, [INVENTORY])
    npc.set_history(history(size))
    async with running(npc):
        await sink.terminal(respond(npc, "warm up"))  # counts the window's turns, once
        engine.calls = engine.messages = 0
        for i in range(20):
            done = await sink.terminal(respond(npc, f"turn {i}"))
            assert isinstance(done, m.TurnCompleted)
    # per turn: the prompt, and the answer; the instructions+tools count is cached
    assert (engine.calls, engine.messages) == (20 * 2, 20 * 2)
    assert len(npc.turns) == size + 21


async def test_a_tool_round_counts_only_the_messages_it_adds() -> None:
    engine = CountingEngine(context_size=4096)
    sink = Sink()
    npc = make_npc(engine, sink, [INVENTORY])
    npc.set_history(history(1000))
    engine.set_script("n", [{"text": "warm"}, {"toolCalls": [call("c1"), call("c2")]}, {"text": "two barrels"}])
    async with running(npc):
        await sink.terminal(respond(npc, "warm up"))
        engine.calls = engine.messages = 0
        done = await sink.terminal(respond(npc, "ale?", tool_timeout_ms=1))
    assert isinstance(done, m.TurnCompleted)
    # prompt (1 message), the round (assistant + 2 tool messages), the answer (1)
    assert (engine.calls, engine.messages) == (3, 5)


async def test_restoring_a_long_history_counts_only_as_far_back_as_the_window_reaches() -> None:
    engine = CountingEngine(context_size=4096)
    sink = Sink()
    npc = make_npc(engine, sink)
    with trio.fail_after(2):
        npc.set_history(history(48_000))
    assert engine.calls == 0, "restore counts nothing"
    async with running(npc):
        done = await sink.terminal(respond(npc))
    assert isinstance(done, m.TurnCompleted)
    kept = len(engine.requests[-1].messages) // 2
    # every visible turn once, plus at most one chunk beyond the window's start
    assert engine.messages <= 2 * (kept + COUNT_CHUNK) + 10
    trims = [e for e in sink.events if isinstance(e, m.ContextTrimmed)]
    assert trims[-1].dropped_turns == 48_000 - trims[-1].kept_turns and trims[-1].kept_turns == kept


async def test_slow_engines_count_in_a_worker_thread() -> None:
    engine = CountingEngine(blocking=True)
    sink = Sink()
    npc = make_npc(engine, sink)
    npc.set_history(history(50))
    async with running(npc):
        await sink.terminal(respond(npc))
        assert await npc.prompt_tokens() > 0
    assert await count_text_tokens(engine, "three little words") == 7  # 3 words + a message's 4
    assert engine.threads == {False}, "never on the event loop's thread"


async def test_prompt_tokens_is_the_engines_count_of_what_the_model_would_see() -> None:
    engine = ScriptedEngine(context_size=500)
    sink = Sink()
    npc = make_npc(engine, sink, [INVENTORY], options=m.GenerationOptions(max_tokens=50))
    npc.set_history(history(200))
    n = await npc.prompt_tokens()
    fitting = old_visible(engine, npc.instructions, npc.turns, [], [INVENTORY], 450)
    assert fitting is not None and n == engine.count_tokens(npc.instructions, fitting, [INVENTORY]) <= 450
    assert await count_text_tokens(engine, "three little words") == 7


async def test_reset_clears_history_counts_and_the_engines_state() -> None:
    engine = ScriptedEngine()
    sink = Sink()
    npc = make_npc(engine, sink, script=[{"text": "first"}, {"text": "second"}])
    engine.set_script("n", [{"text": "first"}, {"text": "second"}])
    async with running(npc):
        await sink.terminal(respond(npc))
        before = await npc.prompt_tokens()
        npc.reset()
        assert npc.turns == [] and not [r for r in engine.requests if r.npc_id == "n"]
        assert await npc.prompt_tokens() < before
        done = await sink.terminal(respond(npc))
    assert isinstance(done, m.TurnCompleted) and done.text == "first", "the script starts again"
    assert len(npc.turns) == 1


# ---- schemas: a bad one is invalid_schema, never an internal error ----


@pytest.mark.parametrize(
    "schema",
    [
        {"$schema": 5},
        {"$schema": ["x"]},
        {"$schema": {"a": 1}},
        {"$schema": "https://example.com/my-own-draft"},
        {"type": "objekt"},
        {"type": "object", "pattern": "("},
        {"type": "object", "properties": {"a": {"$ref": "https://example.com/x.json"}}},
        {"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}},
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}},
        {"type": "object", "properties": {"a": {"$ref": "#nowhere"}}},
        {"$ref": "#"},
        {
            "type": "object",
            "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"allOf": [{"$ref": "#/$defs/a"}]}},
            "properties": {"x": {"$ref": "#/$defs/a"}},
        },
        [],
        "object",
    ],
)
def test_bad_schemas_are_invalid_schema_never_an_internal_error(schema: Any) -> None:
    with pytest.raises(BridgeError) as e:
        check_schema(schema, "schema")
    assert e.value.code == "invalid_schema"


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/s"}}, "$defs": {"s": {"type": "string"}}},
        {"type": "object", "properties": {"a": {"$ref": "#/definitions/s"}}, "definitions": {"s": {"type": "string"}}},
        {"type": "object", "properties": {"a": {"$ref": "#s"}}, "$defs": {"s": {"$anchor": "s", "type": "string"}}},
        {"type": "object", "properties": {"child": {"$ref": "#"}}},
        {"type": "object", "properties": {"enum": {"type": "string"}}, "const": {"$ref": "https://not.a.ref"}},
        {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object"},
        {"type": "object", "properties": {"to": {"type": "string", "format": "email"}}},
    ],
)
def test_good_schemas_pass(schema: Any) -> None:
    check_schema(schema, "schema", tool=True)


@pytest.mark.parametrize(
    "schema", [{}, {"type": "string"}, {"type": ["object", "null"]}, {"$schema": 5, "type": "object"}]
)
def test_tool_parameters_must_be_an_object_schema(schema: dict[str, Any]) -> None:
    with pytest.raises(BridgeError) as e:
        check_schema(schema, "parameters", tool=True)
    assert e.value.code == "invalid_schema"


# ---- scripted engine: a bad script refused where it is given, memory bounded ----


@pytest.mark.parametrize(
    "step",
    [
        {"text": 5},
        {"delayMs": -1},
        {"chunkMs": -0.5},
        "hello",
        5,
        None,
        {"toolCalls": [{"arguments": {}}]},
        {"toolCalls": [{"name": 3}]},
        {"toolCalls": "open_door"},
        {"error": "refusal", "message": 0},
        {"warnings": [{}]},
        {"warnings": "one"},
        {"finishReason": 1},
        {"txet": "typo"},
    ],
)
def test_bad_script_steps_are_invalid_params_at_once(step: Any) -> None:
    engine = ScriptedEngine()
    for attempt in (
        lambda: engine.set_script("n", [{"text": "ok"}, step]),
        lambda: validate_script([step]),
        lambda: ScriptedEngine(script=[step]),
    ):
        with pytest.raises(BridgeError) as e:
            attempt()
        assert (e.value.code, e.value.data.get("reason")) == ("invalid_params", "invalid_script")
    assert "n" not in engine._npc_scripts, "a refused script changes nothing"


def test_good_script_steps_and_callables_are_accepted() -> None:
    validate_script(
        [
            {"text": "Hello", "delayMs": 2.0, "chunkMs": 0},
            {
                "toolCalls": [{"name": "open_door"}, {"id": "c1", "name": "x", "arguments": {"a": 1}}],
                "text": "Wait.",
                "warnings": ["w"],
            },
            {"json": {"a": [1, 2]}},
            {"json": None},
            {"error": "guardrail_violation", "message": "no"},
            {"text": "cut", "finishReason": "length"},
            lambda req: {"text": "dynamic"},
        ]
    )
    with pytest.raises(BridgeError):
        validate_script({"text": "not a list"})


def test_a_script_file_is_validated(tmp_path: Any) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"default": [{"text": "hi"}], "npcs": {"guard": [{"delayMs": -1}]}}))
    with pytest.raises(BridgeError) as e:
        ScriptedEngine.from_file(str(bad))
    assert e.value.data["reason"] == "invalid_script"
    good = tmp_path / "good.json"
    good.write_text(
        json.dumps({"default": [{"text": "hi"}], "npcs": {"guard": [{"text": "Halt!"}]}, "contextSize": 1000})
    )
    assert ScriptedEngine.from_file(str(good)).context_size == 1000


async def test_the_scripted_engine_keeps_a_bounded_number_of_requests_and_forgets_an_npc() -> None:
    engine = ScriptedEngine(max_requests=16)
    sink = Sink()
    a, b = make_npc(engine, sink, npc_id="a"), make_npc(engine, sink, npc_id="b")
    engine.set_script("a", [{"text": "x " * 50}] * 40)
    async with running(a), running(b):
        for _ in range(40):
            await sink.terminal(respond(a, "long prompt " * 100))
        await sink.terminal(respond(b))
        assert len(engine.requests) == 16 and engine.requests[-1].npc_id == "b"
        engine.forget("a")
    assert [r.npc_id for r in engine.requests] == ["b"]
    assert "a" not in engine._npc_scripts and "a" not in engine._cursor
