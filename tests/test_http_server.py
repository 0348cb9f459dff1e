"""``oam serve``, the OpenAI-compatible server (docs/http.md): the request mapping as plain
functions; the service's stateless-host turns (``resume``, ``return_calls``); the real
server, as a subprocess, driven by the official ``openai`` client and by ``curl``; the real
server in process where a test must see the service (a client that leaves cancels its
turn); and one round trip on the bundled model."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import trio

from bridge import EngineRegistry, ScriptedEngine, Service
from bridge import _messages as m
from bridge._http import create_app, plan_chat
from bridge.engines.base import Message, ToolCall, ToolSpec

from .conftest import ROOT

HAS_LLAMA_CPP = importlib.util.find_spec("llama_cpp") is not None
DEADLINE = 30
SERVE = [sys.executable, "-c", "import sys; from bridge._http import main; sys.exit(main(sys.argv[1:]))"]

DOOR = {"type": "function", "function": {"name": "open_door", "description": "Open a door", "parameters": {"type": "object", "properties": {"door": {"type": "string"}}, "required": ["door"]}}}
DICE = {"type": "function", "function": {"name": "roll_dice", "parameters": {"type": "object", "properties": {"sides": {"type": "integer"}}, "required": ["sides"]}}}


# ---- the mapping, no I/O ----


def test_a_conversation_is_split_into_instructions_history_and_the_prompt() -> None:
    plan = plan_chat({
        "model": "scripted",
        "messages": [
            {"role": "system", "content": "You keep the inn."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Welcome!"},
            {"role": "developer", "content": "Be brief."},
            {"role": "user", "content": [{"type": "text", "text": "Any "}, {"type": "text", "text": "ale?"}], "name": "Bram"},
        ],
    })
    assert plan.instructions == "You keep the inn.\n\nBe brief."
    assert plan.history == [[Message(role="user", content="Hi"), Message(role="assistant", content="Welcome!")]]
    assert (plan.prompt, plan.speaker, plan.resume) == ("Any ale?", "Bram", None)


def test_a_conversation_ending_in_tool_results_resumes_the_open_turn() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "open_door", "arguments": '{"door": "north"}'}}
    plan = plan_chat({
        "model": "scripted",
        "messages": [
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "Hello."},
            {"role": "user", "content": "Open the north door"},
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "c1", "content": "opened"},
        ],
        "tools": [DOOR],
    })
    assert len(plan.history) == 1 and plan.prompt == "Open the north door"
    assert plan.resume == [
        Message(role="user", content="Open the north door"),
        Message(role="assistant", content="", tool_calls=[ToolCall(id="c1", name="open_door", arguments={"door": "north"})]),
        Message(role="tool", content="opened", tool_call_id="c1", name="open_door"),
    ]


@pytest.mark.parametrize(
    ("body", "param", "reason"),
    [
        ({"n": 2}, "n", "unsupported_parameter"),
        ({"stop": ["\n"]}, "stop", "unsupported_parameter"),
        ({"logprobs": True}, "logprobs", "unsupported_parameter"),
        ({"presence_penalty": 0.5}, "presence_penalty", "unsupported_parameter"),
        ({"functions": []}, "functions", "unsupported_parameter"),
        ({"tool_choice": "sometimes"}, "tool_choice", "invalid_value"),
        ({"response_format": {"type": "xml"}}, "response_format", "invalid_value"),
        ({"tools": [{"type": "code_interpreter"}]}, "tools[0]", "unsupported_tool"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages[0]", "unsupported_content"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}, "messages", "invalid_value"),
        ({"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c9", "content": "x"}]}, "messages[1]", "unmatched_tool_message"),
    ],
)
def test_what_the_server_cannot_do_is_refused_naming_the_parameter(body: dict[str, Any], param: str, reason: str) -> None:
    from bridge.errors import BridgeError

    with pytest.raises(BridgeError) as e:
        plan_chat({"model": "scripted", "messages": [{"role": "user", "content": "hi"}], **body})
    assert (e.value.code, e.value.http_status, e.value.data["param"], e.value.data["reason"]) == ("invalid_request", 400, param, reason)


def test_a_tool_call_without_its_result_is_refused() -> None:
    from bridge.errors import BridgeError

    call = {"id": "c1", "type": "function", "function": {"name": "open_door", "arguments": "{}"}}
    with pytest.raises(BridgeError) as e:
        plan_chat({"model": "scripted", "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "tool_calls": [call]}, {"role": "user", "content": "well?"}]})
    assert e.value.data["reason"] == "unanswered_tool_call"


def test_neutral_values_of_unsupported_parameters_and_nulls_are_taken() -> None:
    plan = plan_chat({"model": "llama", "messages": [{"role": "user", "content": "hi"}], "n": 1, "stop": None, "presence_penalty": 0, "logprobs": False, "max_completion_tokens": 7, "temperature": 0.2, "seed": 3})
    assert (plan.options.max_tokens, plan.options.temperature, plan.options.seed) == (7, 0.2, 3)


# ---- the service: a turn that resumes from tool results and hands its calls back ----

INVENTORY = ToolSpec(name="check_inventory", parameters={"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]})


async def _turn_events(svc: Service, turn_id: str) -> list[m.Event]:
    with trio.fail_after(DEADLINE):
        return [ev async for ev in svc.events(turn_id)]


async def test_a_return_calls_turn_completes_with_its_calls_and_requests_nothing() -> None:
    engine = ScriptedEngine()
    async with Service.running(EngineRegistry(default="scripted", scripted=engine)) as svc:
        script = [{"text": "Let me look.", "toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]}]
        await svc.create(m.NpcConfig(npc_id="keeper", tools=[INVENTORY], script=script))
        turn = svc.respond(m.RespondParams(npc_id="keeper", prompt="Any ale?"), return_calls=True)
        events = await _turn_events(svc, turn.turn_id)
        assert not any(isinstance(e, (m.ToolCallRequested, m.ToolCallCompleted)) for e in events)
        done = events[-1]
        assert isinstance(done, m.TurnCompleted) and done.finish_reason == "tool_calls" and done.text == "Let me look."
        assert done.tool_calls == [m.ToolRecord("c1", "check_inventory", {"item": "ale"})]
        assert svc.transcript(m.NpcRef(npc_id="keeper")).turns == [], "an open turn is not committed"


async def test_refused_calls_are_answered_with_their_error_and_the_model_tries_again() -> None:
    engine = ScriptedEngine()
    async with Service.running(EngineRegistry(default="scripted", scripted=engine)) as svc:
        script = [
            {"toolCalls": [{"id": "bad", "name": "check_inventory", "arguments": {"item": 5}}]},
            {"toolCalls": [{"id": "good", "name": "check_inventory", "arguments": {"item": "ale"}}]},
        ]
        await svc.create(m.NpcConfig(npc_id="keeper", tools=[INVENTORY], script=script))
        turn = svc.respond(m.RespondParams(npc_id="keeper", prompt="Any ale?"), return_calls=True)
        done = (await _turn_events(svc, turn.turn_id))[-1]
        assert isinstance(done, m.TurnCompleted) and done.finish_reason == "tool_calls"
        assert [(r.call_id, r.error is None) for r in done.tool_calls] == [("bad", False), ("good", True)]
        second = engine.requests[-1].messages
        assert second[-1].role == "tool" and second[-1].is_error and "invalid arguments" in second[-1].content


async def test_a_resumed_turn_continues_from_the_tool_output_without_a_new_user_line() -> None:
    engine = ScriptedEngine()
    async with Service.running(EngineRegistry(default="scripted", scripted=engine)) as svc:
        await svc.create(m.NpcConfig(npc_id="keeper", tools=[INVENTORY], script=[{"text": "Three barrels."}]))
        opened = [
            Message(role="user", content="Any ale?"),
            Message(role="assistant", content="", tool_calls=[ToolCall(id="c1", name="check_inventory", arguments={"item": "ale"})]),
            Message(role="tool", content='{"count": 3}', tool_call_id="c1", name="check_inventory"),
        ]
        turn = svc.respond(m.RespondParams(npc_id="keeper", prompt="Any ale?", tool_choice="required"), resume=opened, return_calls=True)
        done = (await _turn_events(svc, turn.turn_id))[-1]
        # tool_choice applies to the turn's first step, which is this one: required and answered
        # in words fails, as it would on any first step
        assert isinstance(done, m.TurnFailed) and done.error.code == "generation_failed"
        assert engine.requests[-1].messages == opened and engine.requests[-1].tool_mode == "required"
        turn = svc.respond(m.RespondParams(npc_id="keeper", prompt="Any ale?"), resume=opened, return_calls=True)
        done = (await _turn_events(svc, turn.turn_id))[-1]
        assert isinstance(done, m.TurnCompleted) and done.text == "You said: Any ale?"
        assert svc.transcript(m.NpcRef(npc_id="keeper")).turns == [[*opened, Message(role="assistant", content="You said: Any ale?")]]


async def test_events_dropped_by_a_reader_that_left_are_not_kept() -> None:
    async with Service.running(EngineRegistry(default="scripted")) as svc:
        await svc.create(m.NpcConfig(npc_id="bard", script=[{"text": "la " * 200, "chunkMs": 1}]))
        turn = svc.respond(m.RespondParams(npc_id="bard", prompt="sing"))
        events = svc.events(turn.turn_id)
        with trio.fail_after(DEADLINE):
            await events.__anext__()
            await events.aclose()
            svc.drop_events(turn.turn_id)
            svc.delete(m.NpcRef(npc_id="bard"))
            await svc.wait_idle()
        kept = svc._turn_events  # noqa: SLF001 - the bound is what is at stake
        assert kept is not None and kept._count == 0 and not kept._queues and not kept._dropped  # noqa: SLF001
