"""The JSON-RPC connection: framing, envelope checks, dispatch, and the bounded queues
between reading, processing and writing.

``Server.handle_line`` is the whole protocol without I/O: one line in, at most one line
out, synchronously. Every method is quick and never blocks (a turn is only *enqueued*), so
requests are handled strictly in arrival order, which lets a game pipeline
``npc/create`` and ``npc/respond`` without waiting. Turns run in their own tasks.

Connection state machine::

    uninitialized -> ready -> shutting_down -> closed
"""

from __future__ import annotations

import logging
import os
from typing import Any, Final

import msgspec
import trio

from . import __version__
from . import _messages as m
from ._agent import Npc, check_schema
from ._framing import DEFAULT_MAX_LINE_BYTES, LineFramer, LineTooLong
from .engines import EngineRegistry
from .engines.base import Message
from .engines.scripted import ScriptedEngine
from .errors import BridgeError

log = logging.getLogger("oam_bridge.server")

CONNECTION_TRANSITIONS: Final = {
    "uninitialized": frozenset({"ready", "closed"}),
    "ready": frozenset({"shutting_down", "closed"}),
    "shutting_down": frozenset({"closed"}),
    "closed": frozenset(),
}


class Limits(msgspec.Struct, frozen=True, rename="camel"):
    """Every bound the bridge enforces; advertised by ``initialize``."""

    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    max_pending_lines: int = 1024  # read but not yet processed; past it: overloaded
    max_outbound_lines: int = 4096  # processed but not yet written; past it: backpressure
    max_npcs: int = 10_000
    max_queued_turns_per_npc: int = 32
    max_nesting_depth: int = 100  # deeper JSON is refused (invalid_message)


_encoder = msgspec.json.Encoder()


def _error(id_: Any, err: BridgeError) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id_, "error": err.to_wire()}


def _whole_floats_as_ints(obj: Any) -> Any:
    if isinstance(obj, float) and obj.is_integer():
        return int(obj)
    if isinstance(obj, dict):
        return {k: _whole_floats_as_ints(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_whole_floats_as_ints(v) for v in obj]
    return obj


def _nesting_ok(obj: Any, limit: int) -> bool:
    stack = [(obj, 1)]
    while stack:
        o, d = stack.pop()
        if d > limit:
            return False
        if isinstance(o, dict):
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list):
            stack.extend((v, d + 1) for v in o)
    return True


class Server:
    def __init__(self, registry: EngineRegistry | None = None, limits: Limits | None = None) -> None:
        self.registry = registry or EngineRegistry(default="scripted", scripted=ScriptedEngine())
        self.limits = limits or Limits()
        self.state = "uninitialized"
        self.npcs: dict[str, Npc] = {}
        self.client_info: m.ClientInfo | None = None
        self._nursery: trio.Nursery | None = None
        self._out_send, self._out_recv = trio.open_memory_channel[bytes](self.limits.max_outbound_lines)
        self._stop = trio.Event()
        self._processed = trio.Event()  # every line read has been handled
        self._drained = trio.Event()  # the writer has written everything it will write
        self._idle = True  # no line is being processed (so the reader may handle one inline)
        self._writer_idle = True  # the writer holds no line it has not written
        self._direct_fd: int | None = None

    # ---- state ----

    def _move(self, new: str) -> None:
        if new not in CONNECTION_TRANSITIONS[self.state]:
            raise BridgeError("invalid_request", f"connection is {self.state}; cannot become {new}")
        self.state = new

    def stop(self) -> None:
        """End serving: stdin EOF, ``exit``, or a signal."""
        if self.state != "closed":
            self.state = "closed"
        self._stop.set()

    # ---- the protocol, without I/O ----

    def handle_line(self, line: bytes) -> bytes | None:
        """One message or batch in, the encoded response line (or ``None``) out."""
        try:
            msg = msgspec.json.decode(line)
        except RecursionError:
            return self._encode(_error(None, BridgeError("invalid_message", "message nested too deeply", reason="too_deep")))
        except msgspec.DecodeError as e:
            return self._encode(_error(None, BridgeError("parse_error", f"not valid JSON: {e}", reason="parse_error")))
        # a line shorter than the depth limit cannot nest that deep: skip the walk
        if len(line) > self.limits.max_nesting_depth and not _nesting_ok(msg, self.limits.max_nesting_depth):
            return self._encode(_error(None, BridgeError("invalid_message", f"message nested deeper than {self.limits.max_nesting_depth}", reason="too_deep")))
        if isinstance(msg, list):
            if not msg:
                return self._encode(_error(None, BridgeError("invalid_message", "empty batch", reason="empty_batch")))
            out = [r for r in map(self._handle_one, msg) if r is not None]
            return self._encode(out) if out else None
        r = self._handle_one(msg)
        return None if r is None else self._encode(r)

    def _encode(self, obj: Any) -> bytes:
        return _encoder.encode(obj) + b"\n"

    def _handle_one(self, obj: Any) -> dict[str, Any] | None:
        if not isinstance(obj, dict):
            return _error(None, BridgeError("invalid_message", "a message must be a JSON object", reason="not_object"))
        has_id = "id" in obj
        id_ = obj.get("id")
        if has_id and not (id_ is None or (isinstance(id_, (str, int)) and not isinstance(id_, bool)) or (isinstance(id_, float) and id_.is_integer())):
            return _error(None, BridgeError("invalid_message", "id must be a string, an integer or null", reason="bad_id"))
        if obj.get("jsonrpc") != "2.0":
            return _error(id_, BridgeError("invalid_message", 'jsonrpc must be "2.0"', reason="bad_version"))
        method = obj.get("method")
        if not isinstance(method, str):
            return _error(id_, BridgeError("invalid_message", "method must be a string", reason="bad_method"))
        params = obj.get("params", {})
        try:
            if isinstance(params, list):
                raise BridgeError("invalid_params", "params must be an object (named parameters)", reason="positional_params")
            if not isinstance(params, dict):
                return _error(id_, BridgeError("invalid_message", "params must be an object", reason="bad_params"))
            result = self._call(method, params)
        except BridgeError as e:
            return _error(id_, e) if has_id else None
        except Exception as e:  # our bug: logged with its traceback, answered as internal
            log.exception("internal error in %s", method)
            err = BridgeError("internal_error", f"internal error: {type(e).__name__}")
            return _error(id_, err) if has_id else None
        if not has_id:
            return None
        return {"jsonrpc": "2.0", "id": id_, "result": result}

    def _call(self, method: str, params: dict[str, Any]) -> Any:
        typ = m.PARAMS.get(method)
        if typ is None:
            raise BridgeError("method_not_found", f"unknown method {method!r}", method=method)
        if self.state == "uninitialized" and method not in ("initialize", "exit"):
            raise BridgeError("not_initialized", "send initialize first")
        if self.state == "shutting_down" and method != "exit":
            raise BridgeError("shutting_down", "the bridge is shutting down; send exit")
        try:
            p = msgspec.convert(params, typ)
        except msgspec.ValidationError as e:
            # Clients whose JSON has only doubles (Godot, JavaScript) send 2.0 for 2: accept a
            # whole-number float where an integer goes, and nothing looser.
            try:
                p = msgspec.convert(_whole_floats_as_ints(params), typ)
            except msgspec.ValidationError:
                raise BridgeError("invalid_params", str(e), reason="validation") from None
        return getattr(self, "_m_" + method.replace("/", "_"))(p)

    def _npc(self, npc_id: str) -> Npc:
        npc = self.npcs.get(npc_id)
        if npc is None:
            raise BridgeError("unknown_npc", f"no npc {npc_id!r}", npcId=npc_id)
        return npc

    # ---- methods ----

    def _m_initialize(self, p: m.InitializeParams) -> dict[str, Any]:
        if self.state != "uninitialized":
            raise BridgeError("invalid_request", "already initialized")
        self._move("ready")
        self.client_info = p.client_info
        return {
            "protocolVersion": m.PROTOCOL_VERSION,
            "serverInfo": {"name": "oam-bridge", "version": __version__},
            "capabilities": {
                "tools": {"engineExecuted": True, "parallelCalls": True, "toolChoice": ["auto", "required", "none", "named"], "budgets": True, "timeouts": True},
                "streaming": {"textDelta": True, "partialJson": True},
                "structuredOutput": {"jsonSchema": True},
                "transcripts": {"save": True, "restore": True},
                "trimming": {"announced": True},
            },
            "engines": self.registry.infos(),
            "defaultEngine": self.registry.default,
            "limits": self.limits,
        }

    def _m_shutdown(self, p: m.EmptyParams) -> None:
        self._move("shutting_down")
        for npc in self.npcs.values():
            npc.cancel("turn_ended")

    def _m_exit(self, p: m.EmptyParams) -> None:
        self.stop()

    def _m_npc_create(self, config: m.NpcConfig, turns: list[list[Message]] | None = None) -> dict[str, Any]:
        if not config.npc_id:
            raise BridgeError("invalid_params", "npcId must not be empty")
        if config.npc_id in self.npcs:
            raise BridgeError("npc_exists", f"npc {config.npc_id!r} already exists", npcId=config.npc_id)
        if len(self.npcs) >= self.limits.max_npcs:
            raise BridgeError("overloaded", f"at most {self.limits.max_npcs} npcs", limit="maxNpcs")
        names = [t.name for t in config.tools]
        if len(set(names)) != len(names):
            raise BridgeError("invalid_params", "tool names must be unique")
        for t in config.tools:
            check_schema(t.parameters, f"parameters of tool {t.name!r}")
        engine_name = self.registry.resolve(config.engine)
        if config.model is not None and engine_name != "llama":
            raise BridgeError("invalid_params", f"model is only for the llama engine, not {engine_name!r}")
        engine = self.registry.get(engine_name, model=config.model)
        engine.forget(config.npc_id)
        if config.script is not None:
            set_script = getattr(engine, "set_script", None)
            if set_script is None:
                raise BridgeError("invalid_params", f"script is only for scripted engines, not {engine_name!r}")
            set_script(config.npc_id, config.script)
        npc = Npc(config, engine, engine_name, self._notify, self.limits.max_queued_turns_per_npc)
        if turns:
            npc.turns = [list(t) for t in turns]
        self.npcs[config.npc_id] = npc
        assert self._nursery is not None, "serve() is not running"
        self._nursery.start_soon(npc.worker)
        return {"npcId": config.npc_id, "engine": engine_name, "contextSize": engine.context_size}

    def _m_npc_respond(self, p: m.RespondParams) -> dict[str, Any]:
        npc = self._npc(p.npc_id)
        if isinstance(p.tool_choice, m.NamedTool) and p.tool_choice.tool not in npc.tools:
            raise BridgeError("invalid_params", f"toolChoice names unknown tool {p.tool_choice.tool!r}")
        if p.tool_choice == "required" and not npc.tools:
            raise BridgeError("invalid_params", "toolChoice required, but the npc has no tools")
        if p.max_tool_rounds < 0 or p.max_tool_calls < 0 or p.tool_timeout_ms < 0:
            raise BridgeError("invalid_params", "budgets and timeouts must not be negative")
        if p.schema is not None:
            check_schema(p.schema, "schema")
        turn = npc.enqueue(p)
        return {"npcId": p.npc_id, "turnId": turn.id}

    def _m_npc_submit(self, p: m.SubmitParams) -> dict[str, Any]:
        self._npc(p.npc_id).submit(p)
        return {"accepted": True}

    def _m_npc_cancel(self, p: m.NpcRef) -> dict[str, Any]:
        return {"cancelled": self._npc(p.npc_id).cancel()}

    def _m_npc_transcript(self, p: m.NpcRef) -> m.Save:
        npc = self._npc(p.npc_id)
        return m.Save(version=1, config=npc.config, turns=npc.turns)

    def _m_npc_restore(self, p: m.RestoreParams) -> dict[str, Any]:
        if p.save.version != 1:
            raise BridgeError("invalid_params", f"unsupported save version {p.save.version}")
        config = p.save.config
        if p.npc_id is not None:
            config = msgspec.structs.replace(config, npc_id=p.npc_id)
        old = self.npcs.pop(config.npc_id, None)
        if old is not None:
            old.close()
        try:
            self._m_npc_create(config, p.save.turns)
        except BridgeError:
            if old is not None:  # keep the old npc's history rather than losing both
                self.npcs[config.npc_id] = old
            raise
        return {"npcId": config.npc_id, "turns": len(p.save.turns)}

    def _m_npc_reset(self, p: m.NpcRef) -> dict[str, Any]:
        npc = self._npc(p.npc_id)
        npc.cancel()
        npc.turns = []
        npc.engine.forget(p.npc_id)
        return {}

    def _m_npc_delete(self, p: m.NpcRef) -> dict[str, Any]:
        npc = self._npc(p.npc_id)
        npc.close("turn_ended")
        del self.npcs[p.npc_id]
        npc.engine.forget(p.npc_id)
        return {}

    def _m_npc_list(self, p: m.EmptyParams) -> dict[str, Any]:
        return {
            "npcs": [
                {"npcId": k, "engine": n.engine_name, "turns": len(n.turns), "busy": n.current is not None, "queued": len(n.queued)}
                for k, n in self.npcs.items()
            ]
        }

    def _m_tokens_count(self, p: m.CountTokensParams) -> dict[str, Any]:
        if p.npc_id is not None:
            npc = self._npc(p.npc_id)
            engine = npc.engine
            history = [msg for t in npc.turns for msg in t]
            prompt = engine.count_tokens(npc.instructions, history, list(npc.tools.values()))
        else:
            engine = self.registry.get(p.engine or "auto")
            prompt = None
        tokens = engine.count_tokens("", [Message(role="user", content=p.text)], []) - engine.count_tokens("", [], [])
        return {"tokens": tokens, "promptTokens": prompt, "contextSize": engine.context_size}

    def _m_engine_status(self, p: m.EmptyParams) -> dict[str, Any]:
        return {"engines": self.registry.infos(), "defaultEngine": self.registry.default}

    # ---- I/O ----

    async def _notify(self, method: str, params: m._Event) -> None:
        # Events always go through the writer: the events of one scheduler pass (many NPCs
        # streaming at once) then leave in one write, not one system call each.
        await self._emit_line(_encoder.encode({"jsonrpc": "2.0", "method": method, "params": params}) + b"\n", direct=False)

    async def _emit_line(self, line: bytes, direct: bool = True) -> None:
        """Queue one outbound line; waits only when the writer is ``max_outbound_lines``
        behind (a slow reader slows the turns down instead of growing memory)."""
        if direct and self._direct_fd is not None and self._writer_idle and not self._out_send.statistics().current_buffer_used:
            # Fast path: nothing is queued and the writer is parked, so writing here keeps
            # the order and saves a task switch. A short write queues the rest.
            try:
                n = os.write(self._direct_fd, line)
            except BlockingIOError:
                n = 0
            except OSError:
                n = 0  # the writer will meet the broken pipe and stop the server
            if n == len(line):
                return
            line = line[n:]
        try:
            self._out_send.send_nowait(line)
        except trio.WouldBlock:
            try:
                await self._out_send.send(line)
            except (trio.ClosedResourceError, trio.BrokenResourceError):
                log.debug("dropped a line after the output closed")
        except (trio.ClosedResourceError, trio.BrokenResourceError):
            log.debug("dropped a line after the output closed")

    async def serve(self, recv: trio.abc.ReceiveStream, send: trio.abc.SendStream, out_fd: int | None = None, preload: bool = False) -> None:
        """Serve until stdin EOF, ``exit`` or ``stop()``; every accepted turn gets its
        terminal event before this returns (bounded by a short grace period).

        ``out_fd``: the non-blocking fd behind ``send``, if it has one; lines are then
        written straight to it when nothing is queued. ``preload``: start the default model
        engine in a worker thread at once, instead of on the first ``npc/create``."""
        self._direct_fd = out_fd
        in_send, in_recv = trio.open_memory_channel[bytes | LineTooLong](self.limits.max_pending_lines)
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._writer, send)
                nursery.start_soon(self._processor, in_recv)
                nursery.start_soon(self._reader, recv, in_send)
                if preload:
                    nursery.start_soon(self.registry.start)
                await self._stop.wait()
                await self._wind_down()
                nursery.cancel_scope.cancel()
        finally:
            with trio.CancelScope(shield=True):
                await self.registry.aclose()

    async def _wind_down(self) -> None:
        for npc in self.npcs.values():
            npc.close("turn_ended")
        with trio.move_on_after(0.5):
            while any(n.current is not None or n.queued for n in self.npcs.values()):
                await trio.sleep(0.005)
            self._out_send.close()
            await self._drained.wait()

    async def _reader(self, recv: trio.abc.ReceiveStream, in_send: trio.MemorySendChannel[bytes | LineTooLong]) -> None:
        framer = LineFramer(self.limits.max_line_bytes)
        try:
            while True:
                try:
                    data = await recv.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                items = framer.feed(data) if data else framer.eof()
                for item in items:
                    if self._idle and in_send.statistics().current_buffer_used == 0 and self._out_has_room():
                        # Nothing is queued ahead of it: handle it here, saving a task hop.
                        await self._processor_item(item)
                        continue
                    try:
                        in_send.send_nowait(item)
                    except trio.WouldBlock:
                        await self._overloaded(item)
                if not data:
                    break
        finally:
            in_send.close()
        # stdin EOF means exit, once what was read has been processed.
        await self._processed.wait()
        self.stop()

    def _out_has_room(self) -> bool:
        return self._out_send.statistics().current_buffer_used < self.limits.max_outbound_lines

    async def _overloaded(self, item: bytes | LineTooLong) -> None:
        if isinstance(item, LineTooLong):
            return await self._processor_item(item)
        try:
            msg = msgspec.json.decode(item)
        except (msgspec.DecodeError, RecursionError):
            return await self._process(item)
        ids = [x.get("id") for x in (msg if isinstance(msg, list) else [msg]) if isinstance(x, dict) and "id" in x]
        err = BridgeError("overloaded", "too many pending requests; retry later", retryable_after_ms=10)
        out = [_error(i, err) for i in ids]
        if out:
            await self._emit_line(self._encode(out if isinstance(msg, list) else out[0]))

    async def _processor_item(self, item: bytes | LineTooLong) -> None:
        self._idle = False
        try:
            await self._process(item)
        finally:
            self._idle = True

    async def _process(self, item: bytes | LineTooLong) -> None:
        if isinstance(item, LineTooLong):
            err = BridgeError("message_too_large", f"line of {item.size} bytes exceeds {self.limits.max_line_bytes}", size=item.size, limit=self.limits.max_line_bytes)
            out: bytes | None = self._encode(_error(None, err))
        else:
            await self._start_engines_for(item)
            out = self.handle_line(item)
        if out is not None:
            await self._emit_line(out)

    async def _start_engines_for(self, line: bytes) -> None:
        """Before a line that creates or restores an NPC on an engine (or model file) not
        started yet, start it off the loop (``EngineRegistry.start``): the other NPCs' turns
        stream meanwhile, and requests after this line wait, so they stay in order."""
        if b'"npc/create"' not in line and b'"npc/restore"' not in line:
            return
        try:
            msg = msgspec.json.decode(line)
        except (msgspec.DecodeError, RecursionError):
            return
        for one in msg if isinstance(msg, list) else [msg]:
            if not isinstance(one, dict) or not isinstance(one.get("params"), dict):
                continue
            params = one["params"]
            if one.get("method") == "npc/restore" and isinstance(params.get("save"), dict):
                params = params["save"].get("config")
            elif one.get("method") != "npc/create":
                continue
            if not isinstance(params, dict) or self.state != "ready":
                continue
            engine, model = params.get("engine", "auto"), params.get("model")
            if isinstance(engine, str) and (model is None or isinstance(model, str)):
                await self.registry.start(engine, model)

    async def _processor(self, in_recv: trio.MemoryReceiveChannel[bytes | LineTooLong]) -> None:
        async for item in in_recv:
            await self._processor_item(item)
            if self._stop.is_set():
                break
        self._processed.set()

    async def _writer(self, send: trio.abc.SendStream) -> None:
        try:
            async for first in self._out_recv:
                self._writer_idle = False
                buf = [first]
                while len(buf) < 512:
                    try:
                        buf.append(self._out_recv.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await send.send_all(b"".join(buf))
                self._writer_idle = True
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            log.warning("protocol output closed by the peer")
            self.stop()
        finally:
            self._drained.set()
