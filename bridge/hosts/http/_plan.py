"""The mapping between OpenAI's chat completion JSON and the service's types for ``oam serve``
(``app``): plain functions with no I/O. ``parse_chat`` reads a request body (``decode_body``,
bounded in depth, then ``plan_chat``) into a ``ChatPlan``, or refuses it with
``invalid_request``, naming the parameter; ``completion``, ``chunk``, ``usage_json`` and
``error_body`` write the response bodies, ``sse`` frames a streamed one; ``StopScan`` cuts a
step's text at a ``stop`` sequence; ``turn_failure`` says what a failed turn answers (a
forced call or a JSON answer cut off by the token budget is ``max_tokens_reached``, 422: the
same request fails the same way, so it is not retryable). ``Refusal`` carries the codes only
this host has (``HTTP_ONLY``). docs/http.md is the contract.
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from bridge.core import _messages as m
from bridge.engines._text._grammar import CALL_PREFIX
from bridge.engines.base import GenerationOptions, Message, ToolCall, ToolSpec
from bridge.errors import HTTP_STATUS, BridgeError
from bridge.hosts._json import nesting_ok

# Deeper JSON is refused (invalid_request, reason too_deep), as the JSON-RPC host refuses a
# line nested deeper than its limits.maxNestingDepth (invalid_message, reason too_deep).
MAX_NESTING_DEPTH = 100

# The codes only this host has (not in the error table every host shares): their status.
HTTP_ONLY: dict[str, int] = {
    "invalid_api_key": 401,
    "host_not_allowed": 403,
    "origin_not_allowed": 403,
    "request_timeout": 408,
    "unsupported_media_type": 415,
    "max_tokens_reached": 422,
}


class Refusal(Exception):
    """A refusal with one of ``HTTP_ONLY``'s codes (never retryable)."""

    def __init__(
        self, code: str, message: str, param: str | None = None, headers: dict[str, str] | None = None
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.param = param
        self.status = HTTP_ONLY[code]
        self.headers = headers or {}


# Parameters taken as they are (``stop`` and the sampling fields below are taken where the
# engine honours them).
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
# Parameters accepted at the value that changes nothing (null counts as absent too); any
# other value is taken only where the request's engine honours it (``HONOURED``), refused
# otherwise, never ignored.
NEUTRAL: dict[str, Callable[[Any], bool]] = {
    "presence_penalty": lambda v: v == 0,
    "frequency_penalty": lambda v: v == 0,
    "logprobs": lambda v: v is False,
    "logit_bias": lambda v: v == {},
    "stop": lambda v: v == [],
    "store": lambda v: v is False,
}


def _is_number(v: Any, low: float, high: float) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and low <= v <= high


MAX_STOP_CHARS = 128  # the longest stop sequence: the scan holds back up to that much text


def _is_stop(v: Any) -> bool:
    if isinstance(v, str):
        v = [v]
    return isinstance(v, list) and len(v) <= 4 and all(isinstance(x, str) and 0 < len(x) <= MAX_STOP_CHARS for x in v)


# The fields an engine may honour: what a value must be (checked first, whatever the engine).
VALID: dict[str, tuple[Callable[[Any], bool], str]] = {
    "stop": (_is_stop, f"a string or a list of at most 4 strings, each of 1 to {MAX_STOP_CHARS} characters"),
    "presence_penalty": (lambda v: _is_number(v, -2, 2), "a number from -2 to 2"),
    "frequency_penalty": (lambda v: _is_number(v, -2, 2), "a number from -2 to 2"),
    "logit_bias": (
        lambda v: isinstance(v, dict) and all(_is_number(x, -100, 100) for x in v.values()),
        "an object of token ids to numbers from -100 to 100",
    ),
    "top_k": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0, "an integer, 0 or more"),
    "min_p": (lambda v: _is_number(v, 0, 1), "a number from 0 to 1"),
}


def _anything(_: Any) -> bool:
    return True


# The llama engine samples with these (bridge/engines/llama/_worker.py; a test keeps them equal).
LLAMA_TOP_K = 40
LLAMA_MIN_P = 0.05

# Per engine, the values of those fields it honours beyond the neutral ones. ``stop`` is the
# server's own (it cuts the answer, whatever the engine); the scripted engine samples nothing,
# so every sampling value holds there; the llama engine's top-k and min-p are fixed; the
# openai engine cannot pass these fields on, nor the native one to Apple's model.
HONOURED: dict[str, dict[str, Callable[[Any], bool]]] = {
    "scripted": {name: _anything for name in VALID},
    "llama": {"stop": _anything, "top_k": lambda v: v == LLAMA_TOP_K, "min_p": lambda v: v == LLAMA_MIN_P},
    "openai": {"stop": _anything},
    "native": {"stop": _anything},
}
UNHONOURED_WHY = {
    "llama": f"it samples with top_k {LLAMA_TOP_K} and min_p {LLAMA_MIN_P}, and no penalties or logit bias",
    "openai": "the openai engine passes on temperature, top_p, seed and max_tokens only",
    "native": "Apple's model takes temperature, seed and max_tokens only",
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


def too_deep(param: str | None = None) -> BridgeError:
    where = f"{param} is" if param else "the request body is"
    return refuse(f"{where} nested deeper than {MAX_NESTING_DEPTH} levels", param, "too_deep")


def decode_body(data: bytes) -> Any:
    """A request body as JSON, at most ``MAX_NESTING_DEPTH`` deep; ``invalid_request``
    otherwise (``reason`` ``not_json`` or ``too_deep``)."""
    try:
        body = msgspec.json.decode(data)
    except RecursionError:
        raise too_deep() from None
    except msgspec.DecodeError as e:
        raise refuse(f"the request body is not valid JSON: {e}", None, "not_json") from None
    # a body shorter than the limit cannot nest that deep: skip the walk
    if len(data) > MAX_NESTING_DEPTH and not nesting_ok(body, MAX_NESTING_DEPTH):
        raise too_deep()
    return body


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
    stop: tuple[str, ...] = ()  # the answer ends before the first of these
    budget_param: str | None = None  # the field that set the token budget, if one did
    # The conversation (``conversation_key``): all its messages, and those before its last
    # assistant message (None: it has none). A request whose ``prefix_key`` is an earlier
    # request's ``key`` continues that request's conversation.
    key: str | None = None
    prefix_key: str | None = None


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
            parsed = msgspec.json.decode(args) if isinstance(args, str) else None
        except RecursionError:
            raise too_deep(f"{at}.function.arguments") from None
        except msgspec.DecodeError:
            parsed = None
        if not isinstance(parsed, dict):
            raise refuse(f"{at}.function.arguments must be a JSON object in a string", at)
        if len(args) > MAX_NESTING_DEPTH and not nesting_ok(parsed, MAX_NESTING_DEPTH):
            raise too_deep(f"{at}.function.arguments")
        calls.append(ToolCall(id=c["id"], name=fn["name"], arguments=parsed))
    return calls


_KEY_ENCODER = msgspec.json.Encoder(order="sorted")


def conversation_key(entries: list[Any]) -> str:
    """A digest of messages as ``_conversation`` reads them: clients that send back what the
    server answered in another form (a null content, other key order, extra fields, arguments
    re-serialized) still name the same conversation."""
    return hashlib.sha256(_KEY_ENCODER.encode(entries)).hexdigest()


def _conversation(messages: Any, entries: list[Any] | None = None) -> tuple[str | None, list[Message]]:
    """The system text and the rest as transcript messages, with every tool call answered
    by a tool message (matched by id) before the next user or assistant message.
    ``entries``, if given, gets each message as ``conversation_key`` reads it."""
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
            if entries is not None:
                entries.append([role, system[-1]])
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
        if entries is not None and role != "system" and role != "developer":
            x = convo[-1]
            calls_key = [[c.id, c.name, c.arguments] for c in x.tool_calls]
            entries.append([x.role, x.content, x.name, calls_key, x.tool_call_id])
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


def _check_fields(body: dict[str, Any], engine: str | None) -> None:
    """Refuse the fields the server does not take, and the values of ``VALID``'s fields that
    the request's engine (None: not known) does not honour, naming the field."""
    honoured = HONOURED.get(engine or "", {})
    for key, value in body.items():
        if key in SUPPORTED:
            continue
        check = VALID.get(key)
        if check is not None and not check[0](value):
            raise refuse(f"{key} must be {check[1]}", key)
        neutral = NEUTRAL.get(key)
        if neutral is not None and neutral(value):
            continue
        honours = honoured.get(key)
        if honours is not None and honours(value):
            continue
        if neutral is None and check is None:
            raise refuse(f"parameter {key!r} is not supported", key, "unsupported_parameter")
        if engine is None or check is None:
            raise refuse(
                f"parameter {key!r} is not supported (only its default, which changes nothing)",
                key,
                "unsupported_parameter",
            )
        why = UNHONOURED_WHY.get(engine, "")
        raise refuse(
            f"parameter {key!r} is not supported with this value on the {engine} engine" + (f" ({why})" if why else ""),
            key,
            "unsupported_parameter",
        )


def plan_chat(
    body: Any,
    engine_of: Callable[[str], str | None] | None = None,
    conversation_keys: bool = False,
    context_sizes: dict[str, int] | None = None,
) -> ChatPlan:
    """A chat completion request as the service runs it; ``invalid_request`` (400) for
    anything malformed or unsupported, naming the parameter. ``engine_of``: the engine a
    ``model`` names (None: no engine), which decides the values of ``stop`` and the sampling
    fields taken (without it: only their neutral values). ``conversation_keys``: fill in
    ``key`` and ``prefix_key``. ``context_sizes``: the context window of the engines known
    (engine -> tokens): a history of more turns than the request's engine has tokens keeps
    only its latest turns, as many as it has tokens (every turn costs a token at least, so
    the window could never show the others: the NPC would drop them itself)."""
    if not isinstance(body, dict):
        raise refuse("the request body must be a JSON object")
    body = {k: v for k, v in body.items() if v is not None}  # null is absent, as OpenAI takes it
    model = body.get("model")
    engine = engine_of(model) if engine_of is not None and isinstance(model, str) and model else None
    _check_fields(body, engine)
    if not isinstance(model, str) or not model:
        raise refuse('model is required: an engine name (GET /v1/models) or "auto"', "model")
    if body.get("n", 1) != 1:
        raise refuse("n must be 1: one choice per request", "n", "unsupported_parameter")
    entries: list[Any] | None = [] if conversation_keys else None
    instructions, convo = _conversation(body.get("messages"), entries)
    key = prefix_key = None
    if entries is not None:
        key = conversation_key(entries)
        raw = body["messages"]
        last_assistant = max((i for i, x in enumerate(raw) if x.get("role") == "assistant"), default=-1)
        prefix_key = conversation_key(entries[:last_assistant]) if last_assistant >= 0 else None
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
    schema = _schema(body["response_format"]) if "response_format" in body else None
    raw_stop = body.get("stop", [])
    stop = (raw_stop,) if isinstance(raw_stop, str) else tuple(raw_stop)
    if stop and schema is not None:
        raise refuse(
            "stop cannot cut a JSON answer (response_format), which must match its schema whole",
            "stop",
            "unsupported_parameter",
        )
    budget = next((k for k in ("max_completion_tokens", "max_tokens") if k in body), None)
    return ChatPlan(
        model=model,
        engine=engine or model,
        instructions=instructions,
        tools=_tools(body["tools"]) if "tools" in body else [],
        options=options,
        history=_latest(_turns(history), (context_sizes or {}).get(engine or "")),
        prompt=prompt,
        speaker=speaker,
        resume=resume,
        tool_choice=_tool_choice(body["tool_choice"]) if "tool_choice" in body else "auto",
        max_tool_calls=8 if parallel else 1,
        schema=schema,
        stream=stream,
        include_usage=stream_options.get("include_usage") is True,
        script=script,
        stop=stop,
        budget_param=budget,
        key=key,
        prefix_key=prefix_key,
    )


def _latest(turns: list[list[Message]], most: int | None) -> list[list[Message]]:
    return turns[-most:] if most is not None and 0 < most < len(turns) else turns


def parse_chat(
    data: bytes,
    engine_of: Callable[[str], str | None] | None = None,
    conversation_keys: bool = False,
    context_sizes: dict[str, int] | None = None,
) -> ChatPlan:
    """``decode_body`` then ``plan_chat``: the whole of reading a request, which the server
    runs off its event loop for a large body."""
    return plan_chat(decode_body(data), engine_of, conversation_keys, context_sizes)


class StopScan:
    """A step's streamed text cut before the first ``stop`` sequence: ``feed`` returns what
    may be shown now, holding back an end that may be the start of a stop sequence; once one
    is seen (``hit``) nothing more is shown. ``step_text`` is what was shown of the current
    step (a delta with ``reset`` starts a new step, and shows what the last one held)."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        self.stops = stops
        self.held = ""
        self.step_text = ""
        self.hit = False

    def feed(self, delta: str, reset: bool = False) -> str:
        if self.hit:
            return ""
        out = ""
        if reset:
            out, self.held, self.step_text = self.held, "", ""
        text = self.held + delta
        cut = min((i for i in (text.find(s) for s in self.stops) if i >= 0), default=len(text))
        # where a stop sequence may still begin before ``cut`` (its start is the text's end):
        # a longer one that starts earlier than the one found wins, so wait for it
        pending = next(
            (p for p in range(cut) if any(len(s) > len(text) - p and s.startswith(text[p:]) for s in self.stops)),
            -1,
        )
        if cut < len(text) and pending < 0:
            self.hit = True
            self.held = ""
            self.step_text += text[:cut]
            return out + text[:cut]
        keep = len(text) - pending if pending >= 0 else 0
        shown, self.held = text[: len(text) - keep], text[len(text) - keep :]
        self.step_text += shown
        return out + shown

    def flush(self) -> str:
        """At the turn's end: what is still held, up to a stop sequence in it (``hit``)."""
        out, self.held = self.held, ""
        cut = min((i for i in (out.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            self.hit, out = True, out[:cut]
        self.step_text += out
        return out


# What the agent and the engines say when a step's output was cut off by the token budget
# (bridge/core/agent/_steering.py, bridge/engines/_text/_grammar.py; a test keeps them), and
# when a step that had to call a tool ended without a call.
CUT_OFF = "cut off by maxTokens"
REQUIRED_NO_CALL = "without calling a tool on a step that required one"


def _partial_call(text: str) -> bool:
    """Whether a step's text is the start of a call batch (``{"tool_calls"...``): a forced call
    that the token budget cut off before the engine could read it as a call."""
    norm = "".join(text.split())
    return bool(norm) and (norm.startswith(CALL_PREFIX) or CALL_PREFIX.startswith(norm))


def turn_failure(plan: ChatPlan, error: m.ErrorInfo, step_text: str) -> BridgeError | Refusal:
    """What a failed turn answers. A forced tool call or a JSON answer cut off by the token
    budget (the message says so, or the step's text is the start of a call batch) is
    ``max_tokens_reached`` (422, not retryable): the same request fails the same way."""
    if error.code == "generation_failed" and (
        CUT_OFF in error.message or (REQUIRED_NO_CALL in error.message and _partial_call(step_text))
    ):
        budget = plan.budget_param or "max_tokens"
        return Refusal(
            "max_tokens_reached",
            f"{error.message}: the forced tool call or JSON answer did not fit in the token budget; raise {budget}",
            plan.budget_param,
        )
    return BridgeError(error.code, error.message)


class ScriptPositions:
    """Where the server's script (``oam serve --script``) stands in each conversation: the
    position after a request, by the request's ``key``, for the request that continues it
    (its ``prefix_key``); the least recently used are forgotten past ``max_kept``."""

    def __init__(self, steps: list[Any], max_kept: int = 4096) -> None:
        self.steps = steps
        self.max_kept = max_kept
        self._at: OrderedDict[str, int] = OrderedDict()

    def start(self, prefix_key: str | None) -> int:
        if prefix_key is None or prefix_key not in self._at:
            return 0
        self._at.move_to_end(prefix_key)
        return self._at[prefix_key]

    def record(self, key: str | None, position: int) -> None:
        if key is None:
            return
        self._at[key] = position
        self._at.move_to_end(key)
        while len(self._at) > self.max_kept:
            self._at.popitem(last=False)


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
    return completion_body(
        plan,
        completion_id,
        created,
        done.text if done.text or not calls else None,
        calls,
        finish_reason(done),
        usage_json(done),
    )


def completion_body(
    plan: ChatPlan,
    completion_id: str,
    created: int,
    content: str | None,
    calls: list[m.ToolRecord],
    finish: str,
    usage: dict[str, int],
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls_json(calls)
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": created,
        "model": plan.model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": usage,
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


def error_body(
    code: str, message: str, param: str | None = None, retryable: bool = False, reason: str | None = None
) -> dict[str, Any]:
    """OpenAI's error shape, with the bridge's stable code in ``code`` (and ``reason`` when the
    code has several causes)."""
    status = HTTP_STATUS.get(code) or HTTP_ONLY.get(code, 500)
    if 400 <= status < 500 and status not in (429, 499):
        kind = "invalid_request_error"
    else:
        kind = "rate_limit_error" if status == 429 else "server_error"
    error: dict[str, Any] = {"message": message, "type": kind, "param": param, "code": code, "retryable": retryable}
    if reason is not None:
        error["reason"] = reason
    return {"error": error}


def bridge_error_body(e: BridgeError) -> dict[str, Any]:
    param, reason = e.data.get("param"), e.data.get("reason")
    return error_body(
        e.code,
        e.message,
        param if isinstance(param, str) else None,
        e.retryable,
        reason if isinstance(reason, str) else None,
    )


def refusal_body(r: Refusal) -> dict[str, Any]:
    return error_body(r.code, r.message, r.param)


def sse(data: dict[str, Any] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False, separators=(",", ":"))
    return f"data: {text}\n\n".encode()


def model_json(name: str, engine: str | None = None) -> dict[str, Any]:
    """The model object of ``GET /v1/models`` for an engine name (or "auto"), or for the name
    of the model an engine serves (``engine`` says which)."""
    out: dict[str, Any] = {"id": name, "object": "model", "created": 0, "owned_by": "oam-bridge"}
    if engine is not None:
        out["engine"] = engine
    return out
