"""One agent per NPC: the turn queue, per-step steering, the tool runtime, trimming and
rollback. Engines only run single steps (see ``engines.base``); every rule lives here once.

Turn state machine (a table, illegal moves raise ``StateError``)::

    queued -> running -> awaiting_tool -> running -> completed | failed | cancelled
"""

from __future__ import annotations

import logging
import uuid
from contextlib import aclosing
from collections.abc import Awaitable, Callable
from typing import Any

import jsonschema
import msgspec
import trio

from . import _messages as m
from .engines.base import Engine, Message, StepRequest, TextChunk, ToolCall, ToolCallsChunk, ToolSpec, Usage
from .errors import BridgeError

log = logging.getLogger("oam_bridge.agent")

Notify = Callable[[str, m._Event], Awaitable[None]]

TURN_TRANSITIONS: dict[str, frozenset[str]] = {
    "queued": frozenset({"running", "cancelled"}),
    "running": frozenset({"awaiting_tool", "completed", "failed", "cancelled"}),
    "awaiting_tool": frozenset({"running", "failed", "cancelled"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}


class StateError(RuntimeError):
    pass


def check_schema(schema: Any, what: str) -> None:
    """Raise ``invalid_schema`` unless ``schema`` is a valid JSON Schema object."""
    if not isinstance(schema, dict):
        raise BridgeError("invalid_schema", f"{what} must be a JSON Schema object")
    try:
        jsonschema.validators.validator_for(schema).check_schema(schema)
    except jsonschema.SchemaError as e:
        raise BridgeError("invalid_schema", f"{what}: {e.message}", path=list(e.path)) from None


def reorder_to_schema(value: Any, schema: dict[str, Any] | None) -> Any:
    """Return ``value`` with object keys in the schema's property order (extras last)."""
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        out = {k: reorder_to_schema(value[k], props[k]) for k in props if k in value}
        out.update((k, v) for k, v in value.items() if k not in out)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [reorder_to_schema(v, schema["items"]) for v in value]
    return value


def render_instructions(config: m.NpcConfig) -> str:
    parts = []
    p = config.persona
    if p is not None:
        line = f"You are {p.name}" + (f", {p.role}" if p.role else "") + "."
        parts.append(line)
        if p.traits:
            parts.append("Traits: " + ", ".join(p.traits) + ".")
        if p.speech_style:
            parts.append("Speech style: " + p.speech_style)
        parts.append("Stay in character.")
    if config.instructions:
        parts.append(config.instructions)
    return "\n".join(parts)


class _PendingCall:
    __slots__ = ("call", "done", "output", "error")

    def __init__(self, call: ToolCall) -> None:
        self.call = call
        self.done = trio.Event()
        self.output: Any = None
        self.error: str | None = None


class Turn:
    def __init__(self, npc: Npc, params: m.RespondParams) -> None:
        self.id = f"turn_{uuid.uuid4().hex[:12]}"
        self.npc = npc
        self.params = params
        self.state = "queued"
        self.seq = 0
        self.scope = trio.CancelScope()
        self.end_reason: str = "cancelled"  # why the turn was cancelled, if it was

    def move(self, new: str) -> None:
        if new not in TURN_TRANSITIONS[self.state]:
            raise StateError(f"turn {self.id}: {self.state} -> {new}")
        self.state = new

    def next_seq(self) -> int:
        s = self.seq
        self.seq += 1
        return s


class Npc:
    """An NPC's configuration, committed history (complete turns only) and turn queue."""

    def __init__(self, config: m.NpcConfig, engine: Engine, engine_name: str, notify: Notify, max_queued: int) -> None:
        self.config = config
        self.engine = engine
        self.engine_name = engine_name
        self.instructions = render_instructions(config)
        self.tools = {t.name: t for t in config.tools}
        self.turns: list[list[Message]] = []
        self.notify = notify
        self.current: Turn | None = None
        self.pending: dict[str, _PendingCall] = {}
        self._send, self._recv = trio.open_memory_channel[Turn](max_queued)
        self.queued: list[Turn] = []
        self.closed = False

    # ---- queue ----

    def enqueue(self, params: m.RespondParams) -> Turn:
        turn = Turn(self, params)
        try:
            self._send.send_nowait(turn)
        except trio.WouldBlock:
            raise BridgeError("busy", f"npc {self.config.npc_id!r} has too many queued turns") from None
        self.queued.append(turn)
        return turn

    async def worker(self) -> None:
        async for turn in self._recv:
            self.queued.remove(turn)
            if turn.state == "cancelled":
                await self._emit_failed(turn, BridgeError("cancelled", "turn cancelled before it started"))
                continue
            self.current = turn
            try:
                await self._run(turn)
            finally:
                self.current = None
                self.pending.clear()

    def cancel(self, reason: str = "cancelled") -> list[str]:
        """Cancel the running turn and every queued one. Each still gets its terminal event."""
        ids = []
        for t in self.queued:
            if t.state == "queued":
                t.move("cancelled")
                ids.append(t.id)
        if self.current is not None and self.current.state in ("running", "awaiting_tool"):
            self.current.end_reason = reason
            self.current.scope.cancel()
            ids.insert(0, self.current.id)
        return ids

    def close(self, reason: str = "turn_ended") -> None:
        self.cancel(reason)
        self.closed = True
        self._send.close()

    def submit(self, params: m.SubmitParams) -> None:
        pc = self.pending.get(params.call_id)
        if pc is None or pc.done.is_set():
            raise BridgeError(
                "unknown_tool_call",
                f"no pending tool call {params.call_id!r} for npc {self.config.npc_id!r}",
                callId=params.call_id,
            )
        pc.output, pc.error = params.output, params.error
        pc.done.set()

    # ---- turn ----

    async def _emit(self, turn: Turn, event: str, /, **fields: Any) -> None:
        ev = m.EVENTS[event](npc_id=self.config.npc_id, turn_id=turn.id, seq=turn.next_seq(), **fields)
        await self.notify(event, ev)

    async def _emit_failed(self, turn: Turn, err: BridgeError) -> None:
        with trio.CancelScope(shield=True):
            await self._emit(turn, "turn/failed", error=m.ErrorInfo(**err.to_event()))

    async def _run(self, turn: Turn) -> None:
        turn.move("running")
        await self._emit(turn, "turn/started", prompt=turn.params.prompt)
        error: BridgeError | None = None
        with turn.scope:
            try:
                await self._steps(turn)
                return
            except BridgeError as e:
                error = e
            except Exception as e:  # our bug or an engine's: logged, reported, never a crash
                log.exception("turn %s failed", turn.id)
                error = BridgeError("generation_failed", f"internal error: {type(e).__name__}: {e}")
        # History is untouched: the turn's messages were never committed (rollback).
        if error is None:
            turn.move("cancelled")
            error = BridgeError("cancelled", "turn cancelled")
        else:
            turn.move("failed")
        await self._emit_failed(turn, error)

    def _visible(self, working: list[Message], tools: list[ToolSpec]) -> tuple[list[Message], int]:
        """Drop the oldest complete turns until the prompt fits the engine's window."""
        reserve = self.config.options.max_tokens or 256
        budget = self.engine.context_size - reserve
        history = self.turns
        dropped = 0
        while True:
            msgs = [msg for t in history[dropped:] for msg in t] + working
            n = self.engine.count_tokens(self.instructions, msgs, tools)
            if n <= budget:
                return msgs, dropped
            if dropped == len(history):
                raise BridgeError(
                    "context_size_exceeded",
                    f"prompt needs {n} tokens; the window leaves {budget}",
                    tokens=n,
                    contextSize=self.engine.context_size,
                )
            dropped += 1

    async def _steps(self, turn: Turn) -> None:
        p = turn.params
        working: list[Message] = [Message(role="user", content=p.prompt)]
        records: list[m.ToolRecord] = []
        usage = Usage()
        rounds = calls_made = 0
        announced_drop = 0
        shown_text = ""
        warnings: list[str] = []
        step = 0
        finish = "stop"
        while True:
            tools, mode = self._steer(p, step, rounds, calls_made)
            msgs, dropped = self._visible(working, tools)
            if dropped > announced_drop:
                announced_drop = dropped
                await self._emit(
                    turn,
                    "turn/contextTrimmed",
                    dropped_turns=dropped,
                    kept_turns=len(self.turns) - dropped,
                    prompt_tokens=self.engine.count_tokens(self.instructions, msgs, tools),
                    context_size=self.engine.context_size,
                )
            req = StepRequest(
                npc_id=self.config.npc_id,
                instructions=self.instructions,
                messages=msgs,
                tools=tools,
                tool_mode=mode,
                schema=p.schema,
                options=self.config.options,
                step_index=step,
            )
            text = ""
            calls: list[ToolCall] = []
            reset = bool(shown_text)
            n_chunks = 0
            # aclosing: a cancelled step closes the engine's generator at once, so an engine
            # can stop its worker thread instead of waiting for garbage collection.
            async with aclosing(self.engine.stream_step(req)) as stream:
                async for chunk in stream:
                    n_chunks += 1
                    if n_chunks % 32 == 0:
                        await trio.lowlevel.checkpoint()  # let other NPCs and the reader run
                    if isinstance(chunk, TextChunk):
                        text += chunk.delta
                        so_far = text if p.full_text else None
                        if p.schema is not None:
                            await self._emit(turn, "turn/partialJson", json=so_far, delta=chunk.delta)
                        else:
                            await self._emit(turn, "turn/textDelta", delta=chunk.delta, text=so_far, is_reset=reset)
                            reset = False
                    elif isinstance(chunk, ToolCallsChunk):
                        calls.extend(chunk.calls)
                    else:
                        usage.add(chunk.usage)
                        finish = chunk.finish_reason
                        warnings.extend(w for w in chunk.warnings if w not in warnings)
            step += 1
            shown_text = text
            if calls and mode != "disallowed":
                rounds += 1
                turn.move("awaiting_tool")
                results = await self._run_calls(turn, calls, calls_made, p)
                turn.move("running")
                calls_made += len(calls)
                working.append(Message(role="assistant", content=text, tool_calls=calls))
                for call, (output, err) in zip(calls, results):
                    records.append(m.ToolRecord(call.id, call.name, call.arguments, output, err))
                    content = err if err is not None else (output if isinstance(output, str) else msgspec.json.encode(output).decode())
                    working.append(
                        Message(role="tool", content=f"Error: {content}" if err else content, tool_call_id=call.id, name=call.name, is_error=err is not None)
                    )
                continue
            if calls:
                warnings.append(f"engine produced {len(calls)} tool call(s) on a step where tools were disallowed; ignored")
            break
        answer: Any = None
        if p.schema is not None:
            try:
                answer = msgspec.json.decode(text)
            except msgspec.DecodeError:
                raise BridgeError("generation_failed", "the structured answer is not valid JSON", text=text[:200]) from None
            errors = sorted(jsonschema.validators.validator_for(p.schema)(p.schema).iter_errors(answer), key=str)
            if errors:
                raise BridgeError("generation_failed", f"the structured answer does not match the schema: {errors[0].message}")
            answer = reorder_to_schema(answer, p.schema)
        working.append(Message(role="assistant", content=text))
        # Commit: the one place history changes. Nothing before this point is kept on failure.
        with trio.CancelScope(shield=True):
            self.turns.append(working)
            turn.move("completed")
            await self._emit(
                turn,
                "turn/completed",
                text=text,
                json=answer,
                tool_calls=records,
                usage=usage,
                steps=step,
                finish_reason=finish,
                warnings=warnings,
            )

    def _steer(self, p: m.RespondParams, step: int, rounds: int, calls_made: int) -> tuple[list[ToolSpec], str]:
        """Tool mode and visible tools for one step: ``required``/named apply to step 0 only;
        a spent budget or ``none`` disallows, and disallowed steps show no tools at all."""
        choice = p.tool_choice
        if (
            not self.tools
            or choice == "none"
            or rounds >= p.max_tool_rounds
            or calls_made >= p.max_tool_calls
        ):
            return [], "disallowed"
        if step == 0 and isinstance(choice, m.NamedTool):
            return [self.tools[choice.tool]], "required"
        if step == 0 and choice == "required":
            return list(self.tools.values()), "required"
        return list(self.tools.values()), "allowed"

    async def _run_calls(
        self, turn: Turn, calls: list[ToolCall], calls_made: int, p: m.RespondParams
    ) -> list[tuple[Any, str | None]]:
        """Run one step's calls concurrently; results keep call order. Errors become outputs."""
        results: list[tuple[Any, str | None]] = [(None, None)] * len(calls)
        room = p.max_tool_calls - calls_made

        async def one(i: int, call: ToolCall) -> None:
            results[i] = await self._one_call(turn, call, p.tool_timeout_ms, over_budget=i >= room)

        async with trio.open_nursery() as nursery:
            for i, call in enumerate(calls):
                nursery.start_soon(one, i, call)
        return results

    async def _one_call(self, turn: Turn, call: ToolCall, timeout_ms: int, over_budget: bool) -> tuple[Any, str | None]:
        err: str | None = None
        spec = self.tools.get(call.name)
        if over_budget:
            err = "tool call budget exceeded for this turn; answer without more tool calls"
        elif spec is None:
            err = f"unknown tool {call.name!r}"
        else:
            problems = sorted(jsonschema.validators.validator_for(spec.parameters)(spec.parameters).iter_errors(call.arguments), key=str)
            if problems:
                err = f"invalid arguments: {problems[0].message}"
        if err is not None:
            await self._emit(turn, "turn/toolCallCompleted", call_id=call.id, name=call.name, error=err)
            return None, err
        pc = _PendingCall(call)
        self.pending[call.id] = pc
        await self._emit(turn, "turn/toolCallRequested", call_id=call.id, name=call.name, arguments=call.arguments, timeout_ms=timeout_ms)
        try:
            with trio.move_on_after(timeout_ms / 1000 if timeout_ms > 0 else float("inf")):
                await pc.done.wait()
        finally:
            if not pc.done.is_set():
                pc.done.set()  # resolved: a late submit is "unknown or already resolved"
                reason = turn.end_reason if turn.scope.cancel_called else "timeout"
                with trio.CancelScope(shield=True):
                    await self._emit(turn, "turn/toolCallWithdrawn", call_id=call.id, name=call.name, reason=reason)
                pc.error = f"the game did not answer {call.name} within {timeout_ms} ms" if reason == "timeout" else None
        await self._emit(turn, "turn/toolCallCompleted", call_id=call.id, name=call.name, output=pc.output, error=pc.error)
        return pc.output, pc.error
