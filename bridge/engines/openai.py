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

import json
import logging
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import httpx
import jsonschema
import msgspec
import trio

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
CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD = 4  # tokens a chat template spends on a message's role and separators
ERROR_BODY_MAX = 300  # characters of a server's error body kept in a message


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


def _status_error(status: int, body: str, url: str) -> BridgeError:
    text = " ".join(body.split())[:ERROR_BODY_MAX]
    where = f"the server at {url}"
    if status == 429:
        return BridgeError("rate_limited", f"{where} is rate-limiting requests (HTTP 429): {text}", status=status)
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
    ) -> None:
        ok, reason = availability(url)
        self._available, self._reason = ok, reason
        self.url = base_url(url) if ok and url else ""
        self.model = model or None
        self._api_key = api_key or None
        self._timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
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
            headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
            # no connection limit of httpx's own: each NPC's step is one request, and the
            # bridge bounds the NPCs
            limits = httpx.Limits(max_connections=None, max_keepalive_connections=32)
            self._client = httpx.AsyncClient(timeout=self._timeout, headers=headers, limits=limits)
        return self._client

    async def _model(self) -> str | None:
        """The configured model, else the first one the server lists (``GET /models``, once);
        None when it lists none (the request then names no model)."""
        if not self._model_looked_up:
            try:
                resp = await self._http().get(f"{self.url}/models")
                if resp.status_code == 200:
                    data = resp.json().get("data") or []
                    if data and isinstance(data[0], dict) and isinstance(data[0].get("id"), str):
                        self.model = data[0]["id"]
                        log.info("openai engine: using the server's model %r", self.model)
                elif resp.status_code in (401, 403, 429, 503) or resp.status_code >= 500:
                    raise _status_error(resp.status_code, resp.text, self.url)
            except httpx.HTTPError as e:
                raise self._transport_error(e) from None
            except ValueError:
                pass  # a server whose /models is not JSON: name no model
            self._model_looked_up = True
        return self.model

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
        model = await self._model()
        client = self._http()
        text = ""
        calls: dict[int, _Call] = {}
        finish: str | None = None
        usage: Usage | None = None
        out_chunks = 0
        warnings: list[str] = []
        grammar: str | None = None
        # grammar mode: output held back while it may still be the start of a call batch
        sniff = CallSniffer(False)
        if self.grammar:
            grammar, grammar_warnings = await _step_grammar(request)
            warnings.extend(grammar_warnings)
            sniff = CallSniffer(bool(_grammar_tools(request)))
        for attempt in (0, 1):
            body = self.body(request, model, grammar)
            try:
                async with client.stream("POST", f"{self.url}/chat/completions", json=body) as resp:
                    if resp.status_code != 200:
                        err = (await resp.aread()).decode("utf-8", "replace")
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
                        raise _status_error(resp.status_code, err, self.url)
                    done = False
                    async for line in resp.aiter_lines():
                        if not line.startswith("data:"):
                            continue  # blank separators, ": ping" comments, event names
                        data = line[5:].strip()
                        if data == "[DONE]":
                            done = True
                            break
                        try:
                            obj = json.loads(data)
                        except ValueError:
                            raise BridgeError(
                                "generation_failed",
                                f"the server at {self.url} sent a malformed stream event: {data[:ERROR_BODY_MAX]}",
                            ) from None
                        if not isinstance(obj, dict):
                            raise BridgeError(
                                "generation_failed",
                                f"the server at {self.url} sent a malformed stream event: {data[:ERROR_BODY_MAX]}",
                            )
                        if obj.get("error") is not None:  # llama-server and vLLM report mid-stream errors so
                            err_obj = obj["error"]
                            msg = err_obj.get("message") if isinstance(err_obj, dict) else err_obj
                            code = err_obj.get("code") if isinstance(err_obj, dict) else None
                            raise _status_error(code if isinstance(code, int) else 500, str(msg), self.url)
                        if isinstance(obj.get("usage"), dict):
                            usage = self._usage(obj["usage"])
                        for choice in obj.get("choices") or []:
                            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                                continue
                            delta = choice.get("delta") or {}
                            content = delta.get("content")
                            if isinstance(content, str) and content:
                                text += content
                                out_chunks += 1
                                if shown := sniff.feed(content):
                                    yield TextChunk(shown)
                            for i, piece in enumerate(delta.get("tool_calls") or []):
                                self._add_call_piece(calls, piece, i)
                            if choice.get("finish_reason"):
                                finish = choice["finish_reason"]
                    if not done and finish is None:
                        raise BridgeError(
                            "generation_failed", f"the server at {self.url} ended the stream before the answer ended"
                        )
            except httpx.HTTPError as e:
                raise self._transport_error(e) from None
            break
        raw, rest = sniff.end(finish or "stop")  # grammar mode: a held call batch, or text
        if raw:
            calls = _grammar_calls(raw)
        elif rest:
            yield TextChunk(rest)
        if calls:
            batch = self._calls(request, calls, warnings)
            if batch:
                yield ToolCallsChunk(batch)
                finish = "tool_calls"
        elif finish in ("tool_calls", "function_call"):
            finish = "stop"  # a server that says it called, and sent no call
        if finish == "content_filter":
            raise BridgeError(
                "guardrail_violation", f"the server at {self.url} filtered the answer (finish_reason content_filter)"
            )
        if request.schema is not None and not calls and finish != "length":
            self._check_answer(request.schema, text, warnings)
        if usage is None:
            usage = Usage(
                input_tokens=self.count_tokens(request.instructions, request.messages, request.tools),
                output_tokens=out_chunks,
            )
        yield StepDone(
            usage=usage, finish_reason="length" if finish == "length" else (finish or "stop"), warnings=warnings
        )

    @staticmethod
    def _usage(u: dict[str, Any]) -> Usage:
        details = u.get("prompt_tokens_details") or {}
        cached = details.get("cached_tokens") if isinstance(details, dict) else 0
        return Usage(
            input_tokens=int(u.get("prompt_tokens") or 0),
            output_tokens=int(u.get("completion_tokens") or 0),
            cached_tokens=int(cached or 0),
        )

    @staticmethod
    def _add_call_piece(calls: dict[int, _Call], piece: Any, position: int) -> None:
        """One streamed piece of a call: the first names it (id, name), the rest add to its
        arguments. ``index`` says which call; a server that leaves it out sends calls whole."""
        if not isinstance(piece, dict):
            return
        idx = piece.get("index")
        if not isinstance(idx, int):
            idx = (
                len(calls)
                if piece.get("id") and piece.get("id") not in {c.id for c in calls.values()}
                else max(calls, default=position)
            )
        call = calls.setdefault(idx, _Call())
        if isinstance(piece.get("id"), str) and piece["id"]:
            call.id = piece["id"]
        fn = piece.get("function") or {}
        if isinstance(fn, dict):
            if isinstance(fn.get("name"), str) and fn["name"]:
                call.name = fn["name"]
            args = fn.get("arguments")
            if isinstance(args, str):
                call.arguments += args
            elif isinstance(args, dict):  # Ollama sends arguments as an object
                call.arguments += json.dumps(args)

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
            except ValueError:
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
