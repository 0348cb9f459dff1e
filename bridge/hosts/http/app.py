"""``oam serve``: the OpenAI-compatible server (``POST /v1/chat/completions``, ``GET
/v1/models``) over the service layer, on hypercorn's trio worker with Starlette (which runs
on trio through anyio). docs/http.md is the contract; this docstring says how it is built.

Stateless, as the seeds' transcript reconstruction wants it: every request is a temporary
NPC on the one ``Service``. Its system (and developer) messages become the NPC's
instructions, its tools the NPC's tools, the model name picks the engine; the messages
before the last user message are restored as the NPC's history (one turn per user
message), and the turn either answers the last user message or, when the conversation ends
with tool results, resumes the open turn from them (``Service.respond(resume=...)``). The
steering is the agent's, unchanged: ``tool_choice`` on the turn's first step only (the one
step this request generates when it ends at a tool call), hidden tools, argument and schema
validation. The server runs no tool: the turn hands its calls back
(``return_calls=True``: ``turn/completed`` with ``finishReason`` ``"tool_calls"``, nothing
requested, nothing committed), the response carries them with ``finish_reason``
``"tool_calls"``, and the NPC is deleted. Calls the steering refuses (an unknown tool,
arguments that break the schema) are answered with their error inside the turn and the
model tries again, so the client only ever sees calls it can run.

Layout: the mapping between OpenAI's JSON and the service's types is plain functions with
no I/O (``plan_chat``, ``completion``, ``chunk``, ``error_body``); the ASGI app
(``create_app``) drives one request's NPC and turn; ``main`` runs hypercorn. A client that
disconnects cancels its turn: Starlette cancels a streamed body when the client leaves, and a
non-streamed request watches ``http.disconnect`` itself.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec
import trio
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from bridge import __version__
from bridge.core import _messages as m
from bridge.core._service import Service
from bridge.hosts._common import add_engine_arguments, build_registry
from bridge.engines import EngineRegistry
from bridge.engines.base import GenerationOptions, Message, ToolCall, ToolSpec
from bridge.errors import HTTP_STATUS, BridgeError

log = logging.getLogger("oam_bridge.http")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8090
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # like the bridge's longest line
DEFAULT_MAX_REQUESTS = 256  # chat completions at once; past it: overloaded (503)

# ---- the mapping: OpenAI JSON <-> the service's types, no I/O ----

# Parameters taken as they are.
SUPPORTED = frozenset({
    "model", "messages", "stream", "stream_options", "tools", "tool_choice", "parallel_tool_calls", "response_format",
    "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed", "n", "user", "script",
})
# Parameters accepted only at the value that changes nothing (null counts as absent too):
# any other value is refused, never ignored.
NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "presence_penalty": lambda v: v == 0,
    "frequency_penalty": lambda v: v == 0,
    "logprobs": lambda v: v is False,
    "logit_bias": lambda v: v == {},
    "stop": lambda v: v == [],
    "store": lambda v: v is False,
}


# OpenAI's generation parameters -> GenerationOptions' wire names (max_completion_tokens,
# the newer name, wins over max_tokens: it comes later)
OPTIONS = {"temperature": "temperature", "top_p": "topP", "seed": "seed", "max_tokens": "maxTokens", "max_completion_tokens": "maxTokens"}


def _refuse(message: str, param: str | None = None, reason: str = "invalid_value") -> BridgeError:
    data: dict[str, Any] = {"reason": reason}
    if param is not None:
        data["param"] = param
    return BridgeError("invalid_request", message, **data)


@dataclass(frozen=True)
class ChatPlan:
    """One chat completion request as the service runs it."""

    model: str  # as the client named it (echoed in the response)
    engine: str  # the engine it selects: "auto" for the server's default
    instructions: str | None
    tools: list[ToolSpec]
    options: GenerationOptions
    history: list[list[Message]]  # complete turns before the last user message
    prompt: str  # the last user message (empty when the turn resumes)
    speaker: str | None  # the last user message's ``name``
    resume: list[Message] | None  # the open turn, ending with tool results, or None
    tool_choice: m.ToolChoice = "auto"
    max_tool_calls: int = 8
    schema: dict[str, Any] | None = None
    stream: bool = False
    include_usage: bool = False
    script: list[Any] | None = None


def _text(content: Any, where: str) -> str:
    """A message's content: a string, null, or a list of text parts (joined)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        out = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise _refuse(f"{where}: only text content parts are supported, not {kind!r}", where, "unsupported_content")
            out.append(part["text"])
        return "".join(out)
    raise _refuse(f"{where}: content must be a string or a list of text parts", where)


def _tool_calls(raw: Any, where: str) -> list[ToolCall]:
    if not isinstance(raw, list):
        raise _refuse(f"{where}.tool_calls must be a list", where)
    calls = []
    for j, c in enumerate(raw):
        at = f"{where}.tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(c, dict) or c.get("type", "function") != "function" or not isinstance(fn, dict):
            raise _refuse(f"{at} must be a function call", at)
        if not isinstance(c.get("id"), str) or not isinstance(fn.get("name"), str):
            raise _refuse(f"{at} needs an id and a function name", at)
        args = fn.get("arguments", "{}")
        try:
            parsed = json.loads(args) if isinstance(args, str) else None
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise _refuse(f"{at}.function.arguments must be a JSON object in a string", at)
        calls.append(ToolCall(id=c["id"], name=fn["name"], arguments=parsed))
    return calls


def _conversation(messages: Any) -> tuple[str | None, list[Message]]:
    """The system text and the rest as transcript messages, with every tool call answered
    by a tool message (matched by id) before the next user or assistant message."""
    if not isinstance(messages, list) or not messages:
        raise _refuse("messages must be a non-empty list", "messages")
    system: list[str] = []
    convo: list[Message] = []
    open_calls: dict[str, str] = {}  # id -> tool name, of the latest assistant's calls

    def check_answered(at: str) -> None:
        if open_calls:
            raise _refuse(f"{at}: tool call {next(iter(open_calls))!r} has no tool message before it", at, "unanswered_tool_call")

    for i, msg in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise _refuse(f"{at} must be an object", at)
        role = msg.get("role")
        if role in ("system", "developer"):
            system.append(_text(msg.get("content"), at))
        elif role == "user":
            check_answered(at)
            name = msg.get("name")
            convo.append(Message(role="user", content=_text(msg.get("content"), at), name=name if isinstance(name, str) and name else None))
        elif role == "assistant":
            check_answered(at)
            calls = _tool_calls(msg["tool_calls"], at) if msg.get("tool_calls") else []
            convo.append(Message(role="assistant", content=_text(msg.get("content"), at), tool_calls=calls))
            open_calls = {c.id: c.name for c in calls}
        elif role == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in open_calls:
                raise _refuse(f"{at}: tool_call_id {call_id!r} answers no call of the assistant message before it", at, "unmatched_tool_message")
            convo.append(Message(role="tool", content=_text(msg.get("content"), at), tool_call_id=call_id, name=open_calls.pop(call_id)))
        else:
            raise _refuse(f"{at}: role {role!r} is not supported (system, developer, user, assistant, tool)", at, "unsupported_role")
    check_answered("the end of messages")
    if not convo or convo[-1].role == "assistant":
        raise _refuse("the last message must be a user message or a tool result (the server does not continue an assistant message)", "messages")
    return ("\n\n".join(system) or None), convo


def _turns(messages: list[Message]) -> list[list[Message]]:
    """Messages as turns: a new turn at every user message."""
    turns: list[list[Message]] = []
    for msg in messages:
        if msg.role == "user" or not turns:
            turns.append([])
        turns[-1].append(msg)
    return turns


def _tools(raw: Any) -> list[ToolSpec]:
    if not isinstance(raw, list):
        raise _refuse("tools must be a list", "tools")
    out = []
    for i, t in enumerate(raw):
        at = f"tools[{i}]"
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise _refuse(f"{at}: only function tools are supported ({{\"type\": \"function\", \"function\": {{\"name\": ...}}}})", at, "unsupported_tool")
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        desc = fn.get("description")
        out.append(ToolSpec(name=fn["name"], description=desc if isinstance(desc, str) else "", parameters=params))
    return out


def _tool_choice(raw: Any) -> m.ToolChoice:
    if raw in ("auto", "none", "required"):
        return raw  # type: ignore[no-any-return]
    if isinstance(raw, dict) and raw.get("type") == "function" and isinstance(raw.get("function"), dict) and isinstance(raw["function"].get("name"), str):
        return m.NamedTool(tool=raw["function"]["name"])
    raise _refuse('tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}', "tool_choice")


def _schema(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        raise _refuse("response_format must be an object", "response_format")
    kind = raw.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = raw.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise _refuse("response_format json_schema needs json_schema.schema, an object", "response_format")
        return spec["schema"]  # type: ignore[no-any-return]
    raise _refuse(f"response_format type {kind!r} is not supported (text, json_object, json_schema)", "response_format")


def plan_chat(body: Any) -> ChatPlan:
    """A chat completion request as the service runs it; ``invalid_request`` (400) for
    anything malformed or unsupported, naming the parameter."""
    if not isinstance(body, dict):
        raise _refuse("the request body must be a JSON object")
    body = {k: v for k, v in body.items() if v is not None}  # null is absent, as OpenAI takes it
    for key, value in body.items():
        if key in SUPPORTED:
            continue
        neutral = NEUTRAL.get(key)
        if neutral is None:
            raise _refuse(f"parameter {key!r} is not supported", key, "unsupported_parameter")
        if not neutral(value):
            raise _refuse(f"parameter {key!r} is not supported (only its default, which changes nothing)", key, "unsupported_parameter")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _refuse("model is required: an engine name (GET /v1/models) or \"auto\"", "model")
    if body.get("n", 1) != 1:
        raise _refuse("n must be 1: one choice per request", "n", "unsupported_parameter")
    instructions, convo = _conversation(body.get("messages"))
    last_user = max((i for i, x in enumerate(convo) if x.role == "user"), default=-1)
    if convo[-1].role == "user":
        history, prompt, speaker, resume = convo[:-1], convo[-1].content, convo[-1].name, None
    else:  # tool results: the open turn starts at the last user message (or at the start)
        start = max(last_user, 0)
        history, prompt, speaker, resume = convo[:start], (convo[start].content if last_user >= 0 else ""), None, convo[start:]
    try:
        wanted = {ours: body[theirs] for theirs, ours in OPTIONS.items() if theirs in body}
        options = msgspec.convert(wanted, GenerationOptions)
    except msgspec.ValidationError as e:
        problem = str(e)
        for theirs, ours in OPTIONS.items():
            problem = problem.replace(f"`$.{ours}`", f"`{theirs}`")
        raise _refuse(problem, None) from None
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise _refuse("stream must be true or false", "stream")
    stream_options = body.get("stream_options", {})
    if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage"}:
        raise _refuse("stream_options supports include_usage only", "stream_options", "unsupported_parameter")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise _refuse("parallel_tool_calls must be true or false", "parallel_tool_calls")
    script = body.get("script")
    if script is not None and not isinstance(script, list):
        raise _refuse("script (the scripted engine's steps) must be a list", "script")
    return ChatPlan(
        model=model,
        engine=model,
        instructions=instructions,
        tools=_tools(body["tools"]) if "tools" in body else [],
        options=options,
        history=_turns(history),
        prompt=prompt,
        speaker=speaker,
        resume=resume,
        tool_choice=_tool_choice(body["tool_choice"]) if "tool_choice" in body else "auto",
        max_tool_calls=8 if parallel else 1,
        schema=_schema(body["response_format"]) if "response_format" in body else None,
        stream=stream,
        include_usage=stream_options.get("include_usage") is True,
        script=script,
    )


def _calls_json(records: list[m.ToolRecord], with_index: bool = False) -> list[dict[str, Any]]:
    out = []
    for i, r in enumerate(records):
        call: dict[str, Any] = {"id": r.call_id, "type": "function", "function": {"name": r.name, "arguments": json.dumps(r.arguments, ensure_ascii=False)}}
        if with_index:
            call = {"index": i, **call}
        out.append(call)
    return out


def handed_calls(done: m.TurnCompleted) -> list[m.ToolRecord]:
    """The calls a ``return_calls`` turn handed back: its last records, with no output and
    no error (refused calls of earlier steps carry their error)."""
    if done.finish_reason != "tool_calls":
        return []
    return [r for r in done.tool_calls if r.error is None and r.output is None]


def finish_reason(done: m.TurnCompleted) -> str:
    if handed_calls(done):
        return "tool_calls"
    return "length" if done.finish_reason == "length" else "stop"


def usage_json(done: m.TurnCompleted) -> dict[str, int]:
    u = done.usage
    return {"prompt_tokens": u.input_tokens, "completion_tokens": u.output_tokens, "total_tokens": u.input_tokens + u.output_tokens}


def completion(plan: ChatPlan, done: m.TurnCompleted, completion_id: str, created: int) -> dict[str, Any]:
    """The non-streamed response body for a completed turn."""
    calls = handed_calls(done)
    message: dict[str, Any] = {"role": "assistant", "content": done.text if done.text or not calls else None}
    if calls:
        message["tool_calls"] = _calls_json(calls)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": plan.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(done), "logprobs": None}],
        "usage": usage_json(done),
        "system_fingerprint": None,
    }


def chunk(plan: ChatPlan, completion_id: str, created: int, delta: dict[str, Any] | None, finish: str | None = None, usage: dict[str, int] | None = None) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``delta`` None: the usage chunk (no choices)."""
    body: dict[str, Any] = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": plan.model, "system_fingerprint": None}
    body["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    if usage is not None:
        body["usage"] = usage
    return body


def error_body(code: str, message: str, param: str | None = None, retryable: bool = False) -> dict[str, Any]:
    """OpenAI's error shape, with the bridge's stable code in ``code``."""
    status = HTTP_STATUS.get(code, 500)
    kind = "invalid_request_error" if 400 <= status < 500 and status not in (429, 499) else ("rate_limit_error" if status == 429 else "server_error")
    return {"error": {"message": message, "type": kind, "param": param, "code": code, "retryable": retryable}}


def bridge_error_body(e: BridgeError) -> dict[str, Any]:
    param = e.data.get("param")
    return error_body(e.code, e.message, param if isinstance(param, str) else None, e.retryable)


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


# ---- the ASGI app ----


def _error_response(e: BridgeError) -> JSONResponse:
    headers = {"Retry-After": "1"} if e.retryable else None
    return JSONResponse(bridge_error_body(e), status_code=e.http_status, headers=headers)


@dataclass
class _State:
    svc: Service
    registry: EngineRegistry
    max_body_bytes: int
    max_requests: int
    default_engine: str | None  # what "auto" is (None: no engine is available)
    active: int = 0


async def _read_body(request: Request, limit: int) -> Any:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BridgeError("message_too_large", f"the request body is over {limit} bytes", limit=limit)
    data = bytearray()
    async for piece in request.stream():
        data += piece
        if len(data) > limit:
            raise BridgeError("message_too_large", f"the request body is over {limit} bytes", limit=limit)
    try:
        return msgspec.json.decode(bytes(data))
    except msgspec.DecodeError as e:
        raise _refuse(f"the request body is not valid JSON: {e}") from None


async def _until_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    log.info("client disconnected: cancelling its turn")
    scope.cancel()


class _Request:
    """One chat completion: its temporary NPC, its turn and the turn's events. ``close`` (sync,
    idempotent) deletes the NPC, which cancels a turn still running, and frees the turn's
    events if they were not all read."""

    def __init__(self, state: _State, plan: ChatPlan) -> None:
        self.state = state
        self.plan = plan
        self.npc_id = f"http_{uuid.uuid4().hex[:16]}"
        self.turn_id: str | None = None
        self.ended = False  # the terminal event was read
        self.closed = False
        self.created = int(time.time())
        self.completion_id = ""

    async def start(self) -> None:
        p, svc = self.plan, self.state.svc
        engine = self.state.default_engine if p.engine == "auto" else p.engine
        if engine is None:
            raise BridgeError("model_unavailable", "no engine is available for \"auto\": see the server's start-up log", param="model")
        if engine not in ENGINES:
            raise BridgeError("invalid_params", f"unknown model {p.model!r}: GET /v1/models lists them (or use \"auto\")", param="model")
        config = m.NpcConfig(npc_id=self.npc_id, instructions=p.instructions, tools=p.tools, engine=engine, options=p.options, script=p.script)
        await svc.restore(m.RestoreParams(save=m.Save(version=1, config=config, turns=p.history)))
        turn = svc.respond(
            m.RespondParams(npc_id=self.npc_id, prompt=p.prompt, speaker=p.speaker, tool_choice=p.tool_choice, max_tool_calls=p.max_tool_calls, schema=p.schema, full_text=False),
            resume=p.resume,
            return_calls=True,
        )
        self.turn_id = turn.turn_id
        self.completion_id = "chatcmpl-" + turn.turn_id.removeprefix("turn_")

    def events(self) -> AsyncIterator[m.Event]:
        assert self.turn_id is not None
        return self.state.svc.events(self.turn_id)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        svc = self.state.svc
        if self.npc_id in svc.npcs:
            svc.delete(m.NpcRef(npc_id=self.npc_id))
        if self.turn_id is not None and not self.ended:
            svc.drop_events(self.turn_id)
        self.state.active -= 1


def _is_content(ev: m.Event) -> bool:
    return isinstance(ev, (m.TextDelta, m.PartialJson, m.TurnCompleted, m.TurnFailed))


def _failure(ev: m.TurnFailed) -> BridgeError:
    return BridgeError(ev.error.code, ev.error.message)


class _TurnStream(StreamingResponse):
    """The SSE body of a streamed turn; the request's NPC goes when the response ends, however
    it ends (done, client gone, cancelled)."""

    def __init__(self, req: _Request, body: AsyncIterator[bytes]) -> None:
        super().__init__(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._req = req

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._req.close()


async def _stream_body(req: _Request, first: m.Event, events: AsyncIterator[m.Event]) -> AsyncIterator[bytes]:
    p, cid, created = req.plan, req.completion_id, req.created
    yield sse(chunk(p, cid, created, {"role": "assistant", "content": ""}))
    ev: m.Event | None = first
    while ev is not None:
        if isinstance(ev, (m.TextDelta, m.PartialJson)):
            if ev.delta:
                yield sse(chunk(p, cid, created, {"content": ev.delta}))
        elif isinstance(ev, m.TurnCompleted):
            req.ended = True
            calls = handed_calls(ev)
            if calls:
                yield sse(chunk(p, cid, created, {"tool_calls": _calls_json(calls, with_index=True)}))
            yield sse(chunk(p, cid, created, {}, finish_reason(ev)))
            if p.include_usage:
                yield sse(chunk(p, cid, created, None, usage=usage_json(ev)))
            yield sse("[DONE]")
            return
        elif isinstance(ev, m.TurnFailed):
            req.ended = True
            # Past the status line: the error goes in the stream (the openai client raises it).
            yield sse(error_body(ev.error.code, ev.error.message, retryable=ev.error.retryable))
            return
        ev = await anext(events, None)
    raise AssertionError("a turn's events end with its terminal event")


async def _chat_completions(request: Request) -> Response:
    state: _State = request.app.state.oam
    try:
        plan = plan_chat(await _read_body(request, state.max_body_bytes))
        if state.active >= state.max_requests:
            raise BridgeError("overloaded", f"{state.max_requests} chat completions are running; retry later", limit=state.max_requests)
    except BridgeError as e:
        return _error_response(e)
    state.active += 1
    req = _Request(state, plan)
    streaming = False
    try:
        first: m.Event | None = None
        refused: BridgeError | None = None  # kept out of the nursery's exception group
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_until_disconnect, request.receive, nursery.cancel_scope)
            try:
                await req.start()
                events = req.events()
                # Streamed or not, nothing is sent before the turn's first words or its end,
                # so a turn that fails at once (an unavailable engine, a prompt too long for
                # the window) gets its proper status, not a 200 and an error in the stream.
                async for ev in events:
                    if _is_content(ev) and (plan.stream or isinstance(ev, (m.TurnCompleted, m.TurnFailed))):
                        first = ev
                        break
            except BridgeError as e:
                refused = e
            nursery.cancel_scope.cancel()
        if refused is not None:
            return _error_response(refused)
        if first is None:
            return Response(status_code=499)  # the client has gone: nobody reads this
        if isinstance(first, m.TurnFailed):
            req.ended = True
            return _error_response(_failure(first))
        if not plan.stream:
            assert isinstance(first, m.TurnCompleted)
            req.ended = True
            return JSONResponse(completion(plan, first, req.completion_id, req.created))
        streaming = True
        return _TurnStream(req, _stream_body(req, first, events))
    except BridgeError as e:
        return _error_response(e)
    finally:
        if not streaming:
            req.close()


async def _models(request: Request) -> Response:
    state: _State = request.app.state.oam
    infos = await trio.to_thread.run_sync(state.registry.infos)
    # engines that run a model (or the scripted one), as auto would take them: the native
    # library's test backend (available, with a reason) is left out, though it may be named
    listed = [_model_json(i.name) for i in infos if i.available and i.reason is None]
    return JSONResponse({"object": "list", "data": [*listed, _model_json("auto")]})


async def _model(request: Request) -> Response:
    state: _State = request.app.state.oam
    name = request.path_params["model"]
    infos = {i.name: i for i in await trio.to_thread.run_sync(state.registry.infos)}
    if name != "auto" and not (name in infos and infos[name].available and infos[name].reason is None):
        return JSONResponse(error_body("invalid_params", f"no model {name!r}", "model"), status_code=404)
    return JSONResponse(_model_json(name))


def _model_json(name: str) -> dict[str, Any]:
    return {"id": name, "object": "model", "created": 0, "owned_by": "oam-bridge"}


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = "method_not_found" if exc.status_code in (404, 405) else "invalid_request"
    return JSONResponse(error_body(code, f"{request.method} {request.url.path}: {exc.detail}"), status_code=exc.status_code, headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(error_body("internal_error", f"internal error: {type(exc).__name__}"), status_code=500)


ENGINES = frozenset({"scripted", "llama", "native", "openai"})


def create_app(svc: Service, registry: EngineRegistry, *, default_engine: str | None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES, max_requests: int = DEFAULT_MAX_REQUESTS) -> Starlette:
    """The ASGI app over a running ``svc``. It must run on trio (hypercorn's trio worker)."""
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", _chat_completions, methods=["POST"]),
            Route("/v1/models", _models, methods=["GET"]),
            Route("/v1/models/{model:path}", _model, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )
    app.state.oam = _State(svc, registry, max_body_bytes, max_requests, default_engine)
    return app


# ---- the process ----


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="oam serve", description="An OpenAI-compatible server for NPC turns: POST /v1/chat/completions, GET /v1/models.")
    add_engine_arguments(ap)
    ap.add_argument("--host", default=os.environ.get("OAM_HOST", DEFAULT_HOST), help=f"address to listen on (env OAM_HOST; default {DEFAULT_HOST}, this machine only)")
    ap.add_argument("--port", type=int, default=int(os.environ.get("OAM_PORT", str(DEFAULT_PORT))), help=f"port (env OAM_PORT; default {DEFAULT_PORT}; 0: any free port, printed on stderr)")
    ap.add_argument("--max-requests", type=int, default=DEFAULT_MAX_REQUESTS, help=f"chat completions at once; past it: 503 overloaded (default {DEFAULT_MAX_REQUESTS})")
    ap.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES, help="largest request body; past it: 413 message_too_large (default 4 MiB)")
    ap.add_argument("--log-level", default=os.environ.get("OAM_LOG", "warning"), help="stderr log level (env OAM_LOG)")
    ap.add_argument("--version", action="version", version=f"oam serve {__version__}")
    return ap.parse_args(argv)


def _hypercorn_config(host: str, port: int) -> Any:
    from hypercorn.config import Config  # noqa: PLC0415 - imported with the server only

    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("oam_bridge.http.hypercorn")
    config.graceful_timeout = 2.0
    return config


async def serve(args: argparse.Namespace, task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED) -> None:
    """Run the server until SIGINT or SIGTERM; ``task_status`` gets the bound addresses."""
    from hypercorn.trio import serve as hypercorn_serve  # noqa: PLC0415

    registry = build_registry(args)
    shutdown = trio.Event()

    async def on_signals(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async for _ in signals:
                log.info("signal: shutting down")
                shutdown.set()
                return

    try:  # which engine "auto" is: availability probes import engines, off the loop
        default: str | None = await trio.to_thread.run_sync(registry.resolve, "auto")
    except BridgeError as e:
        log.warning("model \"auto\" has no engine: %s", e.message)
        default = None
    async with Service.running(registry) as svc, trio.open_nursery() as nursery:
        await nursery.start(on_signals)
        app = create_app(svc, registry, default_engine=default, max_body_bytes=args.max_body_bytes, max_requests=args.max_requests)
        config = _hypercorn_config(args.host, args.port)
        asgi: Any = app  # hypercorn's ASGI types are its own TypedDicts; Starlette's are dicts
        binds: list[str] = await nursery.start(partial(hypercorn_serve, asgi, config, shutdown_trigger=shutdown.wait))
        for bind in binds:
            print(f"oam serve: listening on {bind}", file=sys.stderr, flush=True)
        task_status.started(binds)
        await shutdown.wait()
        svc.close_all("turn_ended")
    # hypercorn returned: every connection is closed


def main(argv: list[str] | None = None) -> int:
    """``oam serve ARGS``: run the server until SIGINT or SIGTERM; 0 on a clean stop."""
    args = parse_args(sys.argv[1:] if argv is None else argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(), format="oam serve %(levelname)s %(name)s: %(message)s")
    try:
        trio.run(serve, args)
    except OSError as e:  # the port is taken, the address is not ours
        print(f"oam serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


__all__ = ["ChatPlan", "completion", "chunk", "create_app", "error_body", "main", "plan_chat", "serve"]

if __name__ == "__main__":
    raise SystemExit(main())
