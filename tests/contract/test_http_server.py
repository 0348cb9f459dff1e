"""``oam serve``, the OpenAI-compatible server (docs/http.md): the request mapping as plain
functions; the service's stateless-host turns (``resume``, ``return_calls``); the real
server, as a subprocess, driven by the official ``openai`` client and by ``curl``; the real
server in process where a test must see the service (a client that leaves cancels its
turn); and one round trip on the bundled model."""

from __future__ import annotations

import json
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
from bridge.core import _messages as m
from bridge.engines.base import Message, ToolCall, ToolSpec
from bridge.hosts.http._plan import plan_chat
from bridge.hosts.http.app import create_app
from tests.support.harness import ROOT

DEADLINE = 30
SERVE = [sys.executable, "-c", "import sys; from bridge.hosts.http.app import main; sys.exit(main(sys.argv[1:]))"]

DOOR = {
    "type": "function",
    "function": {
        "name": "open_door",
        "description": "Open a door",
        "parameters": {"type": "object", "properties": {"door": {"type": "string"}}, "required": ["door"]},
    },
}
DICE = {
    "type": "function",
    "function": {
        "name": "roll_dice",
        "parameters": {"type": "object", "properties": {"sides": {"type": "integer"}}, "required": ["sides"]},
    },
}


# ---- the mapping, no I/O ----


def test_a_conversation_is_split_into_instructions_history_and_the_prompt() -> None:
    plan = plan_chat(
        {
            "model": "scripted",
            "messages": [
                {"role": "system", "content": "You keep the inn."},
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Welcome!"},
                {"role": "developer", "content": "Be brief."},
                {
                    "role": "user",
                    "content": [{"type": "text", "text": "Any "}, {"type": "text", "text": "ale?"}],
                    "name": "Bram",
                },
            ],
        }
    )
    assert plan.instructions == "You keep the inn.\n\nBe brief."
    assert plan.history == [[Message(role="user", content="Hi"), Message(role="assistant", content="Welcome!")]]
    assert (plan.prompt, plan.speaker, plan.resume) == ("Any ale?", "Bram", None)


def test_a_conversation_ending_in_tool_results_resumes_the_open_turn() -> None:
    call = {"id": "c1", "type": "function", "function": {"name": "open_door", "arguments": '{"door": "north"}'}}
    plan = plan_chat(
        {
            "model": "scripted",
            "messages": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."},
                {"role": "user", "content": "Open the north door"},
                {"role": "assistant", "content": None, "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "opened"},
            ],
            "tools": [DOOR],
        }
    )
    assert len(plan.history) == 1 and plan.prompt == "Open the north door"
    assert plan.resume == [
        Message(role="user", content="Open the north door"),
        Message(
            role="assistant", content="", tool_calls=[ToolCall(id="c1", name="open_door", arguments={"door": "north"})]
        ),
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
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
            "messages[0]",
            "unsupported_content",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]},
            "messages",
            "invalid_value",
        ),
        (
            {"messages": [{"role": "user", "content": "hi"}, {"role": "tool", "tool_call_id": "c9", "content": "x"}]},
            "messages[1]",
            "unmatched_tool_message",
        ),
    ],
)
def test_what_the_server_cannot_do_is_refused_naming_the_parameter(
    body: dict[str, Any], param: str, reason: str
) -> None:
    from bridge.errors import BridgeError

    with pytest.raises(BridgeError) as e:
        plan_chat({"model": "scripted", "messages": [{"role": "user", "content": "hi"}], **body})
    assert (e.value.code, e.value.http_status, e.value.data["param"], e.value.data["reason"]) == (
        "invalid_request",
        400,
        param,
        reason,
    )


def test_a_tool_call_without_its_result_is_refused() -> None:
    from bridge.errors import BridgeError

    call = {"id": "c1", "type": "function", "function": {"name": "open_door", "arguments": "{}"}}
    with pytest.raises(BridgeError) as e:
        plan_chat(
            {
                "model": "scripted",
                "messages": [
                    {"role": "user", "content": "hi"},
                    {"role": "assistant", "tool_calls": [call]},
                    {"role": "user", "content": "well?"},
                ],
            }
        )
    assert e.value.data["reason"] == "unanswered_tool_call"


def test_neutral_values_of_unsupported_parameters_and_nulls_are_taken() -> None:
    plan = plan_chat(
        {
            "model": "llama",
            "messages": [{"role": "user", "content": "hi"}],
            "n": 1,
            "stop": None,
            "presence_penalty": 0,
            "logprobs": False,
            "max_completion_tokens": 7,
            "temperature": 0.2,
            "seed": 3,
        }
    )
    assert (plan.options.max_tokens, plan.options.temperature, plan.options.seed) == (7, 0.2, 3)


# ---- the service: a turn that resumes from tool results and hands its calls back ----

INVENTORY = ToolSpec(
    name="check_inventory",
    parameters={"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
)


async def _turn_events(svc: Service, turn_id: str) -> list[m.Event]:
    with trio.fail_after(DEADLINE):
        return [ev async for ev in svc.events(turn_id)]


async def test_a_return_calls_turn_completes_with_its_calls_and_requests_nothing() -> None:
    engine = ScriptedEngine()
    async with Service.running(EngineRegistry(default="scripted", scripted=engine)) as svc:
        script = [
            {
                "text": "Let me look.",
                "toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}],
            }
        ]
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
            Message(
                role="assistant",
                content="",
                tool_calls=[ToolCall(id="c1", name="check_inventory", arguments={"item": "ale"})],
            ),
            Message(role="tool", content='{"count": 3}', tool_call_id="c1", name="check_inventory"),
        ]
        turn = svc.respond(
            m.RespondParams(npc_id="keeper", prompt="Any ale?", tool_choice="required"),
            resume=opened,
            return_calls=True,
        )
        done = (await _turn_events(svc, turn.turn_id))[-1]
        # tool_choice applies to the turn's first step, which is this one: required and answered
        # in words fails, as it would on any first step
        assert isinstance(done, m.TurnFailed) and done.error.code == "generation_failed"
        assert engine.requests[-1].messages == opened and engine.requests[-1].tool_mode == "required"
        turn = svc.respond(m.RespondParams(npc_id="keeper", prompt="Any ale?"), resume=opened, return_calls=True)
        done = (await _turn_events(svc, turn.turn_id))[-1]
        assert isinstance(done, m.TurnCompleted) and done.text == "You said: Any ale?"
        assert svc.transcript(m.NpcRef(npc_id="keeper")).turns == [
            [*opened, Message(role="assistant", content="You said: Any ale?")]
        ]


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


# ---- the real server, a subprocess, and the official openai client ----


class Served:
    def __init__(self, process: subprocess.Popen[bytes], url: str) -> None:
        self.process, self.url = process, url

    def client(self) -> openai.OpenAI:
        # no retries: a test sees each answer as the server gave it
        return openai.OpenAI(base_url=self.url + "/v1", api_key="unused", max_retries=0, timeout=DEADLINE)


def start_server(*args: str, command: list[str] = SERVE) -> Served:
    """``oam serve`` on a free loopback port; the address is read from its stderr."""
    proc = subprocess.Popen(
        [*command, *args, "--port", "0"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + DEADLINE
    seen = b""
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        seen += line
        found = re.search(rb"listening on (http://\S+)", line)
        if found:
            return Served(proc, found.group(1).decode())
        if not line:
            break
    proc.kill()
    raise AssertionError(f"the server did not start: {seen.decode()}")


def stop_server(s: Served) -> int:
    s.process.send_signal(signal.SIGTERM)
    try:
        return s.process.wait(timeout=10)
    finally:
        if s.process.poll() is None:
            s.process.kill()


@pytest.fixture(scope="module")
def scripted() -> Iterator[Served]:
    s = start_server("--engine", "scripted")
    yield s
    assert stop_server(s) == 0, "SIGTERM stops the server cleanly"


def test_a_plain_answer_through_the_openai_client(scripted: Served) -> None:
    r = scripted.client().chat.completions.create(
        model="scripted",
        messages=[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello there"}],
        extra_body={"script": [{"text": "Well met, traveller."}]},
    )
    assert r.choices[0].message.content == "Well met, traveller." and r.choices[0].finish_reason == "stop"
    assert (
        r.object == "chat.completion"
        and r.model == "scripted"
        and r.usage is not None
        and r.usage.completion_tokens == 3
    )


def test_a_streamed_answer_arrives_in_pieces_and_ends_with_usage(scripted: Served) -> None:
    stream = scripted.client().chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "Hello"}],
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"script": [{"text": "Halt! Who goes there?"}]},
    )
    chunks = list(stream)
    pieces = [c.choices[0].delta.content for c in chunks if c.choices and c.choices[0].delta.content]
    assert pieces == ["Halt! ", "Who ", "goes ", "there?"]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    assert chunks[-1].choices == [] and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 4


def test_a_tool_round_trip_the_client_runs_the_call_and_the_next_request_continues_from_its_result(
    scripted: Served,
) -> None:
    client = scripted.client()
    messages: list[Any] = [
        {"role": "system", "content": "You guard the gate."},
        {"role": "user", "content": "Open the north door, please."},
    ]
    first = client.chat.completions.create(
        model="scripted",
        messages=messages,
        tools=[DOOR, DICE],
        extra_body={
            "script": [
                {
                    "text": "Let me see.",
                    "toolCalls": [{"id": "call_1", "name": "open_door", "arguments": {"door": "north"}}],
                }
            ]
        },
    )
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content == "Let me see."
    calls = choice.message.tool_calls
    assert calls is not None and [(c.id, c.function.name, json.loads(c.function.arguments)) for c in calls] == [
        ("call_1", "open_door", {"door": "north"})
    ]
    messages.append(choice.message.model_dump(exclude_none=True))
    messages.append({"role": "tool", "tool_call_id": "call_1", "content": '{"opened": true}'})
    # the second request's script echoes what the model was given last: the tool output
    second = client.chat.completions.create(
        model="scripted",
        messages=messages,
        tools=[DOOR, DICE],
        extra_body={"script": [{"text": "The door is open."}]},
    )
    assert second.choices[0].message.content == "The door is open." and second.choices[0].finish_reason == "stop"


def test_a_streamed_tool_call_arrives_as_one_delta_before_finish_reason_tool_calls(scripted: Served) -> None:
    stream = scripted.client().chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "Roll!"}],
        tools=[DICE],
        stream=True,
        extra_body={"script": [{"toolCalls": [{"id": "r1", "name": "roll_dice", "arguments": {"sides": 20}}]}]},
    )
    chunks = [c for c in stream if c.choices]
    deltas = [tc for c in chunks for tc in (c.choices[0].delta.tool_calls or [])]
    assert [(d.index, d.id, d.function and d.function.name, d.function and d.function.arguments) for d in deltas] == [
        (0, "r1", "roll_dice", '{"sides": 20}')
    ]
    assert chunks[-1].choices[0].finish_reason == "tool_calls"


def test_a_forced_tool_is_enforced_by_the_steering(scripted: Served) -> None:
    client = scripted.client()
    forced: Any = {"type": "function", "function": {"name": "roll_dice"}}
    # the model answered in words where a call was required: the turn fails, as on every engine
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "Hi"}],
            tools=[DOOR, DICE],
            tool_choice=forced,
            extra_body={"script": [{"text": "Hello!"}]},
        )
    assert e.value.status_code == 500 and e.value.code == "generation_failed"
    # the forced step shows only the named tool: a call to another is refused inside the turn,
    # the model sees the error and answers on the next step; the client never sees that call
    r = client.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "Hi"}],
        tools=[DOOR, DICE],
        tool_choice=forced,
        extra_body={
            "script": [
                {"toolCalls": [{"id": "x", "name": "open_door", "arguments": {"door": "east"}}]},
                {"toolCalls": [{"id": "y", "name": "roll_dice", "arguments": {"sides": 6}}]},
            ]
        },
    )
    calls = r.choices[0].message.tool_calls
    assert r.choices[0].finish_reason == "tool_calls" and calls is not None and [c.id for c in calls] == ["y"]


def test_tool_choice_none_hides_the_tools(scripted: Served) -> None:
    r = scripted.client().chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "Hi"}],
        tools=[DICE],
        tool_choice="none",
        extra_body={
            "script": [
                {"text": "Just words.", "toolCalls": [{"id": "z", "name": "roll_dice", "arguments": {"sides": 6}}]}
            ]
        },
    )
    assert (
        r.choices[0].finish_reason == "stop"
        and r.choices[0].message.tool_calls is None
        and r.choices[0].message.content == "Just words."
    )


def test_a_json_schema_answer_is_checked_against_the_schema(scripted: Served) -> None:
    schema = {
        "type": "object",
        "properties": {"open": {"type": "boolean"}},
        "required": ["open"],
        "additionalProperties": False,
    }
    fmt: Any = {"type": "json_schema", "json_schema": {"name": "gate", "schema": schema, "strict": True}}
    client = scripted.client()
    r = client.chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "Open?"}],
        response_format=fmt,
        extra_body={"script": [{"json": {"open": True}}]},
    )
    assert json.loads(r.choices[0].message.content or "") == {"open": True}
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "Open?"}],
            response_format=fmt,
            extra_body={"script": [{"json": {"open": "maybe"}}]},
        )
    assert e.value.code == "generation_failed" and "does not match the schema" in str(e.value.message)


def test_errors_carry_their_stable_code_and_status(scripted: Served) -> None:
    client = scripted.client()
    with pytest.raises(openai.RateLimitError) as e:
        client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "Hi"}],
            extra_body={"script": [{"error": "rate_limited"}]},
        )
    assert (
        e.value.status_code == 429 and e.value.code == "rate_limited" and e.value.response.headers["retry-after"] == "1"
    )
    with pytest.raises(openai.BadRequestError) as bad:
        client.chat.completions.create(model="scripted", messages=[{"role": "user", "content": "Hi"}], n=2)
    assert bad.value.code == "invalid_request" and bad.value.param == "n"
    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "Hi"}])
    assert unknown.value.code == "invalid_params" and unknown.value.param == "model"
    with pytest.raises(openai.BadRequestError) as bad_schema:
        client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": "Hi"}],
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "nope"}}},
        )
    assert bad_schema.value.code == "invalid_schema"


def test_an_error_after_the_first_words_ends_the_stream_with_the_error(scripted: Served) -> None:
    stream = scripted.client().chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "Hi"}],
        tools=[DICE],
        stream=True,
        extra_body={
            "script": [
                {
                    "text": "Let me roll.",
                    "toolCalls": [{"id": "a", "name": "roll_dice", "arguments": {"sides": "six"}}],
                },
                {"error": "refusal"},
            ]
        },
    )
    got = []
    with pytest.raises(openai.APIError) as e:
        for c in stream:
            if c.choices and c.choices[0].delta.content:
                got.append(c.choices[0].delta.content)
    assert "".join(got) == "Let me roll." and e.value.code == "refusal"


def test_max_tokens_cut_off_is_finish_reason_length(scripted: Served) -> None:
    r = scripted.client().chat.completions.create(
        model="scripted",
        messages=[{"role": "user", "content": "Talk"}],
        max_tokens=3,
        extra_body={"script": [{"text": "One two three", "finishReason": "length"}]},
    )
    assert r.choices[0].finish_reason == "length"


def test_the_models_are_the_engines(scripted: Served) -> None:
    ids = [x.id for x in scripted.client().models.list()]
    assert "scripted" in ids and "auto" in ids
    assert scripted.client().models.retrieve("scripted").id == "scripted"


def test_many_requests_at_once_run_concurrently(scripted: Served) -> None:
    """16 turns that each wait 1 s finish together, not one after another (16 s)."""
    client = scripted.client()

    def one(i: int) -> str:
        r = client.chat.completions.create(
            model="scripted",
            messages=[{"role": "user", "content": f"#{i}"}],
            extra_body={"script": [{"text": f"answer {i}", "delayMs": 1000}]},
        )
        return r.choices[0].message.content or ""

    from concurrent.futures import ThreadPoolExecutor

    t0 = time.monotonic()
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(one, range(16)))
    elapsed = time.monotonic() - t0
    assert answers == [f"answer {i}" for i in range(16)]
    assert elapsed < 8, f"16 one-second turns took {elapsed:.1f} s: they ran one after another"


# ---- curl ----

CURL = shutil.which("curl")


def curl(url: str, body: dict[str, Any] | None = None, *extra: str) -> tuple[int, str]:
    assert CURL is not None
    args = [CURL, "-sS", "-N", "-w", "\n%{http_code}", url]
    if body is not None:
        args += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    r = subprocess.run([*args, *extra], capture_output=True, text=True, timeout=DEADLINE)
    assert r.returncode == 0, r.stderr
    out, _, status = r.stdout.rpartition("\n")
    return int(status), out


@pytest.mark.skipif(CURL is None, reason="no curl")
def test_curl_gets_an_answer_a_stream_and_an_error_status(scripted: Served) -> None:
    url = scripted.url + "/v1/chat/completions"
    status, out = curl(
        url,
        {"model": "scripted", "messages": [{"role": "user", "content": "Hi"}], "script": [{"text": "Hello, curl."}]},
    )
    assert status == 200 and json.loads(out)["choices"][0]["message"]["content"] == "Hello, curl."
    status, out = curl(
        url,
        {
            "model": "scripted",
            "stream": True,
            "messages": [{"role": "user", "content": "Hi"}],
            "script": [{"text": "a b"}],
        },
    )
    lines = [x for x in out.split("\n") if x]
    assert status == 200 and all(x.startswith("data: ") for x in lines) and lines[-1] == "data: [DONE]"
    assert "".join(json.loads(x[6:])["choices"][0]["delta"].get("content", "") for x in lines[:-1]) == "a b"
    status, out = curl(
        url,
        {
            "model": "scripted",
            "messages": [{"role": "user", "content": "Hi"}],
            "script": [{"error": "context_size_exceeded"}],
        },
    )
    assert status == 400 and json.loads(out)["error"]["code"] == "context_size_exceeded"
    status, out = curl(url, None, "-H", "Content-Type: application/json", "-d", "{not json")
    assert status == 400 and json.loads(out)["error"]["code"] == "invalid_request"
    status, out = curl(scripted.url + "/v1/models")
    assert status == 200 and "scripted" in [x["id"] for x in json.loads(out)["data"]]


# ---- the real server in process: what a request leaves behind ----


@asynccontextmanager
async def served_in_process() -> AsyncIterator[tuple[Service, str]]:
    from hypercorn.config import Config
    from hypercorn.trio import serve

    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    registry = EngineRegistry(default="scripted", scripted=ScriptedEngine())
    stop = trio.Event()
    async with Service.running(registry) as svc, trio.open_nursery() as nursery:
        app: Any = create_app(svc, registry, default_engine="scripted")
        binds = await nursery.start(partial(serve, app, config, shutdown_trigger=stop.wait))
        try:
            yield svc, binds[0]
        finally:
            stop.set()


async def _until_no_npc(svc: Service) -> None:
    while svc.npcs or not svc.idle():
        await trio.sleep(0.01)


async def test_a_client_that_leaves_a_stream_cancels_its_turn() -> None:
    async with served_in_process() as (svc, url), httpx.AsyncClient(timeout=DEADLINE) as client:
        body = {
            "model": "scripted",
            "stream": True,
            "messages": [{"role": "user", "content": "Sing"}],
            "script": [{"text": "la " * 2000, "chunkMs": 5}],
        }
        with trio.fail_after(DEADLINE):
            async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200
                async for line in r.aiter_lines():
                    if '"la "' in line:
                        break
                assert len(svc.npcs) == 1 and not svc.idle(), "the turn is streaming"
            # the connection is closed: the turn ends long before its 10 s of words
            t0 = trio.current_time()
            await _until_no_npc(svc)
            assert trio.current_time() - t0 < 2
        kept = svc._turn_events  # noqa: SLF001
        assert kept is not None and kept._count == 0 and not kept._dropped, "nothing is left of the turn's events"  # noqa: SLF001


async def test_a_client_that_leaves_before_the_answer_cancels_its_turn() -> None:
    async with served_in_process() as (svc, url), httpx.AsyncClient() as client:
        body = {
            "model": "scripted",
            "messages": [{"role": "user", "content": "Think"}],
            "script": [{"text": "Done.", "delayMs": 20_000}],
        }
        with trio.fail_after(DEADLINE):
            with pytest.raises(httpx.ReadTimeout):
                await client.post(url + "/v1/chat/completions", json=body, timeout=httpx.Timeout(DEADLINE, read=0.5))
            t0 = trio.current_time()
            await _until_no_npc(svc)
            assert trio.current_time() - t0 < 2, "the turn was cancelled, not waited for"


async def test_every_request_leaves_no_npc_behind() -> None:
    async with served_in_process() as (svc, url), httpx.AsyncClient(timeout=DEADLINE) as client:
        with trio.fail_after(DEADLINE):
            ok = await client.post(
                url + "/v1/chat/completions",
                json={"model": "scripted", "messages": [{"role": "user", "content": "Hi"}]},
            )
            failed = await client.post(
                url + "/v1/chat/completions",
                json={
                    "model": "scripted",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "script": [{"error": "busy"}],
                },
            )
            calls = await client.post(
                url + "/v1/chat/completions",
                json={
                    "model": "scripted",
                    "messages": [{"role": "user", "content": "Hi"}],
                    "tools": [DICE],
                    "script": [{"toolCalls": [{"name": "roll_dice", "arguments": {"sides": 4}}]}],
                },
            )
            assert (ok.status_code, failed.status_code, calls.status_code) == (200, 503, 200)
            assert (
                failed.json()["error"]["code"] == "busy" and calls.json()["choices"][0]["finish_reason"] == "tool_calls"
            )
            await _until_no_npc(svc)


# ---- the bundled model ----


@pytest.fixture(scope="module")
def llama() -> Iterator[Served]:
    """``oam serve`` on the bundled model (its tests carry the ``model`` marker)."""
    s = start_server("--engine", "llama")
    yield s
    assert stop_server(s) == 0


@pytest.mark.model
def test_a_tool_round_trip_on_the_bundled_model(llama: Served) -> None:
    client = llama.client()
    messages: list[Any] = [
        {"role": "system", "content": "You are Bram, the gate guard."},
        {"role": "user", "content": "Roll a twenty-sided die for me."},
    ]
    forced: Any = {"type": "function", "function": {"name": "roll_dice"}}
    first = client.chat.completions.create(
        model="llama", messages=messages, tools=[DOOR, DICE], tool_choice=forced, max_tokens=60, temperature=0, seed=7
    )
    calls = first.choices[0].message.tool_calls
    assert (
        first.choices[0].finish_reason == "tool_calls" and calls is not None and calls[0].function.name == "roll_dice"
    )
    assert isinstance(json.loads(calls[0].function.arguments)["sides"], int), (
        "the grammar keeps the arguments to the schema"
    )
    messages.append(first.choices[0].message.model_dump(exclude_none=True))
    messages += [
        {"role": "tool", "tool_call_id": c.id, "content": '{"rolled": 17}'} for c in calls
    ]  # every call is answered
    stream = client.chat.completions.create(
        model="llama", messages=messages, tools=[DOOR, DICE], max_tokens=40, temperature=0, seed=7, stream=True
    )
    chunks = [c for c in stream if c.choices]
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text.strip() and chunks[-1].choices[0].finish_reason in ("stop", "length")


@pytest.mark.model
def test_max_tokens_on_the_bundled_model_ends_with_finish_reason_length(llama: Served) -> None:
    r = llama.client().chat.completions.create(
        model="llama",
        messages=[{"role": "user", "content": "Tell me a long story about dragons."}],
        max_tokens=3,
        temperature=0,
    )
    assert r.choices[0].finish_reason == "length" and r.usage is not None and r.usage.completion_tokens <= 3


# ---- the documents ----


def _blocks(markdown: str, lang: str) -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", markdown, re.S | re.M)


def test_the_readme_lines_work_as_printed() -> None:
    """The README's server line as printed (``--port 0`` added), then its curl line and its Python
    snippet against that server (their URL's port replaced by it)."""
    section = Path(ROOT, "README.md").read_text().split("## OpenAI-compatible server", 1)[1].split("\n## ", 1)[0]
    start, ask = _blocks(section, "sh")
    (snippet,) = _blocks(section, "python")
    command = start.split("#")[0].split()
    assert command[:2] == [".venv/bin/oam", "serve"]
    s = start_server(*command[2:], command=[str(Path(ROOT, command[0])), "serve"])
    try:
        port = s.url.rsplit(":", 1)[1]
        curl_line = ask.replace("\\\n", " ").replace("127.0.0.1:8090", f"127.0.0.1:{port}")
        r = subprocess.run(["bash", "-c", curl_line], capture_output=True, text=True, timeout=DEADLINE)
        assert r.returncode == 0 and json.loads(r.stdout)["choices"][0]["message"]["content"] == "You said: Hello!"
        r = subprocess.run(
            [sys.executable, "-c", snippet.replace("127.0.0.1:8090", f"127.0.0.1:{port}")],
            capture_output=True,
            text=True,
            timeout=DEADLINE,
        )
        assert r.returncode == 0 and r.stdout == "You said: Hello!\n", r.stderr
    finally:
        assert stop_server(s) == 0


def test_docs_http_lists_every_error_code_with_its_status_and_every_field() -> None:
    from bridge.errors import ERROR_CODES, HTTP_STATUS
    from bridge.hosts.http._plan import NEUTRAL, SUPPORTED

    doc = Path(ROOT, "docs", "http.md").read_text()
    rows = dict(re.findall(r"^\| `(\w+)` \| (\d+) \| (?:yes|no) \|$", doc, re.M))
    assert rows == {code: str(status) for code, status in HTTP_STATUS.items()}
    for code, (_, retryable) in ERROR_CODES.items():
        assert f"| `{code}` | {HTTP_STATUS[code]} | {'yes' if retryable else 'no'} |" in doc
    for name in SUPPORTED | set(NEUTRAL):
        assert f"`{name}`" in doc, f"docs/http.md does not say what happens to {name}"
    assert (
        "(docs/http.md)" in Path(ROOT, "README.md").read_text()
        and "(docs/http.md)" in Path(ROOT, "protocol.md").read_text()
    )
