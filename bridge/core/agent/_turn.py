"""One turn of one NPC: its state table, its events, and how it runs, step after step, to
exactly one terminal event.

Turn state machine (a table, illegal moves raise ``StateError``)::

    queued -> running -> awaiting_tool -> running -> completed | failed | cancelled

Events leave through an ``EventSink`` (the service's). Every turn's events carry a ``seq``
that is gap-free from 0, and every accepted turn ends with exactly one terminal event, even
when it is cancelled while the sink is full: ``emit`` waits for room *before* it takes a
seq, with no checkpoint between taking it and ``put``, and terminal events and
``turn/toolCallWithdrawn`` are put without waiting (the sink takes them past its bound).

A turn's steps (``run_turn``) apply the rules of ``_steering`` to the turn's
``TurnProgress``, trim to the NPC's ``_window``, and leave the tool calls to the NPC's tool
runtime. Rollback: the turn's messages stay in its progress until it completes; ``_finish``
is the one place the history changes, with no checkpoint between its last cancellation
check and the commit, so a turn that fails or is cancelled leaves the history as it was.
"""

from __future__ import annotations

import logging
import uuid
from collections import deque
from collections.abc import Callable
from contextlib import aclosing
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec
import trio

from bridge.core import _messages as m
from bridge.core._world import RECALL, View, render_value
from bridge.core.agent._persona import with_facts
from bridge.core.agent._routing import (
    Embedder,
    Route,
    default_embedder,
    embedder_ready,
    lore_lead,
    meaning_pins,
    resolve_policy,
    retrieve_lore,
    route,
)
from bridge.core.agent._steering import (
    TurnProgress,
    call_room,
    finish_reason,
    guardrail_action,
    hand_back,
    judge_step,
    offered_tools,
    pin_arguments,
    repeats,
    round_messages,
    steer,
    step_pins,
    structured_answer,
)
from bridge.core.agent._window import check_fits
from bridge.engines.base import (
    Engine,
    Message,
    Prewarmable,
    StepRequest,
    TextChunk,
    ToolCall,
    ToolCallsChunk,
    ToolSpec,
    Usage,
    user_text,
    weak_tool_choice,
)
from bridge.errors import BridgeError

if TYPE_CHECKING:  # the NPC runs its turns: a cycle for the type checker only
    from bridge.core.agent._npc import Npc

log = logging.getLogger("oam_bridge.agent")

WithdrawReason = Literal["cancelled", "timeout", "turn_ended"]
TurnState = Literal["queued", "running", "awaiting_tool", "completed", "failed", "cancelled"]

TURN_TRANSITIONS: dict[TurnState, frozenset[TurnState]] = {
    "queued": frozenset({"running", "cancelled"}),
    "running": frozenset({"awaiting_tool", "completed", "failed", "cancelled"}),
    "awaiting_tool": frozenset({"running", "failed", "cancelled"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}


class StateError(RuntimeError):
    pass


class EventSink(Protocol):
    """Where an NPC's events go (the service supplies it)."""

    async def wait_room(self) -> None:
        """Return when ``put`` may be called without exceeding the output bound."""
        ...

    def put(self, event: m.Event) -> None:
        """Take one event. Never blocks, never fails; takes terminal and withdrawn events
        even past the bound."""
        ...


class Turn:
    """One accepted turn: its parameters, its state (moved only through ``move``) and its
    events, each with the next ``seq``."""

    def __init__(
        self,
        npc_id: str,
        sink: EventSink,
        params: m.RespondParams,
        kind: m.TurnKind = "respond",
        speaker: str | None = None,
        remember: bool = True,
        resume: list[Message] | None = None,
        return_calls: bool = False,
    ) -> None:
        self.id = f"turn_{uuid.uuid4().hex[:12]}"
        self.npc_id = npc_id
        self.sink = sink
        self.params = params
        self.kind: m.TurnKind = kind
        self.speaker = speaker  # the name the prompt is attributed to; None: the player
        self.remember = remember  # False: the turn completes but does not enter the history
        # Stateless hosts (see ``Npc.enqueue``): the turn's own messages so far, in place of
        # the prompt line, and tool calls handed back in turn/completed instead of requested.
        self.resume = resume
        self.return_calls = return_calls
        self.shown = False  # text or JSON reached the game (a fallback line then resets it)
        self.state: TurnState = "queued"
        self.seq = 0
        self.scope = trio.CancelScope()
        self.end_reason: WithdrawReason = "cancelled"  # why the turn was cancelled, if it was
        # While a step's calls run: those whose first event has not gone out yet, in the
        # model's order (``in_call_order``), and the event the later ones wait on.
        self._call_order: deque[str] | None = None
        self._call_sent: trio.Event | None = None

    def move(self, new: TurnState) -> None:
        if new not in TURN_TRANSITIONS[self.state]:
            raise StateError(f"turn {self.id}: {self.state} -> {new}")
        self.state = new

    def next_seq(self) -> int:
        s = self.seq
        self.seq += 1
        return s

    # ---- the order of a step's calls ----

    def in_call_order(self, call_ids: list[str]) -> None:
        """The calls of the step about to run, in the model's order (``[]``: none). Each runs
        in a task of its own, and trio starts tasks in no fixed order; so each call's first
        event (``turn/toolCallRequested``, or ``turn/toolCallCompleted`` for a call the game
        is not asked to run) waits here until the calls before it have had theirs."""
        self._call_order = deque(call_ids) if len(call_ids) > 1 else None

    async def _call_turn(self, fields: dict[str, Any]) -> None:
        order = self._call_order
        call_id = fields.get("call_id")
        while order and order[0] != call_id and call_id in order:
            if self._call_sent is None:
                self._call_sent = trio.Event()
            await self._call_sent.wait()

    def _call_done(self, fields: dict[str, Any]) -> None:
        order = self._call_order
        if order and order[0] == fields.get("call_id"):
            order.popleft()
            sent, self._call_sent = self._call_sent, None
            if sent is not None:
                sent.set()

    # ---- events ----

    def put(self, kind: Callable[..., m.Event], /, **fields: Any) -> None:
        """Put an event now, past the sink's bound: for events the game must get even from a
        turn that is ending (terminal, withdrawn, the end of a call it saw requested)."""
        self.sink.put(kind(npc_id=self.npc_id, turn_id=self.id, seq=self.next_seq(), **fields))
        if self._call_order:
            self._call_done(fields)

    async def emit(self, kind: Callable[..., m.Event], /, **fields: Any) -> None:
        if self._call_order:
            await self._call_turn(fields)
        await self.sink.wait_room()
        # No checkpoint from here to put: a cancelled wait never consumes a seq.
        self.sink.put(kind(npc_id=self.npc_id, turn_id=self.id, seq=self.next_seq(), **fields))
        if self._call_order:
            self._call_done(fields)

    async def emit_owed(self, kind: Callable[..., m.Event], /, **fields: Any) -> None:
        """An event the game is owed (the end of a call it saw requested): waits for room,
        but if the turn is cancelled meanwhile, puts it anyway before ending."""
        try:
            if self._call_order:
                await self._call_turn(fields)
            await self.sink.wait_room()
        except trio.Cancelled:
            self.put(kind, **fields)
            raise
        self.put(kind, **fields)

    def put_failed(self, err: BridgeError) -> None:
        self.put(m.TurnFailed, error=m.ErrorInfo(**err.to_event()))

    def put_completed(self, progress: TurnProgress, text: str, answer: Any, finish: str, revision: int) -> None:
        """The turn's end: ``completed`` and its terminal event (the caller commits first)."""
        self.move("completed")
        self.put(
            m.TurnCompleted,
            text=text,
            json=answer,
            tool_calls=progress.records,
            usage=progress.usage,
            steps=progress.step,
            finish_reason=finish,
            warnings=progress.warnings,
            world_revision=revision,
            routing=progress.routing,
        )


async def stream_step(
    turn: Turn, engine: Engine, req: StepRequest, progress: TurnProgress
) -> tuple[str, list[ToolCall], str]:
    """Run one model step, streaming its text to the game: (text, tool calls, finish
    reason). On a step after a tool round the first delta replaces what was shown. Usage
    and the engine's warnings go into ``progress``."""
    text = ""
    calls: list[ToolCall] = []
    finish = "stop"
    n_chunks = 0
    reset = req.step_index > 0
    full_text = turn.params.full_text
    # aclosing: a cancelled step closes the engine's generator at once, so an engine
    # can stop its worker thread instead of waiting for garbage collection.
    async with aclosing(engine.stream_step(req)) as stream:  # type: ignore[type-var]
        async for chunk in stream:
            n_chunks += 1
            if n_chunks % 32 == 0:
                await trio.lowlevel.checkpoint()  # let other NPCs and the reader run
            if isinstance(chunk, TextChunk):
                text += chunk.delta
                so_far = text if full_text else None
                # ``emit`` written out (one event per chunk, the hot path): room first,
                # then the seq and ``put`` with no checkpoint between.
                await turn.sink.wait_room()
                ev: m.Event
                if req.schema is not None:
                    ev = m.PartialJson(
                        npc_id=turn.npc_id, turn_id=turn.id, seq=turn.next_seq(), json=so_far, delta=chunk.delta
                    )
                else:
                    ev = m.TextDelta(
                        npc_id=turn.npc_id,
                        turn_id=turn.id,
                        seq=turn.next_seq(),
                        delta=chunk.delta,
                        text=so_far,
                        is_reset=reset,
                    )
                    reset = False
                turn.sink.put(ev)
                turn.shown = True
            elif isinstance(chunk, ToolCallsChunk):
                calls.extend(chunk.calls)
            else:
                progress.usage.add(chunk.usage)
                finish = chunk.finish_reason
                progress.warnings.extend(w for w in chunk.warnings if w not in progress.warnings)
    return text, calls, finish


# ---- running a turn ----


async def run_turn(npc: Npc, turn: Turn) -> None:
    """Run a turn its NPC's worker took off the queue, to exactly one terminal event."""
    turn.move("running")
    error: BridgeError | None = None
    try:
        with turn.scope:
            try:
                await turn.emit(m.TurnStarted, prompt=turn.params.prompt, speaker=turn.speaker, kind=turn.kind)
                if turn.kind == "prewarm":
                    await _prewarm(npc, turn)
                else:
                    await _steps(npc, turn)
                return
            except BridgeError as e:
                error = e
            except Exception as e:  # our bug or an engine's: logged, reported, never a crash
                log.exception("turn %s failed", turn.id)
                error = BridgeError("internal_error", f"internal error: {type(e).__name__}")
    except BaseException:
        # Cancelled from outside the turn (the host is going away): still one terminal event.
        if turn.state in ("running", "awaiting_tool"):
            turn.move("cancelled")
            turn.put_failed(BridgeError("cancelled", "turn cancelled"))
        raise
    # History is untouched: the turn's messages were never committed (rollback).
    if error is None:
        turn.move("cancelled")
        error = BridgeError("cancelled", "turn cancelled")
    else:
        turn.move("failed")
    turn.put_failed(error)


async def _steps(npc: Npc, turn: Turn) -> None:
    p = turn.params
    working = list(turn.resume) if turn.resume else [Message(role="user", content=p.prompt, name=turn.speaker)]
    progress = TurnProgress(working, await npc.window.messages_tokens(working), schema=p.schema)
    if not turn.resume or all(msg.role == "user" for msg in turn.resume):  # not mid-turn (a host's resume)
        await _route(npc, p, progress)
    while True:
        # The world as this step sees it: a change after this line applies from the next step.
        view = npc.view()
        req, dropped, prompt = await _request(npc, p, progress, view)
        if dropped > progress.announced_drop:
            progress.announced_drop = dropped
            await turn.emit(
                m.ContextTrimmed,
                dropped_turns=dropped,
                kept_turns=len(npc.turns) - dropped,
                prompt_tokens=prompt,
                context_size=npc.engine.context_size,
            )
        try:
            text, calls, finish = await stream_step(turn, npc.engine, req, progress)
        except BridgeError as e:
            action = guardrail_action(e, p, progress)
            if action == "retry":
                continue
            line = npc.fallback_line(e.code) if action == "fallback" else None
            if line is None:
                raise
            await _finish_with_line(turn, line, progress, view)
            return
        progress.step += 1
        outcome, calls = judge_step(calls, req.tool_mode, req.tools, progress)
        calls = pin_arguments(calls, req.step_index, req.tools, p, progress)
        if outcome == "answer":
            await _finish(npc, turn, progress, view, text, finish)
            return
        if outcome == "calls" and not await _tool_round(npc, turn, progress, view, req.tools, text, calls):
            return


def _policy(npc: Npc, p: m.RespondParams) -> Literal["model", "semantic"]:
    """The turn's routing policy (its own, else the NPC's), as the engine resolves ``auto``."""
    return resolve_policy(p.routing or npc.config.routing, weak_tool_choice(npc.engine))


async def _route(npc: Npc, p: m.RespondParams, progress: TurnProgress) -> None:
    """Who chooses the first step's tool (``progress.routing``): the model, or the bridge from
    the player's line; and under ``semantic``, the lore the line calls for (in a worker thread:
    embedding is CPU work), with the lore sentence the line opens with (``progress.lead``,
    ``lore_lead``), and the closed argument values the line means (``progress.meant``,
    ``meaning_pins``). Left as they are: no tool to choose, no argument to pin and no lore to find."""
    view = npc.view()
    lore = {k: render_value(v) for k, v in view.lore.items()} if p.prompt else {}
    facts = {k: render_value(v) for k, v in view.facts.items()} if p.prompt and p.schema is None else {}
    routed = p.tool_choice in ("auto", "tool_or_answer") and bool(npc.tools) and bool(p.prompt)
    pinnable = p.pin_arguments and bool(npc.tools) and bool(p.prompt) and p.tool_choice != "none"
    if not routed and not pinnable and not lore and not facts:
        return
    embedder = embedder_ready()
    if embedder is None and _policy(npc, p) == "semantic":
        embedder = await trio.to_thread.run_sync(default_embedder)
    reported = routed or bool(lore) or bool(facts)  # turn/completed's routing: else null
    if embedder is None or _policy(npc, p) == "model":
        progress.routing = m.RoutingInfo(policy="model") if reported else None
        return
    got, found, lead, meant = await trio.to_thread.run_sync(
        _route_and_retrieve,
        embedder,
        list(npc.tools.values()) if routed else [],
        list(npc.tools.values()) if pinnable else [],
        p.prompt,
        lore,
        facts,
    )
    keys = [k for k, _ in found]
    if got is not None:
        progress.routing = m.RoutingInfo(policy="semantic", picked=got.picked, score=got.score, lore=keys)
    elif reported:
        progress.routing = m.RoutingInfo(policy="semantic", lore=keys)
    progress.lead, progress.meant, progress.weak = lead, meant, True


def _route_and_retrieve(
    embedder: Embedder,
    tools: list[ToolSpec],
    pinnable: list[ToolSpec],
    line: str,
    lore: dict[str, str],
    facts: dict[str, str],
) -> tuple[Route | None, list[tuple[str, float]], str | None, dict[str, dict[str, str]]]:
    """In a worker thread: the first step's tool among ``tools`` (None: none to choose), the
    lore entries (among what the NPC sees) most similar to the line, the sentence the line
    opens with (``lore_lead``): of that lore, else of the NPC's facts (the storm, asked about
    the weather), and the closed argument values of ``pinnable`` the line means."""
    found = retrieve_lore(embedder, lore, line)
    lead = lore_lead(embedder, lore, line, found)
    if lead is None and facts:
        lead = lore_lead(embedder, facts, line, retrieve_lore(embedder, facts, line, max_entries=1))
    meant = meaning_pins(embedder, pinnable, line) if pinnable else {}
    return (route(embedder, tools, line) if tools else None), found, lead, meant


async def _request(npc: Npc, p: m.RespondParams, progress: TurnProgress, view: View) -> tuple[StepRequest, int, int]:
    """The next step's request, steered and trimmed to the window: (request, turns left
    out of the window, the prompt's tokens)."""
    routed = progress.routing
    semantic = routed is not None and routed.policy == "semantic"
    # Under semantic routing the lore the line calls for is in the instructions, not behind
    # recall; a game that names recall as the tool choice still gets it.
    instructions = with_facts(npc.instructions, view, routed.lore if routed is not None else ())
    named_recall = isinstance(p.tool_choice, m.NamedTool) and p.tool_choice.tool == RECALL
    tools, mode = steer(p, progress, offered_tools(npc.tools.values(), view, recall=named_recall or not semantic))
    fixed = await npc.window.base_tokens(instructions, tools) + progress.working_tokens
    budget = npc.budget()
    dropped, visible = await npc.window.fit_counted(fixed, budget)
    check_fits(fixed, visible, budget, npc.engine.context_size)
    # From the window above to the request: no checkpoint (the history may not move).
    req = StepRequest(
        npc_id=npc.npc_id,
        instructions=instructions,
        messages=npc.window.messages_from(dropped) + progress.working,
        tools=tools,
        tool_mode=mode,
        schema=progress.schema,
        options=npc.config.options,
        step_index=progress.step,
        speaker=npc.config.persona.name if npc.config.persona else None,
        max_calls=call_room(p, progress) if tools else None,
        pinned=step_pins(p, progress, tools),
        # the lore sentence the line opens with: on a step that speaks before any tool round
        lead=progress.lead if progress.rounds == 0 and mode == "disallowed" and progress.schema is None else None,
    )
    return req, dropped, fixed + visible


async def _tool_round(
    npc: Npc, turn: Turn, progress: TurnProgress, view: View, tools: list[ToolSpec], text: str, calls: list[ToolCall]
) -> bool:
    """Run a step's calls and add the round to the turn's messages. False: the turn ended
    instead, its calls handed back to the host (``return_calls``)."""
    p = turn.params
    problems = npc.check_calls(calls, p, progress, {t.name: t for t in tools}, view)
    if turn.return_calls and hand_back(calls, problems, progress):
        await trio.lowlevel.checkpoint_if_cancelled()
        turn.put_completed(progress, text, None, "tool_calls", view.revision)
        return False
    # The game runs the calls, or every call was refused: either way each gets its output here,
    # and each call's first event goes out in the model's order (a call repeating an earlier
    # one's id has none).
    progress.rounds += 1
    turn.move("awaiting_tool")
    turn.in_call_order([c.id for c, again in zip(calls, repeats(calls), strict=True) if not again])
    try:
        results = await npc.run_calls(turn, calls, problems, p.tool_timeout_ms, view)
    finally:
        turn.in_call_order([])
    turn.move("running")
    progress.calls_made += len(calls)
    new = round_messages(text, calls, results, progress)
    progress.working.extend(new)
    progress.working_tokens += await npc.window.messages_tokens(new)
    return True


async def _finish(npc: Npc, turn: Turn, progress: TurnProgress, view: View, text: str, finish: str) -> None:
    answer = None if progress.schema is None else structured_answer(text, progress.schema, finish)
    final = Message(role="assistant", content=text)
    progress.working.append(final)
    tokens = progress.working_tokens + await npc.window.messages_tokens([final])
    # A cancel that arrived while this task was already scheduled ends the turn here:
    # the commit below has no checkpoint, so it is all or nothing.
    await trio.lowlevel.checkpoint_if_cancelled()
    # Commit: the one place history changes. Nothing before this point is kept on failure.
    if turn.remember:
        npc.window.commit(progress.working, tokens)
    turn.put_completed(progress, text, answer, finish_reason(finish, progress), view.revision)


async def _finish_with_line(turn: Turn, line: str, progress: TurnProgress, view: View) -> None:
    """End the turn with a fallback line: streamed as one delta, not committed (the words
    that tripped the guardrail stay out of the history, so they cannot trip the next turn)."""
    progress.step += 1  # the step that tripped the guardrail ran
    full = line if turn.params.full_text else None
    await turn.emit(m.TextDelta, delta=line, text=full, is_reset=turn.shown)
    await trio.lowlevel.checkpoint_if_cancelled()
    turn.put_completed(progress, line, None, "fallback", view.revision)


async def _prewarm(npc: Npc, turn: Turn) -> None:
    """``npc/prewarm``: hand the engine the step the NPC would run now, to prepare."""
    view = npc.view()
    progress = TurnProgress([])
    # The turn it prepares for shows what its policy shows: under semantic routing no recall, and
    # words only until a line picks a tool (the common case: most lines are talk).
    if _policy(npc, turn.params) == "semantic":
        progress.routing = m.RoutingInfo(policy="semantic")
    req, _, _ = await _request(npc, turn.params, progress, view)
    if turn.params.prompt or turn.speaker:  # the next line's lead-in, as the model will read it
        lead = user_text(Message(role="user", content=turn.params.prompt, name=turn.speaker))
        req = msgspec.structs.replace(req, prompt_prefix=lead)
    usage = await npc.engine.prewarm(req) if isinstance(npc.engine, Prewarmable) else Usage()
    await trio.lowlevel.checkpoint_if_cancelled()
    turn.put_completed(TurnProgress([], usage=usage), "", None, "prewarmed", view.revision)
