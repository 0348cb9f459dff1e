"""The mapping between OpenAI's chat completion JSON and the service's types for ``oam serve``
(``app``): plain functions with no I/O. ``plan_chat`` reads a request body into a
``ChatPlan`` (or refuses it with ``invalid_request``, naming the parameter); ``completion``,
``chunk``, ``usage_json`` and ``error_body`` write the response bodies, ``sse`` frames a
streamed one. docs/http.md is the contract.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from bridge.core import _messages as m
from bridge.engines.base import GenerationOptions, Message, ToolCall, ToolSpec
from bridge.errors import HTTP_STATUS, BridgeError

# Parameters taken as they are.
SUPPORTED = frozenset(
    {
        "model",
        "messages",
        "stream",
        "stream_options",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "n",
        "user",
        "script",
    }
)
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
OPTIONS = {
    "temperature": "temperature",
    "top_p": "topP",
    "seed": "seed",
    "max_tokens": "maxTokens",
    "max_completion_tokens": "maxTokens",
}


def refuse(message: str, param: str | None = None, reason: str = "invalid_value") -> BridgeError:
    """``invalid_request`` (400): ``message``, with the parameter it is about and why."""
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
                raise refuse(
                    f"{where}: only text content parts are supported, not {kind!r}", where, "unsupported_content"
                )
            out.append(part["text"])
        return "".join(out)
    raise refuse(f"{where}: content must be a string or a list of text parts", where)


def _tool_calls(raw: Any, where: str) -> list[ToolCall]:
    if not isinstance(raw, list):
        raise refuse(f"{where}.tool_calls must be a list", where)
    calls = []
    for j, c in enumerate(raw):
        at = f"{where}.tool_calls[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(c, dict) or c.get("type", "function") != "function" or not isinstance(fn, dict):
            raise refuse(f"{at} must be a function call", at)
        if not isinstance(c.get("id"), str) or not isinstance(fn.get("name"), str):
            raise refuse(f"{at} needs an id and a function name", at)
        args = fn.get("arguments", "{}")
        try:
            parsed = json.loads(args) if isinstance(args, str) else None
        except ValueError:
            parsed = None
        if not isinstance(parsed, dict):
            raise refuse(f"{at}.function.arguments must be a JSON object in a string", at)
        calls.append(ToolCall(id=c["id"], name=fn["name"], arguments=parsed))
    return calls


def _conversation(messages: Any) -> tuple[str | None, list[Message]]:
    """The system text and the rest as transcript messages, with every tool call answered
    by a tool message (matched by id) before the next user or assistant message."""
    if not isinstance(messages, list) or not messages:
        raise refuse("messages must be a non-empty list", "messages")
    system: list[str] = []
    convo: list[Message] = []
    open_calls: dict[str, str] = {}  # id -> tool name, of the latest assistant's calls

    def check_answered(at: str) -> None:
        if open_calls:
            raise refuse(
                f"{at}: tool call {next(iter(open_calls))!r} has no tool message before it", at, "unanswered_tool_call"
            )

    for i, msg in enumerate(messages):
        at = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise refuse(f"{at} must be an object", at)
        role = msg.get("role")
        if role in ("system", "developer"):
            system.append(_text(msg.get("content"), at))
        elif role == "user":
            check_answered(at)
            name = msg.get("name")
            convo.append(
                Message(
                    role="user",
                    content=_text(msg.get("content"), at),
                    name=name if isinstance(name, str) and name else None,
                )
            )
        elif role == "assistant":
            check_answered(at)
            calls = _tool_calls(msg["tool_calls"], at) if msg.get("tool_calls") else []
            convo.append(Message(role="assistant", content=_text(msg.get("content"), at), tool_calls=calls))
            open_calls = {c.id: c.name for c in calls}
        elif role == "tool":
            call_id = msg.get("tool_call_id")
            if not isinstance(call_id, str) or call_id not in open_calls:
                raise refuse(
                    f"{at}: tool_call_id {call_id!r} answers no call of the assistant message before it",
                    at,
                    "unmatched_tool_message",
                )
            convo.append(
                Message(
                    role="tool",
                    content=_text(msg.get("content"), at),
                    tool_call_id=call_id,
                    name=open_calls.pop(call_id),
                )
            )
        else:
            raise refuse(
                f"{at}: role {role!r} is not supported (system, developer, user, assistant, tool)",
                at,
                "unsupported_role",
            )
    check_answered("the end of messages")
    if not convo or convo[-1].role == "assistant":
        raise refuse(
            "the last message must be a user message or a tool result (the server does not continue an"
            " assistant message)",
            "messages",
        )
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
        raise refuse("tools must be a list", "tools")
    out = []
    for i, t in enumerate(raw):
        at = f"tools[{i}]"
        fn = t.get("function") if isinstance(t, dict) else None
        if (
            not isinstance(t, dict)
            or t.get("type") != "function"
            or not isinstance(fn, dict)
            or not isinstance(fn.get("name"), str)
        ):
            raise refuse(
                f'{at}: only function tools are supported ({{"type": "function", "function": {{"name": ...}}}})',
                at,
                "unsupported_tool",
            )
        params = fn.get("parameters")
        if params is None:
            params = {"type": "object", "properties": {}}
        desc = fn.get("description")
        out.append(ToolSpec(name=fn["name"], description=desc if isinstance(desc, str) else "", parameters=params))
    return out


def _tool_choice(raw: Any) -> m.ToolChoice:
    if raw in ("auto", "none", "required"):
        return raw  # type: ignore[no-any-return]
    if (
        isinstance(raw, dict)
        and raw.get("type") == "function"
        and isinstance(raw.get("function"), dict)
        and isinstance(raw["function"].get("name"), str)
    ):
        return m.NamedTool(tool=raw["function"]["name"])
    raise refuse(
        'tool_choice must be "auto", "none", "required" or {"type": "function", "function": {"name": ...}}',
        "tool_choice",
    )


def _schema(raw: Any) -> dict[str, Any] | None:
    if not isinstance(raw, dict):
        raise refuse("response_format must be an object", "response_format")
    kind = raw.get("type")
    if kind == "text":
        return None
    if kind == "json_object":
        return {"type": "object"}
    if kind == "json_schema":
        spec = raw.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise refuse("response_format json_schema needs json_schema.schema, an object", "response_format")
        return spec["schema"]  # type: ignore[no-any-return]
    raise refuse(f"response_format type {kind!r} is not supported (text, json_object, json_schema)", "response_format")


def plan_chat(body: Any) -> ChatPlan:
    """A chat completion request as the service runs it; ``invalid_request`` (400) for
    anything malformed or unsupported, naming the parameter."""
    if not isinstance(body, dict):
        raise refuse("the request body must be a JSON object")
    body = {k: v for k, v in body.items() if v is not None}  # null is absent, as OpenAI takes it
    for key, value in body.items():
        if key in SUPPORTED:
            continue
        neutral = NEUTRAL.get(key)
        if neutral is None:
            raise refuse(f"parameter {key!r} is not supported", key, "unsupported_parameter")
        if not neutral(value):
            raise refuse(
                f"parameter {key!r} is not supported (only its default, which changes nothing)",
                key,
                "unsupported_parameter",
            )
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise refuse('model is required: an engine name (GET /v1/models) or "auto"', "model")
    if body.get("n", 1) != 1:
        raise refuse("n must be 1: one choice per request", "n", "unsupported_parameter")
    instructions, convo = _conversation(body.get("messages"))
    last_user = max((i for i, x in enumerate(convo) if x.role == "user"), default=-1)
    if convo[-1].role == "user":
        history, prompt, speaker, resume = convo[:-1], convo[-1].content, convo[-1].name, None
    else:  # tool results: the open turn starts at the last user message (or at the start)
        start = max(last_user, 0)
        history, prompt, speaker, resume = (
            convo[:start],
            (convo[start].content if last_user >= 0 else ""),
            None,
            convo[start:],
        )
    try:
        wanted = {ours: body[theirs] for theirs, ours in OPTIONS.items() if theirs in body}
        options = msgspec.convert(wanted, GenerationOptions)
    except msgspec.ValidationError as e:
        problem = str(e)
        for theirs, ours in OPTIONS.items():
            problem = problem.replace(f"`$.{ours}`", f"`{theirs}`")
        raise refuse(problem, None) from None
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise refuse("stream must be true or false", "stream")
    stream_options = body.get("stream_options", {})
    if not isinstance(stream_options, dict) or set(stream_options) - {"include_usage"}:
        raise refuse("stream_options supports include_usage only", "stream_options", "unsupported_parameter")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise refuse("parallel_tool_calls must be true or false", "parallel_tool_calls")
    script = body.get("script")
    if script is not None and not isinstance(script, list):
        raise refuse("script (the scripted engine's steps) must be a list", "script")
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


def calls_json(records: list[m.ToolRecord], with_index: bool = False) -> list[dict[str, Any]]:
    out = []
    for i, r in enumerate(records):
        function = {"name": r.name, "arguments": json.dumps(r.arguments, ensure_ascii=False)}
        call: dict[str, Any] = {"id": r.call_id, "type": "function", "function": function}
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
    return {
        "prompt_tokens": u.input_tokens,
        "completion_tokens": u.output_tokens,
        "total_tokens": u.input_tokens + u.output_tokens,
    }


def completion(plan: ChatPlan, done: m.TurnCompleted, completion_id: str, created: int) -> dict[str, Any]:
    """The non-streamed response body for a completed turn."""
    calls = handed_calls(done)
    message: dict[str, Any] = {"role": "assistant", "content": done.text if done.text or not calls else None}
    if calls:
        message["tool_calls"] = calls_json(calls)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": plan.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish_reason(done), "logprobs": None}],
        "usage": usage_json(done),
        "system_fingerprint": None,
    }


def chunk(
    plan: ChatPlan,
    completion_id: str,
    created: int,
    delta: dict[str, Any] | None,
    finish: str | None = None,
    usage: dict[str, int] | None = None,
) -> dict[str, Any]:
    """One ``chat.completion.chunk``; ``delta`` None: the usage chunk (no choices)."""
    body: dict[str, Any] = {
        "id": completion_id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": plan.model,
        "system_fingerprint": None,
    }
    body["choices"] = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    if usage is not None:
        body["usage"] = usage
    return body


def error_body(code: str, message: str, param: str | None = None, retryable: bool = False) -> dict[str, Any]:
    """OpenAI's error shape, with the bridge's stable code in ``code``."""
    status = HTTP_STATUS.get(code, 500)
    if 400 <= status < 500 and status not in (429, 499):
        kind = "invalid_request_error"
    else:
        kind = "rate_limit_error" if status == 429 else "server_error"
    return {"error": {"message": message, "type": kind, "param": param, "code": code, "retryable": retryable}}


def bridge_error_body(e: BridgeError) -> dict[str, Any]:
    param = e.data.get("param")
    return error_body(e.code, e.message, param if isinstance(param, str) else None, e.retryable)


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def model_json(name: str) -> dict[str, Any]:
    """The model object of ``GET /v1/models`` for an engine name (or "auto")."""
    return {"id": name, "object": "model", "created": 0, "owned_by": "oam-bridge"}
