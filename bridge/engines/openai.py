"""The remote engine: NPC steps on any OpenAI-compatible server (llama-server, vLLM, Ollama,
llama-cpp-python's ``llama_cpp.server``), over ``POST {url}/chat/completions`` with SSE.

The steering stays in ``bridge.core.agent._steering`` (tool choice on the first step only, budgets,
hidden tools, validation, rollback): this engine sends each step as the agent built it.

- ``request.tools`` go out as the step gives them; ``tool_mode`` sets ``tool_choice``:
  ``required`` with one tool (a named tool, or a budget-free ``required`` with one tool) names
  it (``{"type": "function", ...}``: the form every server constrains, llama_cpp.server by a
  grammar from the tool's schema), ``required`` with several is ``"required"``, ``allowed`` is
  ``"auto"``, and a ``disallowed`` step sends no tools at all.
- ``request.schema`` goes out as ``response_format`` ``json_schema`` (OpenAI, llama-server,
  vLLM, Ollama); a server that refuses that form with a 400/422/500 naming ``response_format``
  (llama_cpp.server takes only ``{"type": "json_object", "schema": ...}``, and says so with a 500) gets that form
  instead, from then on.
- Streamed ``content`` deltas become ``TextChunk``s, streamed ``tool_calls`` pieces are put
  together into one ``ToolCallsChunk``, ``finish_reason`` ends the step (``length`` kept,
  ``content_filter`` is ``guardrail_violation``).
- A server that did not constrain what it was asked to shows in the step's warnings: call
  arguments that are not JSON (such a call is dropped; if no call is left the step fails
  ``generation_failed``, retryable) or that break the tool's schema (the agent turns those
  into error outputs the model sees), and answers that break the schema.
- Errors: connection refused, connect timeout, 404 (unknown model or URL), 401/403 and 503:
  ``model_unavailable``; 429: ``rate_limited``; a read timeout, a dropped connection, other
  5xx and malformed streams: ``generation_failed``; a 400 about the context length:
  ``context_size_exceeded``.
- The stream is read as bytes (``_sse``): SSE lines end at CR, LF or CRLF only (a raw U+2028
  inside an event's JSON is text), and each ``data:`` event is checked against the shape of a
  ``chat.completion.chunk`` (msgspec structs); an event that is not JSON, not an object or has
  a field of the wrong type fails the step ``generation_failed`` naming the field. The
  ``finish_reason`` reaching the agent is ``stop``, ``length`` or ``tool_calls``, whatever the
  server said (``content_filter`` aside).
- Everything read is bounded: an error body to 64 KiB (the rest left unread, the connection
  closed), ``GET /models`` to 4 MiB, a stream line to 4 MiB (the bridge's default
  ``maxLineBytes``: the game's limits do not reach engines), a step's output to 32 characters
  per ``maxTokens`` (at least 4096, at most 1 MiB; 1 MiB without ``maxTokens``) and 128 tool
  calls, and a whole step to ``step_timeout_s`` (``--openai-step-timeout``, default 120 s;
  ``: ping`` comments do not keep a step alive past it). A bound that is hit fails the step
  ``generation_failed`` whose message starts with the reason (``stream_line_too_long``,
  ``output_too_long``, ``step_timeout``; ``malformed_event`` and ``malformed_stream`` for
  what is not a stream), repeated in the error's ``data.reason``.
- Requests of different NPCs run concurrently (one ``httpx.AsyncClient`` on trio); closing
  the step's generator (the agent's ``aclosing`` on cancel) closes the HTTP response, which
  drops the connection, and a server stops generating for a client that left.
- Grammar mode (``grammar=True``: ``--openai-grammar``, ``OAM_OPENAI_GRAMMAR=1``), for servers
  that take a GBNF ``grammar`` field (llama-server, llama_cpp.server) but do not constrain a
  choice among several tools: no ``tools``, ``tool_choice`` or ``response_format`` go out;
  the system message describes the step's tools and answer as the llama engine's prompt does
  (tool rounds told as facts), and ``grammar`` is the llama engine's GBNF for the step (a
  ``{"tool_calls":[...]}`` batch of the step's tools only, free text or the schema's JSON).
  Streamed text that starts with ``{"tool_calls"`` becomes one ``ToolCallsChunk``; other
  text streams as it comes (held back only while it could still be that start).
- Token counts are an estimate (characters / 4, plus a few per message; no server round
  trip), cheap enough for the event loop: ``blocking_count`` is False.
"""

from __future__ import annotations

import email.utils
import json
import logging
import math
import time
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast
from urllib.parse import urlsplit

import httpx
import jsonschema
import msgspec
import trio

from bridge.engines._sse import (
    LINE_MAX_BYTES,
    BodyDecoder,
    CallPiece,
    Event,
    EventUsage,
    LineReader,
    StreamProblem,
    first_model,
    parse_event,
)
from bridge.engines._text._grammar import CallSniffer, build_grammar
from bridge.engines._text._prompt import PromptRenderer
from bridge.engines.base import (
    Chunk,
    EngineInfo,
    Message,
    StepDone,
    StepRequest,
    TextChunk,
    ToolCall,
    ToolCallsChunk,
    ToolSpec,
    Usage,
    user_text,
)
from bridge.errors import BridgeError

log = logging.getLogger("oam_bridge.engines.openai")

FEATURES = ["tools", "streaming", "schema", "remote"]
DEFAULT_CTX = 4096
DEFAULT_TIMEOUT_S = 60.0  # longest wait for the next bytes of an answer (a busy server reads prompts)
DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_STEP_TIMEOUT_S = 120.0  # longest a whole step may take, request to last event (0: no deadline)
CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD = 4  # tokens a chat template spends on a message's role and separators
ERROR_BODY_MAX = 300  # characters of a server's error body kept in a message
ERROR_BODY_READ_MAX = 64 * 1024  # bytes of an error body read; the rest is left unread, the connection closed
MODELS_BODY_MAX = 4 * 1024 * 1024  # bytes of a GET /models answer read
# A step's output (streamed text and call arguments, in characters): 32 per maxTokens (no
# tokenizer writes tokens that long), at least 4096, at most 1 MiB, which is also the bound
# of a step without maxTokens. More fails the step (output_too_long).
OUTPUT_CHARS_PER_TOKEN = 32
OUTPUT_MIN_CHARS = 4096
OUTPUT_MAX_CHARS = 1024 * 1024
MAX_STEP_CALLS = 128  # distinct tool calls one step may stream
CLOSE_GRACE_S = 1.0  # how long closing a response may take, even in a cancelled turn


def base_url(url: str) -> str:
    """The API root: ``http://host:8080`` and ``http://host:8080/v1`` both mean
    ``http://host:8080/v1``; a URL with another path is taken as it is."""
    url = url.strip().rstrip("/")
    if urlsplit(url).path in ("", "/"):
        url += "/v1"
    return url


def availability(url: str | None = None) -> tuple[bool, str | None]:
    if not url:
        return False, "no server configured (--openai-url or OAM_OPENAI_URL)"
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return False, f"--openai-url {url!r} is not an http(s) URL"
    return True, None


def _estimate(text: str) -> int:
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN


def _tool_json(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool.name, "description": tool.description, "parameters": tool.parameters},
    }


def chat_messages(request: StepRequest) -> list[dict[str, Any]]:
    """The step as OpenAI chat messages: the instructions as the system message, then the
    history with its tool calls and results (user lines as ``base.user_text`` renders them)."""
    out: list[dict[str, Any]] = []
    if request.instructions:
        out.append({"role": "system", "content": request.instructions})
    for m in request.messages:
        if m.role == "user":
            out.append({"role": "user", "content": user_text(m)})
        elif m.role == "assistant":
            msg: dict[str, Any] = {"role": "assistant", "content": m.content}
            if m.tool_calls:
                msg["tool_calls"] = [
                    {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                    for c in m.tool_calls
                ]
            out.append(msg)
        else:
            out.append({"role": "tool", "tool_call_id": m.tool_call_id or "", "content": m.content})
    return out


RETRY_AFTER_MAX_MS = 24 * 3600 * 1000  # a Retry-After further off than a day is not passed on


def retry_after_ms(value: str | None, now: float | None = None) -> int | None:
    """A ``Retry-After`` header in milliseconds: delta-seconds or an HTTP date (RFC 9110);
    None when absent, unreadable, or more than a day off."""
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        ms = int(value[:12]) * 1000
    else:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when is None or when.tzinfo is None:
            return None
        ms = int((when.timestamp() - (time.time() if now is None else now)) * 1000)
    return max(0, ms) if ms <= RETRY_AFTER_MAX_MS else None


def _status_error(status: int, body: str, url: str, retry_after: str | None = None) -> BridgeError:
    text = " ".join(body.split())[:ERROR_BODY_MAX]
    where = f"the server at {url}"
    if status == 429:
        after = retry_after_ms(retry_after)
        extra = {} if after is None else {"retryAfterMs": after}
        return BridgeError(
            "rate_limited", f"{where} is rate-limiting requests (HTTP 429): {text}", status=status, **extra
        )
    if status in (401, 403):
        return BridgeError(
            "model_unavailable",
            f"{where} refused the request (HTTP {status}; check --openai-api-key): {text}",
            status=status,
        )
    if status == 404:
        return BridgeError(
            "model_unavailable",
            f"{where} has no such model or endpoint (HTTP 404; check --openai-model and --openai-url): {text}",
            status=status,
        )
    if status == 503:
        return BridgeError("model_unavailable", f"{where} is unavailable (HTTP 503): {text}", status=status)
    if status in (400, 413, 422) and (
        "context" in text.lower() or "too long" in text.lower() or "exceed" in text.lower()
    ):
        return BridgeError(
            "context_size_exceeded", f"{where} refused the prompt as too long (HTTP {status}): {text}", status=status
        )
    return BridgeError("generation_failed", f"{where} failed (HTTP {status}): {text}", status=status)


def output_cap(request: StepRequest) -> int:
    """The most characters (text and call arguments) the step may stream."""
    max_tokens = request.options.max_tokens
    if max_tokens is None:
        return OUTPUT_MAX_CHARS
    return min(OUTPUT_MAX_CHARS, max(OUTPUT_MIN_CHARS, max_tokens * OUTPUT_CHARS_PER_TOKEN))


def _failed(reason: str, message: str) -> BridgeError:
    """``generation_failed`` for a bound or a malformed stream: the message starts with the
    reason (turn/failed carries no data), which ``data.reason`` repeats."""
    return BridgeError("generation_failed", f"{reason}: {message}", reason=reason)


async def _close(resp: httpx.Response) -> None:
    """Close a response (an unread rest drops the connection), even in a cancelled turn."""
    with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_GRACE_S):
        try:
            await resp.aclose()
        except httpx.HTTPError:
            pass


class _Reader:
    """A response's body, decoded piece by piece; each read ends by the step's deadline."""

    def __init__(self, resp: httpx.Response, deadline: float, timed_out: BridgeError) -> None:
        self._raw = cast(AsyncGenerator[bytes, None], resp.aiter_raw())  # an async generator: closed explicitly
        self._deadline = deadline
        self._timed_out = timed_out
        self._decoder = BodyDecoder(resp.headers.get("content-encoding", ""))

    async def read(self) -> list[bytes] | None:
        """The next pieces of the body (maybe none), None at its end."""
        if trio.current_time() >= self._deadline:
            raise self._timed_out
        with trio.move_on_at(self._deadline):
            try:
                data = await self._raw.__anext__()
            except StopAsyncIteration:
                return None
            return self._decoder.feed(data)
        raise self._timed_out

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_GRACE_S):
            try:
                await self._raw.aclose()
            except httpx.HTTPError:
                pass


class _Output:
    """What a step's events add up to, within the output bound."""

    def __init__(self, cap: int, sniff: CallSniffer) -> None:
        self.cap = cap
        self.sniff = sniff
        self.text = ""
        self.calls: dict[int, _Call] = {}
        self.finish: str | None = None
        self.usage: Usage | None = None
        self.chunks = 0
        self.chars = 0  # text and call arguments so far


def _grammar_tools(request: StepRequest) -> list[ToolSpec]:
    """The tools a grammar-mode step offers: none on a step where tools are disallowed."""
    return [] if request.tool_mode == "disallowed" else request.tools


async def _step_grammar(request: StepRequest) -> tuple[str | None, list[str]]:
    """The llama engine's GBNF for the step (None: free text) and its schema warnings, built
    on a worker thread (milliseconds, cached by the builder). The GBNF comes from
    llama-cpp-python's schema converter: without it installed the step fails."""
    if request.tool_mode == "disallowed" and request.tools:
        request = msgspec.structs.replace(request, tools=[])
    try:
        return await trio.to_thread.run_sync(build_grammar, request)
    except ImportError as e:
        raise BridgeError(
            "model_unavailable", f"--openai-grammar needs llama-cpp-python's grammar builder: {e}"
        ) from None
    except Exception as e:  # noqa: BLE001 - whatever the schema converter raises
        raise BridgeError("invalid_schema", f"cannot build grammar: {e}") from e


def _grammar_calls(batch: list[dict[str, Any]]) -> dict[int, _Call]:
    """The calls of a grammar-mode ``{"tool_calls":[...]}`` output, as streamed calls."""
    out: dict[int, _Call] = {}
    for i, raw in enumerate(batch):
        call = out[i] = _Call()
        call.name = raw["name"]
        call.arguments = json.dumps(raw.get("arguments") or {})
    return out


class _Call:
    __slots__ = ("id", "name", "arguments")

    def __init__(self) -> None:
        self.id = ""
        self.name = ""
        self.arguments = ""


class OpenAIEngine:
    """NPC steps on an OpenAI-compatible server. One HTTP client (connection pool) shared by
    every NPC on this engine; each step is one streamed request."""

    name = "openai"
    blocking_count = False

    def __init__(
        self,
        url: str | None = None,
        model: str | None = None,
        api_key: str | None = None,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S,
        n_ctx: int = DEFAULT_CTX,
        grammar: bool = False,
        step_timeout_s: float = DEFAULT_STEP_TIMEOUT_S,
    ) -> None:
        ok, reason = availability(url)
        self._available, self._reason = ok, reason
        self.url = base_url(url) if ok and url else ""
        self.model = model or None
        self._api_key = api_key or None
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self._step_timeout = step_timeout_s if step_timeout_s > 0 else math.inf
        self._n_ctx = n_ctx or DEFAULT_CTX
        self._client: httpx.AsyncClient | None = None
        self._model_looked_up = model is not None
        # "json_schema" (OpenAI's form) until a server refuses it, then llama_cpp.server's
        # {"type": "json_object", "schema": ...}
        self._schema_form = "json_schema"
        # tools and answers constrained by the llama engine's GBNF in the request's ``grammar``
        self.grammar = grammar

    # -- interface -------------------------------------------------------------------
    @property
    def context_size(self) -> int:
        return self._n_ctx

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name,
            available=self._available,
            reason=self._reason,
            context_size=self._n_ctx if self._available else 0,
            features=list(FEATURES) if self._available else [],
        )

    def count_tokens(self, instructions: str, messages: list[Message], tools: list[ToolSpec]) -> int:
        """An estimate: characters / 4 plus a few tokens per message (additive over messages,
        as the agent's batched counting wants); tools count as their JSON."""
        n = _estimate(instructions) + MESSAGE_OVERHEAD if instructions else 0
        for m in messages:
            n += MESSAGE_OVERHEAD + _estimate(user_text(m))
            for c in m.tool_calls:
                n += _estimate(c.name) + _estimate(json.dumps(c.arguments))
        for t in tools:
            n += _estimate(json.dumps(_tool_json(t)))
        return n

    def count_text(self, text: str) -> int:
        """``tokens/count``: the estimate for ``text`` alone (``""`` is 0)."""
        return _estimate(text)

    def forget(self, npc_id: str) -> None:
        pass  # nothing is kept per NPC: the server keeps its own caches

    async def aclose(self) -> None:
        if self._client is not None:
            client, self._client = self._client, None
            await client.aclose()

    # -- HTTP ------------------------------------------------------------------------
    def _http(self) -> httpx.AsyncClient:
        if self._client is None:
            # identity: a compressed stream arrives in bursts (a server that compresses
            # anyway is still read, in bounded pieces)
            headers = {"Accept-Encoding": "identity"}
            if self._api_key:
                headers["Authorization"] = f"Bearer {self._api_key}"
            # no connection limit of httpx's own: each NPC's step is one request, and the
            # bridge bounds the NPCs
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
            self._client = httpx.AsyncClient(timeout=self._timeout, headers=headers, limits=limits)
        return self._client

    async def _model(self, deadline: float) -> str | None:
        """The configured model, else the first one the server lists (``GET /models``, once,
        read to ``MODELS_BODY_MAX``); None when it lists none or answers something else (the
        request then names no model)."""
        if not self._model_looked_up:
            try:
                resp = await self._send(self._http().build_request("GET", f"{self.url}/models"), deadline)
                try:
                    if resp.status_code == 200:
                        body, more = await self._read_bounded(resp, MODELS_BODY_MAX, deadline)
                        if more:
                            raise BridgeError(
                                "model_unavailable",
                                f"the server at {self.url} lists more than {MODELS_BODY_MAX} bytes of models: "
                                "name one with --openai-model",
                            )
                        self.model = first_model(body)
                        if self.model:
                            log.info("openai engine: using the server's model %r", self.model)
                    elif resp.status_code in (401, 403, 429, 503) or resp.status_code >= 500:
                        err, _ = await self._read_bounded(resp, ERROR_BODY_READ_MAX, deadline)
                        raise _status_error(
                            resp.status_code,
                            err.decode("utf-8", "replace"),
                            self.url,
                            resp.headers.get("retry-after"),
                        )
                finally:
                    await _close(resp)
            except httpx.HTTPError as e:
                raise self._transport_error(e) from None
            self._model_looked_up = True
        return self.model

    def _deadline(self) -> float:
        return trio.current_time() + self._step_timeout

    def _timed_out(self) -> BridgeError:
        return _failed(
            "step_timeout",
            f"the server at {self.url} did not end the step within {self._step_timeout:g} s (--openai-step-timeout)",
        )

    async def _send(self, request: httpx.Request, deadline: float) -> httpx.Response:
        """The response's head (the body left to read), by the step's deadline."""
        with trio.move_on_at(deadline):
            return await self._http().send(request, stream=True)
        raise self._timed_out()

    async def _read_bounded(self, resp: httpx.Response, limit: int, deadline: float) -> tuple[bytes, bool]:
        """At most ``limit`` bytes of the body, and whether there was more (left unread: the
        response's close drops the connection). A body whose encoding is broken ends there."""
        buf = bytearray()
        try:
            reader = _Reader(resp, deadline, self._timed_out())
        except StreamProblem:
            return b"", False
        try:
            while len(buf) <= limit:
                pieces = await reader.read()
                if pieces is None:
                    return bytes(buf), False
                for piece in pieces:
                    buf += piece
        except StreamProblem:
            return bytes(buf[:limit]), len(buf) > limit
        finally:
            await reader.aclose()
        return bytes(buf[:limit]), True

    def _transport_error(self, e: httpx.HTTPError) -> BridgeError:
        if isinstance(e, httpx.ConnectTimeout):
            return BridgeError(
                "model_unavailable",
                f"the server at {self.url} did not accept a connection within {self._timeout.connect} s",
            )
        if isinstance(e, httpx.ConnectError):
            return BridgeError("model_unavailable", f"cannot connect to the server at {self.url}: {e}")
        if isinstance(e, httpx.ReadTimeout):
            return BridgeError(
                "generation_failed",
                f"the server at {self.url} sent nothing for {self._timeout.read} s (--openai-timeout)",
            )
        if isinstance(e, httpx.TimeoutException):
            return BridgeError("generation_failed", f"the server at {self.url} timed out: {type(e).__name__}")
        return BridgeError(
            "generation_failed", f"the connection to the server at {self.url} was lost: {type(e).__name__}: {e}"
        )

    def body(self, request: StepRequest, model: str | None, grammar: str | None = None) -> dict[str, Any]:
        """The ``/chat/completions`` request for one step. In grammar mode the step's tools
        and answer are told in the system message and ``grammar`` (the step's GBNF, None for
        free text) constrains the output."""
        if self.grammar:
            tools = _grammar_tools(request)
            system = PromptRenderer.system_text(request.instructions, tools, request.tool_mode, request.schema)
            messages = PromptRenderer.chat_messages(system, request.messages)
        else:
            messages = chat_messages(request)
        body: dict[str, Any] = {"messages": messages, "stream": True, "stream_options": {"include_usage": True}}
        if model:
            body["model"] = model
        if self.grammar:
            if grammar is not None:
                body["grammar"] = grammar
        elif request.tools and request.tool_mode != "disallowed":
            body["tools"] = [_tool_json(t) for t in request.tools]
            if request.tool_mode == "required":
                body["tool_choice"] = (
                    {"type": "function", "function": {"name": request.tools[0].name}}
                    if len(request.tools) == 1
                    else "required"
                )
            else:
                body["tool_choice"] = "auto"
        if request.schema is not None and not self.grammar:
            if self._schema_form == "json_schema":
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": "answer", "schema": request.schema, "strict": True},
                }
            else:
                body["response_format"] = {"type": "json_object", "schema": request.schema}
        o = request.options
        if o.max_tokens is not None:
            body["max_tokens"] = o.max_tokens
        if o.temperature is not None:
            body["temperature"] = o.temperature
        if o.seed is not None:
            body["seed"] = o.seed
        if o.top_p is not None:
            body["top_p"] = o.top_p
        return body

    # -- a step ----------------------------------------------------------------------
    async def stream_step(self, request: StepRequest) -> AsyncIterator[Chunk]:
        if not self._available:
            raise BridgeError("model_unavailable", self._reason or "no server configured")
        deadline = self._deadline()
        model = await self._model(deadline)
        warnings: list[str] = []
        grammar: str | None = None
        # grammar mode: output held back while it may still be the start of a call batch
        out = _Output(output_cap(request), CallSniffer(False))
        if self.grammar:
            grammar, grammar_warnings = await _step_grammar(request)
            warnings.extend(grammar_warnings)
            out.sniff = CallSniffer(bool(_grammar_tools(request)))
        for attempt in (0, 1):
            body = self.body(request, model, grammar)
            try:
                resp = await self._send(
                    self._http().build_request("POST", f"{self.url}/chat/completions", json=body), deadline
                )
            except httpx.HTTPError as e:
                raise self._transport_error(e) from None
            try:
                if resp.status_code != 200:
                    raw_err, _ = await self._read_bounded(resp, ERROR_BODY_READ_MAX, deadline)
                    err = raw_err.decode("utf-8", "replace")
                    if (
                        attempt == 0
                        and request.schema is not None
                        and self._schema_form == "json_schema"
                        and resp.status_code in (400, 422, 500)
                        and "response_format" in err
                    ):
                        log.info(
                            "openai engine: the server refused response_format json_schema; using json_object "
                            "with a schema"
                        )
                        self._schema_form = "json_object"
                        continue
                    raise _status_error(resp.status_code, err, self.url, resp.headers.get("retry-after"))
                reader = _Reader(resp, deadline, self._timed_out())
                try:
                    lines = LineReader(LINE_MAX_BYTES)
                    done = False
                    while not done:
                        pieces = await reader.read()
                        if pieces is None:  # the body's end: a last line without its line end counts
                            last = lines.end()
                            got = [last] if last is not None else []
                        else:
                            got = [line for piece in pieces for line in lines.feed(piece)]
                        for line in got:
                            if not line.startswith(b"data:"):
                                continue  # blank separators, ": ping" comments, event names
                            data = line[5:].strip(b" \t")
                            if not data:
                                continue  # an empty data field carries nothing
                            if data == b"[DONE]":
                                done = True
                                break
                            try:
                                event = parse_event(data)
                            except StreamProblem as e:
                                excerpt = data[:ERROR_BODY_MAX].decode("utf-8", "replace")
                                raise _failed(
                                    e.reason, f"the server at {self.url} sent {e.detail}: {excerpt}"
                                ) from None
                            if shown := self._take(event, out):
                                yield TextChunk(shown)
                        if pieces is None:
                            break
                finally:
                    await reader.aclose()
                if not done and out.finish is None:
                    raise BridgeError(
                        "generation_failed", f"the server at {self.url} ended the stream before the answer ended"
                    )
            except StreamProblem as e:
                raise _failed(e.reason, f"the server at {self.url} sent {e.detail}") from None
            except httpx.HTTPError as e:
                raise self._transport_error(e) from None
            finally:
                await _close(resp)
            break
        try:
            raw, rest = out.sniff.end(out.finish or "stop")  # grammar mode: a held call batch, or text
            calls = _grammar_calls(raw) if raw else out.calls
        except RecursionError:
            raise _failed("malformed_event", f"the server at {self.url} sent a call batch nested too deeply") from None
        if not raw and rest:
            yield TextChunk(rest)
        batch: list[ToolCall] = []
        if calls:
            batch = self._calls(request, calls, warnings)
            if batch:
                yield ToolCallsChunk(batch)
        if out.finish == "content_filter":
            raise BridgeError(
                "guardrail_violation", f"the server at {self.url} filtered the answer (finish_reason content_filter)"
            )
        if request.schema is not None and not calls and out.finish != "length":
            self._check_answer(request.schema, out.text, warnings)
        usage = out.usage or Usage(
            input_tokens=self.count_tokens(request.instructions, request.messages, request.tools),
            output_tokens=out.chunks,
        )
        # finish reasons the protocol documents only: a server's own ("eos", "end_turn", a
        # "tool_calls" with no call, calls on a step that offered no tools, which the agent
        # ignores: the text is the answer) are "stop"
        called = bool(batch) and request.tool_mode != "disallowed"
        finish = "tool_calls" if called else "length" if out.finish == "length" else "stop"
        yield StepDone(usage=usage, finish_reason=finish, warnings=warnings)

    def _take(self, event: Event, out: _Output) -> str:
        """One event into the step's output; the text to show now. A server's error event,
        or output past the bound, fails the step."""
        if event.error is not None:  # llama-server and vLLM report mid-stream errors so
            raise self._server_error(event.error)
        if event.usage is not None:
            out.usage = self._usage(event.usage)
        shown = ""
        for choice in event.choices or []:
            if (choice.index or 0) != 0:
                continue
            delta = choice.delta
            if delta is not None:
                if delta.content:
                    self._grow(out, len(delta.content))
                    out.text += delta.content
                    out.chunks += 1
                    shown += out.sniff.feed(delta.content)
                for i, piece in enumerate(delta.tool_calls or []):
                    self._grow(out, self._add_call_piece(out.calls, piece, i))
                    if len(out.calls) > MAX_STEP_CALLS:
                        raise _failed(
                            "output_too_long",
                            f"the server at {self.url} streamed more than {MAX_STEP_CALLS} tool calls",
                        )
            if choice.finish_reason:
                out.finish = choice.finish_reason
        return shown

    def _grow(self, out: _Output, n: int) -> None:
        out.chars += n
        if out.chars > out.cap:
            raise _failed(
                "output_too_long",
                f"the server at {self.url} sent more than {out.cap} characters for one step "
                "(text and call arguments; the bound is 32 per maxTokens, at least 4096, at most 1048576)",
            )

    def _server_error(self, err: Any) -> BridgeError:
        """A mid-stream ``{"error": ...}``: its message, and its ``code`` when that is an HTTP status."""
        msg = err.get("message") if isinstance(err, dict) else err
        code = err.get("code") if isinstance(err, dict) else None
        status = code if isinstance(code, int) and not isinstance(code, bool) and 400 <= code <= 599 else 500
        return _status_error(status, str(msg), self.url)

    @staticmethod
    def _usage(u: EventUsage) -> Usage:
        details = u.prompt_tokens_details
        return Usage(
            input_tokens=u.prompt_tokens or 0,
            output_tokens=u.completion_tokens or 0,
            cached_tokens=(details.cached_tokens or 0) if details is not None else 0,
        )

    @staticmethod
    def _add_call_piece(calls: dict[int, _Call], piece: CallPiece, position: int) -> int:
        """One streamed piece of a call: the first names it (id, name), the rest add to its
        arguments. ``index`` says which call; a server that leaves it out sends calls whole.
        The characters of arguments it added."""
        idx = piece.index
        if idx is None:
            idx = (
                len(calls)
                if piece.id and piece.id not in {c.id for c in calls.values()}
                else max(calls, default=position)
            )
        call = calls.setdefault(idx, _Call())
        if piece.id:
            call.id = piece.id
        fn = piece.function
        if fn is None:
            return 0
        if fn.name:
            call.name = fn.name
        args = fn.arguments
        if isinstance(args, dict):  # Ollama sends arguments as an object
            args = json.dumps(args)
        if args:
            call.arguments += args
            return len(args)
        return 0

    def _calls(self, request: StepRequest, calls: dict[int, _Call], warnings: list[str]) -> list[ToolCall]:
        """The streamed calls as one batch. Calls whose arguments are not a JSON object are
        dropped (the server did not constrain them), with a warning; when none is left the
        step fails (retryable). Arguments that break the tool's schema are kept, with a
        warning: the agent gives the model the error as the call's output."""
        schemas = {t.name: t.parameters for t in request.tools}
        out: list[ToolCall] = []
        bad: list[str] = []
        for idx in sorted(calls):
            c = calls[idx]
            raw = c.arguments.strip() or "{}"
            try:
                args = json.loads(raw)
            except (ValueError, RecursionError):
                args = None
            if not isinstance(args, dict):
                bad.append(f"{c.name or '?'}: {raw[:120]!r}")
                continue
            schema = schemas.get(c.name)
            if schema is not None:
                try:
                    problem = jsonschema.validators.validator_for(schema)(schema).is_valid(args) is False
                except Exception:  # noqa: BLE001 - the agent checks with its own validators
                    problem = False
                if problem:
                    warnings.append(f"the server did not constrain the arguments of {c.name!r} to its schema")
            out.append(ToolCall(id=c.id or f"call_{request.step_index}_{idx}", name=c.name, arguments=args))
        if bad:
            warnings.append(
                "the server did not constrain tool calls: arguments that are not a JSON object were dropped ("
                + "; ".join(bad)
                + ")"
            )
            if not out:
                raise BridgeError(
                    "generation_failed",
                    "the server's tool call arguments are not a JSON object (it did not constrain them): "
                    + "; ".join(bad),
                )
        return out

    @staticmethod
    def _check_answer(schema: dict[str, Any], text: str, warnings: list[str]) -> None:
        """A warning when the answer is not JSON valid against the schema: the server did not
        constrain it (the agent fails the step for it)."""
        try:
            value = json.loads(text)
            ok = bool(jsonschema.validators.validator_for(schema)(schema).is_valid(value))
        except Exception:  # noqa: BLE001 - not JSON, or a schema jsonschema cannot apply
            ok = False
        if not ok:
            warnings.append("the server did not constrain the answer to the schema")
