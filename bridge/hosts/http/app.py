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
no I/O, in ``_plan`` (``plan_chat``, ``completion``, ``chunk``, ``error_body``); here, the
ASGI app (``create_app``) drives one request's NPC and turn, and ``main`` runs hypercorn. A
client that disconnects cancels its turn: Starlette cancels a streamed body when the client
leaves, and a non-streamed request watches ``http.disconnect`` itself.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator
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

from bridge._version import __version__
from bridge.core import _messages as m
from bridge.core._service import Service
from bridge.engines import EngineRegistry
from bridge.errors import BridgeError
from bridge.hosts._common import add_engine_arguments, build_registry
from bridge.hosts.http._plan import (
    ChatPlan,
    bridge_error_body,
    calls_json,
    chunk,
    completion,
    error_body,
    finish_reason,
    handed_calls,
    model_json,
    plan_chat,
    refuse,
    sse,
    usage_json,
)

log = logging.getLogger("oam_bridge.http")

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8090
DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024  # like the bridge's longest line
DEFAULT_MAX_REQUESTS = 256  # chat completions at once; past it: overloaded (503)


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
        raise refuse(f"the request body is not valid JSON: {e}") from None


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
            script=p.script,
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
                yield sse(chunk(p, cid, created, {"tool_calls": calls_json(calls, with_index=True)}))
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
            raise BridgeError(
                "overloaded",
                f"{state.max_requests} chat completions are running; retry later",
                limit=state.max_requests,
            )
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
    listed = [model_json(i.name) for i in infos if i.available and i.reason is None]
    return JSONResponse({"object": "list", "data": [*listed, model_json("auto")]})


async def _model(request: Request) -> Response:
    state: _State = request.app.state.oam
    name = request.path_params["model"]
    infos = {i.name: i for i in await trio.to_thread.run_sync(state.registry.infos)}
    if name != "auto" and not (name in infos and infos[name].available and infos[name].reason is None):
        return JSONResponse(error_body("invalid_params", f"no model {name!r}", "model"), status_code=404)
    return JSONResponse(model_json(name))


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


ENGINES = frozenset({"scripted", "llama", "native", "openai"})


def create_app(
    svc: Service,
    registry: EngineRegistry,
    *,
    default_engine: str | None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    max_requests: int = DEFAULT_MAX_REQUESTS,
) -> Starlette:
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
    ap = argparse.ArgumentParser(
        prog="oam serve",
        description="An OpenAI-compatible server for NPC turns: POST /v1/chat/completions, GET /v1/models.",
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
    ap.add_argument(
        "--max-requests",
        type=int,
        default=DEFAULT_MAX_REQUESTS,
        help=f"chat completions at once; past it: 503 overloaded (default {DEFAULT_MAX_REQUESTS})",
    )
    ap.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY_BYTES,
        help="largest request body; past it: 413 message_too_large (default 4 MiB)",
    )
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
        log.warning('model "auto" has no engine: %s', e.message)
        default = None
    async with Service.running(registry) as svc, trio.open_nursery() as nursery:
        await nursery.start(on_signals)
        app = create_app(
            svc, registry, default_engine=default, max_body_bytes=args.max_body_bytes, max_requests=args.max_requests
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
    logging.basicConfig(
        stream=sys.stderr, level=args.log_level.upper(), format="oam serve %(levelname)s %(name)s: %(message)s"
    )
    try:
        trio.run(serve, args)
    except OSError as e:  # the port is taken, the address is not ours
        print(f"oam serve: cannot listen on {args.host}:{args.port}: {e.strerror or e}", file=sys.stderr)
        return 1
    return 0


__all__ = ["create_app", "main", "serve"]

if __name__ == "__main__":
    raise SystemExit(main())
