"""One agent per NPC: its configuration, history and view of the world, the turn queue and
its worker, and the tool runtime (the game runs the calls; each call it was told about ends
in exactly one event).

The rest lives beside it, each once for every engine: how a turn runs and its events in
``_turn``, the steering rules and the engine contract in ``_steering``, the context window
and its token counts in ``_window``, the system text in ``_persona``, schemas in
``_schema``. Engines only run single steps (see ``engines.base``).
"""

from __future__ import annotations

import math
from collections import deque
from typing import Any

import msgspec
import trio

from bridge.core import _messages as m
from bridge.core._world import EMPTY_VIEW, RECALL, View, World, render_value
from bridge.core.agent._persona import next_fallback_line, render_instructions, with_facts
from bridge.core.agent._schema import first_error, make_validator
from bridge.core.agent._steering import TurnProgress, call_problems, offered_tools, repeats
from bridge.core.agent._turn import EventSink, Turn, WithdrawReason, run_turn
from bridge.core.agent._window import Window, prompt_budget
from bridge.engines.base import Engine, Message, Scriptable, ToolCall, ToolSpec
from bridge.errors import BridgeError

NO_TAGS: frozenset[str] = frozenset()  # shared: an empty frozenset is not a singleton (216 bytes each)

CallResult = tuple[Any, str | None]  # (output, error) as the model sees it


class _PendingCall:
    __slots__ = ("call", "done", "output", "error", "withdrawn")

    def __init__(self, call: ToolCall) -> None:
        self.call = call
        self.done = trio.Event()
        self.output: Any = None
        self.error: str | None = None
        self.withdrawn: WithdrawReason | None = None  # set when resolved by withdrawal


class Npc:
    """An NPC's configuration, committed history (``window``: complete turns only, and
    what they cost in tokens) and turn queue."""

    # Slots: thousands of idle NPCs, each without an instance dict (0.6 KiB less apiece).
    __slots__ = (
        "config",
        "npc_id",
        "engine",
        "engine_name",
        "sink",
        "world",
        "tags",
        "_view",
        "_fallback_next",
        "_recall_check",
        "instructions",
        "tools",
        "_arg_validators",
        "window",
        "current",
        "pending",
        "queued",
        "_max_queued",
        "_wake",
        "closed",
    )

    def __init__(
        self,
        config: m.NpcConfig,
        engine: Engine,
        engine_name: str,
        sink: EventSink,
        max_queued: int,
        world: World | None = None,
    ) -> None:
        self.config = config
        self.world = world
        self.tags = frozenset(config.tags) if config.tags else NO_TAGS
        self._view: tuple[int, frozenset[str], View] | None = None
        self._fallback_next: dict[str, int] | None = None  # made at the first fallback line
        self._recall_check: tuple[View, Any] | None = None
        self.npc_id = config.npc_id
        self.engine = engine
        self.engine_name = engine_name
        self.sink = sink
        self.instructions = render_instructions(config)
        self.tools = {t.name: t for t in config.tools}
        self._arg_validators = {t.name: make_validator(t.parameters) for t in config.tools}
        self.window = Window(engine)
        self.current: Turn | None = None
        self.pending: dict[str, _PendingCall] = {}
        # Turns waiting for the worker, oldest first. A deque and an event made when the worker
        # waits, not a memory channel: an idle NPC costs about 1.5 KiB less (thousands of them).
        self.queued: deque[Turn] = deque()
        self._max_queued = max_queued
        self._wake: trio.Event | None = None
        self.closed = False

    # ---- history and the world ----

    @property
    def turns(self) -> list[list[Message]]:
        """The committed history, oldest turn first."""
        return self.window.turns

    def set_history(self, turns: list[list[Message]]) -> None:
        """Replace the history (restore), before the worker runs."""
        self.window.replace(turns)

    def reset(self) -> None:
        """Cancel every turn, clear the history (and its counts), and make the engine forget
        the NPC; a scripted NPC's script starts again from its first step."""
        self.cancel()
        self.set_history([])
        self.engine.forget(self.npc_id)
        if self.config.script is not None and isinstance(self.engine, Scriptable):
            self.engine.set_script(self.npc_id, self.config.script)

    async def prompt_tokens(self) -> int:
        """Tokens of the prompt the model would see now (instructions, every tool, and the
        turns that fit the window), counted off the event loop for slow engines."""
        view = self.view()
        tools = offered_tools(self.tools.values(), view)
        fixed = await self.window.base_tokens(with_facts(self.instructions, view), tools)
        _, visible = await self.window.fit_counted(fixed, self.budget())
        return fixed + visible

    def budget(self) -> int:
        return prompt_budget(self.engine.context_size, self.config.options)

    def view(self) -> View:
        """What the NPC sees of the world now (computed once per revision and tag set)."""
        world = self.world
        if world is None:
            return EMPTY_VIEW
        cached = self._view
        if cached is not None and cached[0] == world.revision and cached[1] is self.tags:
            return cached[2]
        view = world.view(self.npc_id, self.tags)
        self._view = (world.revision, self.tags, view)
        return view

    def set_tags(self, tags: list[str]) -> None:
        self.config = msgspec.structs.replace(self.config, tags=tuple(tags))
        self.tags = frozenset(tags) if tags else NO_TAGS

    def fallback_line(self, code: str) -> str | None:
        """The NPC's next fallback line for ``code``, or None when it has none."""
        cursors = self._fallback_next if self._fallback_next is not None else {}
        line = next_fallback_line(self.config, code, cursors)
        if line is not None:
            self._fallback_next = cursors
        return line

    # ---- queue ----

    def enqueue(
        self,
        params: m.RespondParams,
        kind: m.TurnKind = "respond",
        speaker: str | None = None,
        remember: bool = True,
        *,
        resume: list[Message] | None = None,
        return_calls: bool = False,
    ) -> Turn:
        """Queue a turn. Two options serve hosts that cannot keep a turn suspended while a
        tool runs (the OpenAI-compatible server), which rebuild the transcript every time:

        - ``resume``: the turn starts from these messages (a user line, then the calls and
          outputs of earlier steps, ending with tool outputs) instead of ``params.prompt``:
          its first step continues from the last tool output. They enter the history with
          the turn, as if the turn had made them.
        - ``return_calls``: the first step whose tool calls the game would be asked to run
          ends the turn instead: ``turn/completed`` with ``finishReason`` ``"tool_calls"``,
          the step's text, and those calls as its last ``toolCalls`` records (no output, no
          error); no ``turn/toolCallRequested`` is sent and nothing is committed (the turn is
          not complete). Calls the steering refuses (unknown or hidden tool, invalid
          arguments, over budget) still get their error output and the turn goes on, so the
          model may correct itself; refused calls beside handed-back ones are dropped, each
          with a warning."""
        if self.closed:
            raise BridgeError("unknown_npc", f"npc {self.npc_id!r} was deleted", npcId=self.npc_id)
        if len(self.queued) >= self._max_queued:
            raise BridgeError("busy", f"npc {self.npc_id!r} has too many queued turns")
        turn = Turn(self.npc_id, self.sink, params, kind, speaker, remember, resume, return_calls)
        self.queued.append(turn)
        self._wake_worker()
        return turn

    def _wake_worker(self) -> None:
        if self._wake is not None:
            self._wake.set()
            self._wake = None

    async def worker(self) -> None:
        """Run the NPC's turns one at a time until ``close``. If the worker itself is
        cancelled (the host is going away), every turn it holds still gets ``turn/failed``."""
        try:
            while True:
                if not self.queued:
                    if self.closed:
                        return
                    self._wake = wake = trio.Event()
                    await wake.wait()
                    continue
                turn = self.queued.popleft()
                if turn.state == "cancelled":
                    turn.put_failed(BridgeError("cancelled", "turn cancelled before it started"))
                    continue
                self.current = turn
                try:
                    await run_turn(self, turn)
                finally:
                    self.current = None
                    self.pending.clear()
        finally:
            while self.queued:
                turn = self.queued.popleft()
                if turn.state == "queued":
                    turn.move("cancelled")
                turn.put_failed(BridgeError("cancelled", "turn cancelled before it started"))

    def cancel(self, reason: str = "cancelled") -> list[str]:
        """Cancel the running turn and every queued one; synchronous. The running turn's
        pending tool calls are resolved at once (a later ``submit`` for them raises
        ``unknown_tool_call``); its task still reports each as ``turn/toolCallWithdrawn``
        before ``turn/failed``. Returns the ids of the turns this call cancelled."""
        why: WithdrawReason = "turn_ended" if reason == "turn_ended" else "cancelled"
        ids = []
        cur = self.current
        if cur is not None and cur.state in ("running", "awaiting_tool") and not cur.scope.cancel_called:
            cur.end_reason = why
            cur.scope.cancel()
            ids.append(cur.id)
            for pc in self.pending.values():
                if not pc.done.is_set():
                    pc.withdrawn = why
                    pc.done.set()
            self.pending.clear()
        for t in self.queued:
            if t.state == "queued":
                t.move("cancelled")
                ids.append(t.id)
        return ids

    def close(self, reason: str = "turn_ended") -> None:
        self.cancel(reason)
        self.closed = True
        self._wake_worker()

    def submit(self, params: m.SubmitParams) -> None:
        pc = self.pending.get(params.call_id)
        if pc is None or pc.done.is_set():
            raise BridgeError(
                "unknown_tool_call",
                f"no pending tool call {params.call_id!r} for npc {self.npc_id!r}",
                callId=params.call_id,
            )
        pc.output, pc.error = params.output, params.error
        pc.done.set()
        del self.pending[params.call_id]

    # ---- tool runtime ----

    def check_calls(
        self, calls: list[ToolCall], p: m.RespondParams, progress: TurnProgress, shown: dict[str, ToolSpec], view: View
    ) -> list[str | None]:
        """Why the game must not get each call of a step's batch (None: it may)."""
        known = self.tools.keys() | {RECALL} if view.recall_tool is not None else self.tools.keys()
        return call_problems(
            calls, p, progress, known, shown, self.pending, lambda call: self._argument_error(call, view)
        )

    def _argument_error(self, call: ToolCall, view: View) -> str | None:
        validator = self._recall_validator(view) if call.name == RECALL else self._arg_validators[call.name]
        return first_error(validator, call.arguments)

    def _recall_validator(self, view: View) -> Any:
        cached = self._recall_check
        if cached is None or cached[0] is not view:
            assert view.recall_tool is not None
            cached = self._recall_check = (view, make_validator(view.recall_tool.parameters))
        return cached[1]

    async def run_calls(
        self, turn: Turn, calls: list[ToolCall], problems: list[str | None], timeout_ms: int, view: View
    ) -> list[CallResult]:
        """Run one step's calls concurrently; results keep call order. Errors become outputs.

        A call whose id repeats an earlier one of the batch gets its error output (the model
        sees it) but no event: its callId names the earlier call, which may be the game's to
        run, and that call ends with exactly one event of its own."""
        results: list[CallResult] = [(None, None)] * len(calls)
        repeated = repeats(calls)

        async def one(i: int, call: ToolCall) -> None:
            if repeated[i]:
                results[i] = (None, problems[i])
                return
            if call.name == RECALL and problems[i] is None:
                results[i] = await self._recall(turn, call, view)
                return
            results[i] = await self._one_call(turn, call, timeout_ms, problems[i])

        async with trio.open_nursery() as nursery:
            for i, call in enumerate(calls):
                nursery.start_soon(one, i, call)
        return results

    async def _one_call(self, turn: Turn, call: ToolCall, timeout_ms: int, problem: str | None) -> CallResult:
        if problem is not None:
            await turn.emit(m.ToolCallCompleted, call_id=call.id, name=call.name, error=problem)
            return None, problem
        # A turn cancelled before this task first ran asks the game for nothing more.
        await trio.lowlevel.checkpoint_if_cancelled()
        pc = _PendingCall(call)
        await turn.emit(
            m.ToolCallRequested, call_id=call.id, name=call.name, arguments=call.arguments, timeout_ms=timeout_ms
        )
        # Registered right after the request is put (no checkpoint between): the game can only
        # answer calls it was told about, and every call it was told about ends in exactly one
        # of toolCallCompleted / toolCallWithdrawn.
        self.pending[call.id] = pc
        try:
            with trio.move_on_after(timeout_ms / 1000 if timeout_ms > 0 else math.inf):
                await pc.done.wait()
        except BaseException:
            # The turn ends while the call waits: npc.cancel (which withdrew it), the host going
            # away, a sibling call failing; or the game's answer was accepted and the turn ended
            # before this task ran (its timeout fell due, then one scheduler pass ran the submit
            # and the cancel first). Whichever: the call's one ending event, put at once.
            if not pc.done.is_set():
                pc.withdrawn = turn.end_reason
                pc.done.set()
            self._put_call_end(turn, pc)
            raise
        finally:
            if self.pending.get(call.id) is pc:
                del self.pending[call.id]
        if not pc.done.is_set():
            pc.withdrawn = "timeout"
            pc.done.set()
        if pc.withdrawn is not None:
            self._put_call_end(turn, pc)
            if pc.withdrawn == "timeout":
                # The game was told (toolCallWithdrawn, its one ending event); the model sees
                # the timeout as the call's error output, and turn/completed's record says so.
                return None, f"the game did not answer {call.name} within {timeout_ms} ms"
            await trio.lowlevel.checkpoint()  # withdrawn by npc.cancel: the turn's scope is cancelled
            return None, None
        await turn.emit_owed(m.ToolCallCompleted, call_id=call.id, name=call.name, output=pc.output, error=pc.error)
        return pc.output, pc.error

    async def _recall(self, turn: Turn, call: ToolCall, view: View) -> CallResult:
        """The bridge's own tool: the lore the step's view holds for the topic, answered at
        once (a dictionary lookup: nothing to time out), seen by the game as completed only."""
        output = render_value(view.lore[call.arguments["topic"]])
        await turn.emit_owed(m.ToolCallCompleted, call_id=call.id, name=call.name, output=output)
        return output, None

    def _put_call_end(self, turn: Turn, pc: _PendingCall) -> None:
        """A requested call's one ending event, without waiting: withdrawn, or completed with
        the game's answer."""
        call = pc.call
        if pc.withdrawn is not None:
            turn.put(m.ToolCallWithdrawn, call_id=call.id, name=call.name, reason=pc.withdrawn)
        else:
            turn.put(m.ToolCallCompleted, call_id=call.id, name=call.name, output=pc.output, error=pc.error)
