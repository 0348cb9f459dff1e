"""``oam serve``: the OpenAI-compatible server (``POST /v1/chat/completions``, ``GET
/v1/models``, ``GET /health``) over the service layer, on hypercorn's trio worker with
Starlette (which runs on trio through anyio). docs/http.md is the contract; this docstring
says how it is built.

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
model tries again, so the client only ever sees calls it can run. The one thing kept
between requests is where the server's own script (``--script``) stands in each
conversation (``ScriptPositions``).

Layout: the mapping between OpenAI's JSON and the service's types is plain functions with
no I/O, in ``_plan`` (``parse_chat``, ``completion``, ``chunk``, ``error_body``,
``StopScan``, ``turn_failure``); here, ``_Guard`` (the ASGI middleware that checks the Host
and Origin headers and the API key before any route), the app (``create_app``), which
drives one request's NPC and turn, and ``main``, which runs hypercorn. A request takes one
of ``--max-requests`` places from its first byte of body on, so slow bodies count, and its
body must arrive by ``--body-timeout``; a large body is read off the event loop. A client
that disconnects cancels its turn: the streamed body watches ``http.disconnect`` beside
the stream, and a non-streamed request watches it itself.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import ipaddress
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio
from starlette.applications import Starlette
from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bridge._version import __version__
from bridge.core import _messages as m
from bridge.core._service import Service
from bridge.engines import EngineRegistry
from bridge.errors import BridgeError
from bridge.hosts._common import add_engine_arguments, build_registry, lower_priority
from bridge.hosts._log import configure as configure_log
from bridge.hosts.http._plan import (
    ChatPlan,
    Refusal,
    ScriptPositions,
    StopScan,
    bridge_error_body,
    calls_json,
    chunk,
    completion,
    completion_body,
    error_body,
    finish_reason,
    handed_calls,
    model_json,
    parse_chat,
    refusal_body,
    sse,
    turn_failure,
    usage_json,
)

log = logging.getLogger("oam_bridge.http")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8090
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # like the bridge's longest line
DEFAULT_MAX_REQUESTS = 256  # chat completions at once; past it: overloaded (503)
DEFAULT_BODY_TIMEOUT = 30.0  # seconds from a request's headers to the end of its body
HEADER_TIMEOUT = 5.0  # seconds for a connection's request line and headers (hypercorn's keep-alive)
INLINE_PARSE_BYTES = 64 * 1024  # a larger body is decoded and mapped in a worker thread
LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})
ENGINES = frozenset({"scripted", "llama", "native", "openai"})


# ---- who may ask ----


def host_name(value: str) -> str:
    """A Host header's (or an ``--allow-host``'s) name, without its port, lower case."""
    v = value.strip().lower()
    if v.startswith("["):
        end = v.find("]")
        return v[1:end] if end > 0 else v
    if v.count(":") == 1:
        v = v.split(":", 1)[0]
    return v.rstrip(".")


def is_loopback(host: str) -> bool:
    name = host_name(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Access:
    """Who may ask: ``api_key`` (None: no key needed), the Host header's allowed names (None:
    any) and the Origin headers allowed (``*``: any; a request without one is always let in)."""

    api_key: str | None = None
    hosts: frozenset[str] | None = LOOPBACK_NAMES
    origins: frozenset[str] = frozenset()

    @classmethod
    def for_bind(cls, bind_host: str, api_key: str | None, allow_hosts: list[str], allow_origins: list[str]) -> Access:
        """The Host check is on for a loopback bind (the loopback names, the bound address and
        ``allow_hosts``), and for any bind given ``allow_hosts``; ``*`` turns it off."""
        hosts: frozenset[str] | None = None
        if "*" not in allow_hosts and (is_loopback(bind_host) or allow_hosts):
            named = {host_name(h) for h in allow_hosts}
            if bind_host not in ("0.0.0.0", "::", ""):
                named.add(host_name(bind_host))
            hosts = LOOPBACK_NAMES | named
        return cls(api_key, hosts, frozenset(o.strip().rstrip("/").lower() for o in allow_origins))

    def host_ok(self, host: str | None) -> bool:
        # a request without a Host (HTTP/1.0) comes from no browser
        return self.hosts is None or not host or host_name(host) in self.hosts

    def origin_ok(self, origin: str) -> bool:
        return "*" in self.origins or origin.strip().rstrip("/").lower() in self.origins

    def key_ok(self, authorization: str | None) -> bool:
        if self.api_key is None:
            return True
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer":
            return False
        # digests of equal length: the comparison takes the same time whatever the token
        given = hashlib.sha256(token.strip().encode("utf-8", "surrogateescape")).digest()
        return hmac.compare_digest(given, hashlib.sha256(self.api_key.encode()).digest())


def _quiet(send: Send) -> Send:
    """``send``, which does nothing once the client has gone: hypercorn can raise
    ``BusyResourceError`` for a send racing with the connection's close, which would reach
    the log as an internal error with two tracebacks."""
    gone = False

    async def quiet_send(message: Message) -> None:
        nonlocal gone
        if gone:
            return
        try:
            await send(message)
        except (trio.BusyResourceError, trio.BrokenResourceError, trio.ClosedResourceError) as e:
            gone = True
            log.info("client disconnected during the response (%s)", type(e).__name__)

    return quiet_send


async def _send_refusal(r: Refusal, scope: Scope, receive: Receive, send: Send) -> None:
    await JSONResponse(refusal_body(r), status_code=r.status, headers=r.headers)(scope, receive, send)


class _Guard:
    """Checks every request before its route: the Host header (a DNS-rebinding page names its
    own host), the Origin header (a page's requests carry one; clients that are not browsers
    send none), then the API key (``GET /health`` needs none). An allowed origin gets CORS
    headers, and its preflight (``OPTIONS``) its answer here."""

    def __init__(self, app: ASGIApp, access: Access) -> None:
        self.app = app
        self.access = access

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        a = self.access
        if not a.host_ok(headers.get("host")):
            log.info("refused a request for host %r (not in the allowed hosts)", headers.get("host"))
            r = Refusal("host_not_allowed", "this server does not answer for that Host (see --allow-host)")
            await _send_refusal(r, scope, receive, send)
            return
        origin = headers.get("origin")
        if origin is not None and not a.origin_ok(origin):
            log.info("refused a request from origin %r (not in the allowed origins)", origin)
            r = Refusal("origin_not_allowed", "requests from web pages are refused unless --allow-origin names them")
            await _send_refusal(r, scope, receive, send)
            return
        if origin is not None and scope["method"] == "OPTIONS" and "access-control-request-method" in headers:
            await Response(status_code=204, headers=self._preflight(origin, headers))(scope, receive, send)
            return
        if scope["path"] != "/health" and not a.key_ok(headers.get("authorization")):
            given = "authorization" in headers
            r = Refusal(
                "invalid_api_key",
                "invalid API key" if given else "this server needs an API key: send Authorization: Bearer KEY",
                headers={"WWW-Authenticate": "Bearer"},
            )
            await _send_refusal(r, scope, receive, send)
            return
        if origin is not None:
            send = self._with_cors(send, origin)
        await self.app(scope, receive, _quiet(send))

    @staticmethod
    def _preflight(origin: str, headers: Headers) -> dict[str, str]:
        return {
            "Access-Control-Allow-Origin": origin,
            "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
            "Access-Control-Allow-Headers": headers.get(
                "access-control-request-headers", "authorization, content-type"
            ),
            "Access-Control-Max-Age": "600",
            "Vary": "Origin",
        }

    @staticmethod
    def _with_cors(send: Send, origin: str) -> Send:
        async def cors_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [(b"access-control-allow-origin", origin.encode("latin-1")), (b"vary", b"Origin")]
                message = {**message, "headers": [*message.get("headers", []), *extra]}
            await send(message)

        return cors_send


# ---- the ASGI app ----


def _error_response(e: BridgeError | Refusal) -> JSONResponse:
    if isinstance(e, Refusal):
        return JSONResponse(refusal_body(e), status_code=e.status, headers=e.headers)
    headers = {"Retry-After": "1"} if e.retryable else None
    return JSONResponse(bridge_error_body(e), status_code=e.http_status, headers=headers)


@dataclass
class _Models:
    """What a request's ``model`` may name: an engine, ``auto`` (``default``, None when no
    engine is available) or the name of a model an engine serves (``served``: name -> engine)."""

    default: str | None
    served: dict[str, str] = field(default_factory=dict)

    def engine_of(self, model: str) -> str | None:
        if model in ENGINES:
            return model
        if model == "auto":
            return self.default
        return self.served.get(model)


@dataclass
class _State:
    svc: Service
    registry: EngineRegistry
    max_body_bytes: int
    max_requests: int
    models: _Models
    body_timeout: float = DEFAULT_BODY_TIMEOUT
    scripts: ScriptPositions | None = None  # the server's script (--script), by conversation
    active: int = 0  # chat completions from their body's first byte to their response's end
    parse_limiter: trio.CapacityLimiter = field(default_factory=lambda: trio.CapacityLimiter(2))


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise BridgeError("message_too_large", f"the request body is over {limit} bytes", limit=limit)
    data = bytearray()
    async for piece in request.stream():
        data += piece
        if len(data) > limit:
            raise BridgeError("message_too_large", f"the request body is over {limit} bytes", limit=limit)
    return bytes(data)


def _is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


async def _until_disconnect(receive: Receive, scope: trio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    log.info("client disconnected: cancelling its turn")
    scope.cancel()


class _Counted:
    """A script step that counts itself taken (the scripted engine calls a callable step)."""

    def __init__(self, step: dict[str, Any], taken: list[int]) -> None:
        self.step, self.taken = step, taken

    def __call__(self, _: Any) -> dict[str, Any]:
        self.taken[0] += 1
        return self.step


class _Request:
    """One chat completion: its temporary NPC, its turn and the turn's events. ``close`` (sync,
    idempotent) deletes the NPC, which cancels a turn still running, frees the turn's
    events if they were not all read, and says where the server's script stands."""

    def __init__(self, state: _State, plan: ChatPlan) -> None:
        self.state = state
        self.plan = plan
        self.npc_id = f"http_{uuid.uuid4().hex[:16]}"
        self.turn_id: str | None = None
        self.ended = False  # the terminal event was read
        self.closed = False
        self.created = int(time.time())
        self.completion_id = ""
        self.script_start: int | None = None  # where the server's script started, if it plays
        self.script_taken = [0]
        self.step_text = ""  # the current step's text, as the engine said it
        self.scan = StopScan(plan.stop) if plan.stop else None

    def _script(self, engine: str) -> list[Any] | None:
        p, scripts = self.plan, self.state.scripts
        if p.script is not None or engine != "scripted" or scripts is None:
            return p.script
        self.script_start = scripts.start(p.prefix_key)
        return [_Counted(step, self.script_taken) for step in scripts.steps[self.script_start :]]

    async def start(self) -> None:
        p, svc = self.plan, self.state.svc
        engine = self.state.models.default if p.engine == "auto" else p.engine
        if engine is None:
            raise BridgeError(
                "model_unavailable", 'no engine is available for "auto": see the server\'s start-up log', param="model"
            )
        if engine not in ENGINES:
            raise BridgeError(
                "invalid_params", f'unknown model {p.model!r}: GET /v1/models lists them (or use "auto")', param="model"
            )
        config = m.NpcConfig(
            npc_id=self.npc_id,
            instructions=p.instructions,
            tools=p.tools,
            engine=engine,
            options=p.options,
            script=self._script(engine),
        )
        await svc.restore(m.RestoreParams(save=m.Save(version=1, config=config, turns=p.history)))
        turn = svc.respond(
            m.RespondParams(
                npc_id=self.npc_id,
                prompt=p.prompt,
                speaker=p.speaker,
                tool_choice=p.tool_choice,
                max_tool_calls=p.max_tool_calls,
                schema=p.schema,
                full_text=False,
            ),
            resume=p.resume,
            return_calls=True,
        )
        self.turn_id = turn.turn_id
        self.completion_id = "chatcmpl-" + turn.turn_id.removeprefix("turn_")

    def events(self) -> AsyncIterator[m.Event]:
        assert self.turn_id is not None
        return self.state.svc.events(self.turn_id)

    def text(self, ev: m.TextDelta) -> str:
        """A text delta as it may be shown (cut at a stop sequence)."""
        if ev.is_reset:
            self.step_text = ""
        self.step_text += ev.delta
        return self.scan.feed(ev.delta, ev.is_reset) if self.scan is not None else ev.delta

    def failure(self, ev: m.TurnFailed) -> BridgeError | Refusal:
        return turn_failure(self.plan, ev.error, self.step_text)

    async def usage_at_stop(self, text: str) -> dict[str, int]:
        """Usage for a turn a stop sequence ended (it has no usage of its own): the prompt and
        the text answered, counted by the engine."""
        svc = self.state.svc
        try:
            asked = await svc.count_tokens(m.CountTokensParams(text=self.plan.prompt, npc_id=self.npc_id))
            said = await svc.count_tokens(m.CountTokensParams(text=text, npc_id=self.npc_id))
        except BridgeError:
            return {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}
        prompt = (asked.prompt_tokens or 0) + asked.tokens
        return {"prompt_tokens": prompt, "completion_tokens": said.tokens, "total_tokens": prompt + said.tokens}

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        svc = self.state.svc
        if self.npc_id in svc.npcs:
            svc.delete(m.NpcRef(npc_id=self.npc_id))
        if self.turn_id is not None and not self.ended:
            svc.drop_events(self.turn_id)
        if self.script_start is not None and self.state.scripts is not None:
            self.state.scripts.record(self.plan.key, self.script_start + self.script_taken[0])


def _is_content(ev: m.Event) -> bool:
    return isinstance(ev, (m.TextDelta, m.PartialJson, m.TurnCompleted, m.TurnFailed))


class _TurnStream(StreamingResponse):
    """The SSE body of a streamed turn; ``on_close`` runs when the response ends, however it
    ends (done, client gone, cancelled)."""

    def __init__(self, body: AsyncIterator[bytes], on_close: Callable[[], None]) -> None:
        super().__init__(body, media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._on_close()

    async def stream_response(self, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        async for piece in self.body_iterator:
            await send({"type": "http.response.body", "body": piece, "more_body": True})
        # Shielded: sending the end is what closes an HTTP/1.0 or "Connection: close"
        # connection, and the disconnect it causes would otherwise cancel it half-way.
        with trio.CancelScope(shield=True):
            await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _stream_body(req: _Request, first: m.Event, events: AsyncIterator[m.Event]) -> AsyncIterator[bytes]:
    p, cid, created = req.plan, req.completion_id, req.created
    yield sse(chunk(p, cid, created, {"role": "assistant", "content": ""}))
    ev: m.Event | None = first
    while ev is not None:
        if isinstance(ev, m.TextDelta):
            shown = req.text(ev)
            if shown:
                yield sse(chunk(p, cid, created, {"content": shown}))
            if req.scan is not None and req.scan.hit:
                yield sse(chunk(p, cid, created, {}, "stop"))
                if p.include_usage:
                    yield sse(chunk(p, cid, created, None, usage=await req.usage_at_stop(req.scan.step_text)))
                yield sse("[DONE]")
                return
        elif isinstance(ev, m.PartialJson):
            if ev.delta:
                yield sse(chunk(p, cid, created, {"content": ev.delta}))
        elif isinstance(ev, m.TurnCompleted):
            req.ended = True
            held = req.scan.flush() if req.scan is not None else ""
            if held:
                yield sse(chunk(p, cid, created, {"content": held}))
            calls = handed_calls(ev)
            if calls:
                yield sse(chunk(p, cid, created, {"tool_calls": calls_json(calls, with_index=True)}))
            yield sse(chunk(p, cid, created, {}, finish_reason(ev)))
            if p.include_usage:
                yield sse(chunk(p, cid, created, None, usage=usage_json(ev)))
            yield sse("[DONE]")
            return
        elif isinstance(ev, m.TurnFailed):
            req.ended = True
            # Past the status line: the error goes in the stream (the openai client raises it).
            failed = req.failure(ev)
            if isinstance(failed, Refusal):
                yield sse(refusal_body(failed))
            else:
                yield sse(bridge_error_body(failed))
            return
        ev = await anext(events, None)
    raise AssertionError("a turn's events end with its terminal event")


async def _plan(state: _State, data: bytes) -> ChatPlan:
    """The request's plan: decoded and mapped on the event loop for a small body, in a worker
    thread for a large one (a 4 MiB history takes a good part of a second), with no more
    history turns than a running engine's window could show (restoring 60,000 turns held
    the loop 0.15 s)."""
    registry = state.registry
    sizes = {name: registry.get(name).context_size for name in ENGINES if registry.started(name)}
    parse = partial(parse_chat, data, state.models.engine_of, state.scripts is not None, sizes)
    if len(data) <= INLINE_PARSE_BYTES:
        return parse()
    return await trio.to_thread.run_sync(parse, limiter=state.parse_limiter)


async def _chat_completions(request: Request) -> Response:
    state: _State = request.app.state.oam
    if state.active >= state.max_requests:
        return _error_response(
            BridgeError(
                "overloaded",
                f"{state.max_requests} chat completions are running; retry later",
                limit=state.max_requests,
            )
        )
    state.active += 1
    handed_over = False

    def release() -> None:
        state.active -= 1

    try:
        response = await _chat(request, state, release)
        handed_over = isinstance(response, _TurnStream)
        return response
    finally:
        if not handed_over:
            release()


async def _chat(request: Request, state: _State, release: Callable[[], None]) -> Response:
    if not _is_json(request.headers.get("content-type")):
        return _error_response(
            Refusal(
                "unsupported_media_type",
                "the request body must be JSON with Content-Type: application/json",
                headers={"Connection": "close"},
            )
        )
    try:
        with trio.fail_after(state.body_timeout):
            data = await _read_body(request, state.max_body_bytes)
        plan = await _plan(state, data)
    except trio.TooSlowError:
        log.warning("a request body did not arrive within %g s: 408", state.body_timeout)
        return _error_response(
            Refusal(
                "request_timeout",
                f"the request body did not arrive within {state.body_timeout:g} s",
                headers={"Connection": "close"},
            )
        )
    except ClientDisconnect:
        log.info("client disconnected before the end of its request body")
        return Response(status_code=499)  # nobody reads this
    except BridgeError as e:
        return _error_response(e)
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
                    if plan.stream:
                        if _is_content(ev):
                            first = ev
                            break
                        continue
                    if isinstance(ev, m.TextDelta):
                        req.text(ev)
                        if req.scan is not None and req.scan.hit:
                            first = ev
                            break
                    elif isinstance(ev, (m.TurnCompleted, m.TurnFailed)):
                        first = ev
                        break
            except BridgeError as e:
                refused = e
            nursery.cancel_scope.cancel()
        if refused is not None:
            return _error_response(refused)
        if first is None:
            return Response(status_code=499)  # the client has gone: nobody reads this
        if plan.stream and not isinstance(first, m.TurnFailed):
            streaming = True

            def on_close() -> None:
                req.close()
                release()

            return _TurnStream(_stream_body(req, first, events), on_close)
        if isinstance(first, m.TurnFailed):
            req.ended = True
            return _error_response(req.failure(first))
        if isinstance(first, m.TextDelta):  # a stop sequence ended the answer
            assert req.scan is not None
            text = req.scan.step_text
            usage = await req.usage_at_stop(text)
            return JSONResponse(completion_body(plan, req.completion_id, req.created, text, [], "stop", usage))
        assert isinstance(first, m.TurnCompleted)
        req.ended = True
        return JSONResponse(completion(plan, first, req.completion_id, req.created))
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
    listed = [model_json(i.name) for i in infos if i.available and i.reason is None]
    names = {i.name for i in infos if i.available and i.reason is None}
    served = [model_json(name, engine) for name, engine in state.models.served.items() if engine in names]
    return JSONResponse({"object": "list", "data": [*listed, *served, model_json("auto")]})


async def _model(request: Request) -> Response:
    state: _State = request.app.state.oam
    name = request.path_params["model"]
    infos = {i.name: i for i in await trio.to_thread.run_sync(state.registry.infos)}
    engine = state.models.served.get(name) if name not in ENGINES else name
    if name == "auto":
        return JSONResponse(model_json(name))
    if engine is None or not (engine in infos and infos[engine].available and infos[engine].reason is None):
        return JSONResponse(error_body("invalid_params", f"no model {name!r}", "model"), status_code=404)
    return JSONResponse(model_json(name, None if name == engine else engine))


async def _health(request: Request) -> Response:
    return JSONResponse({"status": "ok"})


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    code = "method_not_found" if exc.status_code in (404, 405) else "invalid_request"
    return JSONResponse(
        error_body(code, f"{request.method} {request.url.path}: {exc.detail}"),
        status_code=exc.status_code,
        headers=exc.headers,
    )


async def _internal_error(request: Request, exc: Exception) -> Response:
    log.error("internal error on %s %s", request.method, request.url.path, exc_info=exc)
    return JSONResponse(error_body("internal_error", f"internal error: {type(exc).__name__}"), status_code=500)


def create_app(
    svc: Service,
    registry: EngineRegistry,
    *,
    default_engine: str | None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_requests: int = DEFAULT_MAX_REQUESTS,
    body_timeout: float = DEFAULT_BODY_TIMEOUT,
    access: Access | None = None,
    served_models: dict[str, str] | None = None,
    script: list[Any] | None = None,
) -> ASGIApp:
    """The ASGI app over a running ``svc``. It must run on trio (hypercorn's trio worker).
    ``access``: who may ask (default: loopback Host names, no web page, no key);
    ``served_models``: model names a request may give for an engine (name -> engine);
    ``script``: the server's scripted-engine steps, which each conversation plays in turn."""
    app = Starlette(
        routes=[
            Route("/v1/chat/completions", _chat_completions, methods=["POST"]),
            Route("/v1/models", _models, methods=["GET"]),
            Route("/v1/models/{model:path}", _model, methods=["GET"]),
            Route("/health", _health, methods=["GET"]),
        ],
        exception_handlers={HTTPException: _http_error, Exception: _internal_error},
    )
    app.state.oam = _State(
        svc,
        registry,
        max_body_bytes,
        max_requests,
        _Models(default_engine, dict(served_models or {})),
        body_timeout,
        ScriptPositions(script) if script else None,
    )
    return _Guard(app, access or Access())


# ---- the process ----


def parse_args(argv: list[str]) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="oam serve",
        description=(
            "An OpenAI-compatible server for NPC turns: POST /v1/chat/completions, GET /v1/models, GET /health."
        ),
    )
    add_engine_arguments(ap)
    ap.add_argument(
        "--host",
        default=os.environ.get("OAM_HOST", DEFAULT_HOST),
        help=f"address to listen on (env OAM_HOST; default {DEFAULT_HOST}, this machine only)",
    )
    ap.add_argument(
        "--port",
        type=int,
        default=int(os.environ.get("OAM_PORT", str(DEFAULT_PORT))),
        help=f"port (env OAM_PORT; default {DEFAULT_PORT}; 0: any free port, printed on stderr)",
    )
    key = ap.add_mutually_exclusive_group()
    key.add_argument(
        "--api-key",
        help=(
            "require Authorization: Bearer KEY on every request but GET /health (env OAM_API_KEY, which keeps "
            "it out of the process list)"
        ),
    )
    key.add_argument("--api-key-file", help="like --api-key, the key being the first line of FILE")
    ap.add_argument(
        "--allow-host",
        action="append",
        default=[],
        metavar="NAME",
        help=(
            "a Host header name to answer besides localhost, 127.0.0.1 and [::1] (any port; repeatable; '*': "
            "any). The check is on for a loopback address, and for any address given --allow-host"
        ),
    )
    ap.add_argument(
        "--allow-origin",
        action="append",
        default=[],
        metavar="ORIGIN",
        help=(
            "a web page origin (scheme://host[:port]) whose requests are answered, with CORS headers (repeatable; "
            "'*': any). Requests with another Origin header are refused (403)"
        ),
    )
    ap.add_argument(
        "--max-requests",
        type=int,
        default=DEFAULT_MAX_REQUESTS,
        help=(
            "chat completions at once, counted from their body's first byte; past it: 503 overloaded "
            f"(default {DEFAULT_MAX_REQUESTS})"
        ),
    )
    ap.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body; past it: 413 message_too_large (default 4 MiB)",
    )
    ap.add_argument(
        "--body-timeout",
        type=float,
        default=DEFAULT_BODY_TIMEOUT,
        metavar="SECONDS",
        help=f"a request body must arrive within this; past it: 408 request_timeout (default {DEFAULT_BODY_TIMEOUT:g})",
    )
    ap.add_argument("--log-level", default=os.environ.get("OAM_LOG", "warning"), help="stderr log level (env OAM_LOG)")
    ap.add_argument("--version", action="version", version=f"oam serve {__version__}")
    args = ap.parse_args(argv)
    if args.body_timeout <= 0:
        ap.error("--body-timeout must be more than 0")
    if args.max_requests < 1:
        ap.error("--max-requests must be 1 or more")
    if args.api_key_file is not None:
        try:
            with open(args.api_key_file, encoding="utf-8") as f:
                args.api_key = f.readline().strip()
        except OSError as e:
            ap.error(f"--api-key-file: {e.strerror or e}: {args.api_key_file}")
        if not args.api_key:
            ap.error(f"--api-key-file: the first line of {args.api_key_file} is empty")
    elif args.api_key is None:
        args.api_key = os.environ.get("OAM_API_KEY") or None
    elif not args.api_key.strip():
        ap.error("--api-key must not be empty")
    return args


def _hypercorn_config(host: str, port: int) -> Any:
    from hypercorn.config import Config  # noqa: PLC0415 - imported with the server only

    config = Config()
    config.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("oam_bridge.http.hypercorn")
    config.graceful_timeout = 2.0
    # a connection's request line and headers, and the wait between its requests
    config.keep_alive_timeout = HEADER_TIMEOUT
    return config


def _served_models(args: argparse.Namespace) -> dict[str, str]:
    """The names of the models the engines serve, which a request's ``model`` may give: the
    llama engine's model file (without ``.gguf``; a catalog name as given) and the openai
    engine's ``--openai-model``."""
    served: dict[str, str] = {}
    try:
        from bridge.engines.llama import default_model_path  # noqa: PLC0415 - the llama engine's own

        path = args.model or default_model_path()
    except Exception:  # noqa: BLE001 - no llama engine here: no name of its model
        path = args.model
    if path:
        served.setdefault(os.path.basename(path).removesuffix(".gguf"), "llama")
    if args.openai_url and args.openai_model:
        served.setdefault(args.openai_model, "openai")
    return {k: v for k, v in served.items() if k and k not in ENGINES and k != "auto"}


def _server_script(path: str | None) -> list[Any] | None:
    """The steps of ``--script`` that an NPC without a script of its own plays (its
    ``default``): every request's NPC is new, so its ``npcs`` do not apply."""
    if path is None:
        return None
    with open(path, encoding="utf-8") as f:
        data = json.load(f)  # build_registry checked it
    steps = data if isinstance(data, list) else data.get("default", [])
    return list(steps) or None


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
        log.warning('model "auto" has no engine: %s', e.message)
        default = None
    served = await trio.to_thread.run_sync(_served_models, args)
    access = Access.for_bind(args.host, args.api_key, args.allow_host, args.allow_origin)
    if access.api_key is None and not is_loopback(args.host):
        log.warning("listening beyond this machine with no --api-key: anyone who can reach the port can run turns")
    async with Service.running(registry) as svc, trio.open_nursery() as nursery:
        await nursery.start(on_signals)
        app = create_app(
            svc,
            registry,
            default_engine=default,
            max_body_bytes=args.max_body_bytes,
            max_requests=args.max_requests,
            body_timeout=args.body_timeout,
            access=access,
            served_models=served,
            script=_server_script(args.script),
        )
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
    lower_priority(args.priority)  # before any thread starts: they inherit it
    configure_log(args.log_level, "oam serve")
    try:
        trio.run(serve, args)
    except OSError as e:  # the port is taken, the address is not ours
        print(f"oam serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


__all__ = ["Access", "create_app", "main", "serve"]

if __name__ == "__main__":
    raise SystemExit(main())
