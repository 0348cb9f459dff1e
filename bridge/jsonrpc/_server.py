"""The JSON-RPC bridge: the host that puts the service on a line-delimited JSON-RPC stream.

It glues three layers and owns none of their rules: ``_protocol`` (decoding, the connection
gate, encoding), ``_service`` (what each method does, found through the method registry,
``bridge/core/_methods.py``) and ``_transport`` (the one writer and the bounded input queue).

Requests are handled strictly in arrival order, so a game can pipeline ``npc/create`` and
``npc/respond`` without waiting. A line is handled by the reader itself when nothing is queued
ahead of it and it cannot wait (the common case: no task switch); otherwise it goes to the
processor task, which may wait (an engine starting in a worker thread, a token count on a
model) while the reader goes on reading. Turns run in their own tasks.

Leaving (stdin EOF, ``exit``, a signal) is bounded by ``limits.exitGraceMs`` whatever the game
does: turns are ended (each still gets its terminal event), what can be written is written,
and what the game does not read by then is dropped, with a line on stderr. Requests read but
not answered when a signal (or ``exit``) ends serving still get their one response:
``shutting_down``, the one a request after ``shutdown`` gets (stdin EOF answers them all
first, as it always did).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import trio

from bridge.core import _messages as m
from bridge.core._messages import Limits
from bridge.core._methods import MAY_WAIT, METHODS, ConnectionState
from bridge.core._service import Service
from bridge.engines import EngineRegistry
from bridge.errors import BridgeError
from bridge.jsonrpc._framing import LineFramer, LineTooLong
from bridge.jsonrpc._protocol import (
    Call,
    Connection,
    Invalid,
    Parsed,
    error_from,
    error_response,
    event_line,
    parse_line,
    reply_line,
    response,
)
from bridge.jsonrpc._record import Recorder
from bridge.jsonrpc._transport import PendingLines, Writer

log = logging.getLogger("oam_bridge.server")

RETRY_AFTER_MS = 10
# how often an fd-backed stdout is checked for the game having closed it (protocol.md, Lifecycle)
OUTPUT_WATCH_S = 0.1


def _nothing(_: Any) -> None:
    return None


def operations(service: Service) -> dict[str, Callable[[Any], Any]]:
    """method -> what runs it: the registry's operation on ``service``. A method without one
    (``exit``) does nothing here: its connection move is its whole effect."""
    return {
        name: _nothing if method.operation is None else partial(method.operation, service)
        for name, method in METHODS.items()
    }


def _refusals(items: list[Call | Invalid], err: BridgeError) -> list[dict[str, Any]]:
    """The replies to requests the bridge will not run: ``err``, or an invalid one's own error."""
    return [error_response(i.id, i.error if isinstance(i, Invalid) else err) for i in items if i.has_id]


@dataclass
class _Line:
    """A line being handled: its replies so far and how many of its items were handled."""

    parsed: Parsed
    replies: list[dict[str, Any]] = field(default_factory=list)
    done: int = 0

    def refusal(self) -> bytes | None:
        """The response line when the bridge leaves before handling the rest of the line:
        each request not handled yet gets ``shutting_down`` (an invalid one its own error)."""
        err = BridgeError("shutting_down", "the bridge is exiting")
        self.replies += _refusals(self.parsed.items[self.done :], err)
        return reply_line(self.parsed, self.replies)


class Server:
    """One JSON-RPC connection over a ``ReceiveStream``/``SendStream`` pair, serving a
    ``Service``. It is the service's event sink: events go to the writer as lines.

    ``recorder``: the session recording (``--record``), shown every line read and written."""

    def __init__(
        self, registry: EngineRegistry | None = None, limits: Limits | None = None, recorder: Recorder | None = None
    ) -> None:
        self.limits = limits or Limits()
        self.recorder = recorder
        self.conn = Connection()
        self.service = Service(registry, self.limits, sink=self)
        self.registry = self.service.registry
        self._writer: Writer | None = None
        self._stop = trio.Event()
        self._processed = trio.Event()
        self._line_scope: trio.CancelScope | None = None  # the processor's line, while handled
        self._operations = operations(self.service)

    @property
    def state(self) -> ConnectionState:
        return self.conn.state

    @property
    def npcs(self) -> dict[str, Any]:
        return self.service.npcs

    def stop(self) -> None:
        """End serving: stdin EOF, ``exit``, a signal, or the peer closing stdout."""
        self.conn.move("closed")  # closing is idempotent
        self._stop.set()

    # ---- the service's event sink ----

    async def wait_room(self) -> None:
        """Return when an event may be put. Also where a cancelled turn stops: a turn whose
        ``npc/cancel`` was answered since its last checkpoint (its engine's next chunk was
        already on its way) raises here instead of putting one more event after the answer."""
        if self._writer is None:
            await trio.lowlevel.checkpoint()
            return
        if not self._writer.has_room():  # called once per event: no second coroutine unless full
            await self._writer.wait_room()
        await trio.lowlevel.checkpoint_if_cancelled()

    def put(self, event: m.Event) -> None:
        if self._writer is not None:
            self._writer.put(event_line(event), direct=False)

    # ---- the protocol ----

    async def handle_line(self, line: bytes) -> bytes | None:
        """One line in, the encoded response line (or ``None``) out."""
        return await self.handle(parse_line(line, self.limits.max_nesting_depth))

    async def handle(self, parsed: Parsed, line: _Line | None = None) -> bytes | None:
        line = line or _Line(parsed)
        for item in parsed.items:
            if isinstance(item, Invalid):
                if item.has_id:
                    line.replies.append(error_response(item.id, item.error))
            elif (reply := await self._call(item)) is not None:
                line.replies.append(reply)
            line.done += 1
        return reply_line(parsed, line.replies)

    async def _call(self, call: Call) -> dict[str, Any] | None:
        try:
            params = self.conn.gate(call)
            result = self._operations[call.method](params)
            if isinstance(result, Awaitable):
                result = await result
            self.conn.moved_by(call.method)
            if self.conn.state == "closed":  # exit: the connection is over, and so is serving
                self._stop.set()
        except Exception as e:  # the one boundary: BridgeError keeps its code, bugs are internal_error
            # No local outlives the clause: the exception's traceback holds this frame, and a
            # local naming the exception would make a cycle that keeps the call's params
            # (megabytes, for a refused world/set of a huge scope) until a full collection.
            reply = error_response(call.id, error_from(e, call.method))
            return reply if call.has_id else None
        return response(call.id, result) if call.has_id else None

    def _overloaded(self, parsed: Parsed) -> Parsed | None:
        """Past the pending bound: answer the line's requests now (``overloaded``, or their
        own error if invalid) and keep its notifications, which may change state, in order."""
        err = BridgeError("overloaded", "too many pending requests; retry later", retryAfterMs=RETRY_AFTER_MS)
        keep: list[Call | Invalid] = [i for i in parsed.items if not i.has_id and isinstance(i, Call)]
        out = reply_line(parsed, _refusals(parsed.items, err))
        if out is not None and self._writer is not None:
            self._writer.put(out)
        return Parsed(keep, parsed.batch, parsed.size) if keep else None

    # ---- I/O ----

    async def serve(
        self,
        recv: trio.abc.ReceiveStream,
        send: trio.abc.SendStream,
        out_fd: int | None = None,
        preload: bool = False,
    ) -> None:
        """Serve until stdin EOF, ``exit``, ``stop()`` or a closed stdout; returns within
        ``limits.exitGraceMs`` of that, every accepted turn having had its terminal event
        written unless the game stopped reading.

        ``out_fd``: the non-blocking fd behind ``send``, if it has one (the writer then writes
        to it directly when nothing is queued). ``preload``: start the default model engine in
        a worker thread at once, instead of on the first ``npc/create``."""
        tap = self.recorder.outbound if self.recorder is not None else None
        writer = self._writer = Writer(send, self.limits.max_outbound_bytes, fd=out_fd, tap=tap)
        pending = PendingLines(self.limits.max_pending_lines, self.limits.max_pending_bytes)
        grace = self.limits.exit_grace_ms / 1000
        end = float("inf")  # when the process must be gone, once stopping starts
        try:
            async with trio.open_nursery() as nursery:
                self.service.attach(nursery)
                nursery.start_soon(self._run_writer, writer)
                if out_fd is not None:
                    nursery.start_soon(writer.watch_peer, OUTPUT_WATCH_S)
                nursery.start_soon(self._processor, pending, writer)
                nursery.start_soon(self._reader, recv, pending, writer)
                if preload:
                    nursery.start_soon(self.registry.start)
                await self._stop.wait()
                end = trio.current_time() + grace
                with trio.move_on_at(end - 0.5 * grace):
                    await self._refuse_unanswered(pending, writer)
                await self._wind_down(writer, end - 0.15 * grace)
                nursery.cancel_scope.cancel()
        finally:
            # Engines get what is left of the grace period to stop their threads.
            with trio.CancelScope(shield=True, deadline=min(end - 0.05 * grace, trio.current_time() + grace)):
                await self.registry.aclose()

    async def _run_writer(self, writer: Writer) -> None:
        await writer.run()
        if writer.broken:  # the game closed our stdout: serving is over, idle or not
            self.stop()

    async def _refuse_unanswered(self, pending: PendingLines, writer: Writer) -> None:
        """Serving ends (a signal, ``exit``, a broken stdout) before what was read is handled:
        the line the processor is in (an engine starting, say) and the lines queued behind it
        are answered ``shutting_down``, so every request still gets one response."""
        queued = pending.drain()
        pending.close()  # an idle processor leaves its loop
        if self._line_scope is not None:
            self._line_scope.cancel()
        await self._processed.wait()
        for parsed in queued:
            assert isinstance(parsed, Parsed)
            if (out := _Line(parsed).refusal()) is not None:
                writer.put(out)

    async def _wind_down(self, writer: Writer, deadline: float) -> None:
        """End every turn, then write what can be written by ``deadline``; drop the rest."""
        self.service.close_all("turn_ended")
        with trio.move_on_at(trio.current_time() + (deadline - trio.current_time()) / 2):
            await self.service.wait_idle()
        writer.close()
        with trio.move_on_at(deadline):
            await writer.drained.wait()
        if not writer.drained.is_set():
            writer.abandon()
        if writer.dropped_bytes:
            log.warning("exiting: dropped %d bytes of output the game did not read", writer.dropped_bytes)

    async def _reader(self, recv: trio.abc.ReceiveStream, pending: PendingLines, writer: Writer) -> None:
        framer = LineFramer(self.limits.max_line_bytes)
        try:
            while not self._stop.is_set():
                try:
                    data = await recv.receive_some(65536)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    data = b""
                items = framer.feed(data) if data else framer.eof()
                if self.recorder is not None:
                    self.recorder.inbound(items)
                    if not data:
                        self.recorder.note(eof=True)
                for item in items:
                    parsed = self._parse(item)
                    if self._stop.is_set():  # read after serving ended: _refuse_unanswered
                        if (out := _Line(parsed).refusal()) is not None:
                            writer.put(out)
                        continue
                    if (
                        self._line_scope is None
                        and not len(pending)
                        and writer.has_room()
                        and not any(c.method in MAY_WAIT for c in parsed.calls)
                    ):
                        # Nothing is queued ahead and nothing in it waits: handle it here.
                        out = await self.handle(parsed)
                        if out is not None:
                            writer.put(out)
                        continue
                    if pending.soft_full():
                        if writer.queued_bytes >= 2 * writer.max_bytes:
                            # The game reads neither its answers nor its events: stop reading
                            # its requests too, rather than queueing answers without bound.
                            await writer.wait_room()
                        kept = self._overloaded(parsed)
                        if kept is None:
                            continue
                        parsed = kept
                    pending.put(parsed, parsed.size)
                    if pending.hard_full():
                        await pending.wait_below_hard()
                if not data:
                    break
        finally:
            pending.close()
        # stdin EOF means exit, once what was read has been processed.
        await self._processed.wait()
        self.stop()

    def _parse(self, item: bytes | LineTooLong) -> Parsed:
        if isinstance(item, LineTooLong):
            limit = self.limits.max_line_bytes
            err = BridgeError(
                "message_too_large", f"line of {item.size} bytes exceeds {limit}", size=item.size, limit=limit
            )
            return Parsed([Invalid(None, err)], False, 0)
        return parse_line(item, self.limits.max_nesting_depth)

    async def _processor(self, pending: PendingLines, writer: Writer) -> None:
        try:
            while not self._stop.is_set():
                parsed = await pending.get()
                if parsed is None:
                    break
                assert isinstance(parsed, Parsed)
                line = _Line(parsed)
                try:
                    with trio.CancelScope() as self._line_scope:
                        await writer.wait_room()
                        out = await self.handle(parsed, line)
                    if self._line_scope.cancelled_caught:  # leaving: _refuse_unanswered
                        out = line.refusal()
                finally:
                    self._line_scope = None
                if out is not None:
                    writer.put(out)
        finally:
            self._processed.set()


__all__ = ["Limits", "Server"]
