"""The service layer: the NPC registry and every operation, with typed params and typed
results. No JSON-RPC and no I/O: the JSON-RPC bridge, and any other host (the in-process
API, a CLI, an HTTP server), calls this and only this.

Events leave through an ``EventSink`` the host supplies. Without one, the service keeps each
turn's events for ``Service.events(turn_id)``, which is how Python code uses it in process::

    async with Service.running(EngineRegistry(default="scripted")) as svc:
        await svc.create(NpcConfig(npc_id="keeper", instructions="Be brief."))
        turn = svc.respond(RespondParams(npc_id="keeper", prompt="Any ale?"))
        async for event in svc.events(turn.turn_id):
            ...

Every operation either succeeds or changes nothing: they validate and build first and
replace last (a failed ``restore`` leaves the NPC it would have replaced as it was).
Operations that may take milliseconds or more (starting an engine, counting tokens on a
model) are ``async`` and run that work off the event loop.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import msgspec
import trio

from bridge._version import __version__
from bridge.core import _messages as m
from bridge.core._world import RECALL, RESERVED_TOOL_NAMES, World
from bridge.core.agent import EventSink, Npc, check_schema, count_text_tokens
from bridge.core.agent._routing import resolve_policy
from bridge.core.agent._routing import warm as warm_routing
from bridge.engines import EngineRegistry
from bridge.engines.base import Engine, Message, Scriptable, TextCounter, counts_block, weak_tool_choice
from bridge.engines.scripted import validate_script
from bridge.errors import BridgeError

log = logging.getLogger("oam_bridge.service")

MAX_MODEL_BYTES = 4096  # npc/create's model: a path (PATH_MAX on Linux) or a catalog name


async def _count_text(engine: Engine, text: str) -> int:
    """Tokens of ``text`` alone, with no chat template or message framing around it (``""`` is
    0): the engine's ``count_text`` (off the event loop unless the engine's counts are cheap),
    else the cost of ``text`` as a user message, for an engine without one."""
    if not isinstance(engine, TextCounter):
        return await count_text_tokens(engine, text)
    if not counts_block(engine):
        return engine.count_text(text)
    return await trio.to_thread.run_sync(engine.count_text, text)


def _npc_idle(npc: Npc) -> bool:
    return npc.current is None and not npc.queued


class TurnEvents:
    """The default sink: keeps each turn's events until ``Service.events`` takes them.

    Bounded like the wire: past ``max_bytes`` of untaken events (approximated by the length
    of their text fields), ``wait_room`` waits, so a reader that stops reading slows its turns
    down instead of growing memory."""

    def __init__(self, max_events: int = 65536) -> None:
        self._queues: dict[str, deque[m.Event]] = {}
        self._wakeups: dict[str, trio.Event] = {}
        self._room = trio.Event()
        self._room.set()
        self._count = 0
        self._max = max_events
        self._dropped: set[str] = set()  # turns whose reader left before their terminal event

    async def wait_room(self) -> None:
        while self._count >= self._max:
            self._room = trio.Event() if self._room.is_set() else self._room
            await self._room.wait()
        # a turn cancelled since its last checkpoint stops here, before its next event
        await trio.lowlevel.checkpoint_if_cancelled()

    def put(self, event: m.Event) -> None:
        if self._dropped and event.turn_id in self._dropped:
            if isinstance(event, (m.TurnCompleted, m.TurnFailed)):
                self._dropped.discard(event.turn_id)
            return
        self._queues.setdefault(event.turn_id, deque()).append(event)
        self._count += 1
        w = self._wakeups.pop(event.turn_id, None)
        if w is not None:
            w.set()

    def drop(self, turn_id: str) -> None:
        """Stop keeping ``turn_id``'s events: their reader left before the terminal event
        (an HTTP client that went away). What is kept is freed, and the turn's later events,
        up to its terminal event, are not kept: untaken events would otherwise hold the
        shared bound (``max_events``) for ever. Only for a turn whose terminal event the
        caller has not taken."""
        self._wakeups.pop(turn_id, None)
        q = self._queues.pop(turn_id, None)
        if q:
            self._count -= len(q)
            self._room.set()
            if isinstance(q[-1], (m.TurnCompleted, m.TurnFailed)):
                return  # the turn had ended: nothing more will come
        self._dropped.add(turn_id)

    async def take(self, turn_id: str) -> AsyncIterator[m.Event]:
        while True:
            q = self._queues.setdefault(turn_id, deque())
            while q:
                ev = q.popleft()
                self._count -= 1
                self._room.set()
                yield ev
                if isinstance(ev, (m.TurnCompleted, m.TurnFailed)):
                    self._queues.pop(turn_id, None)
                    return
            w = self._wakeups.setdefault(turn_id, trio.Event())
            await w.wait()


class Service:
    """NPCs and their operations. Run it with ``Service.running`` (or ``run``) so NPC workers
    have a nursery."""

    def __init__(
        self, registry: EngineRegistry | None = None, limits: m.Limits | None = None, sink: EventSink | None = None
    ) -> None:
        self.registry = registry or EngineRegistry(default="scripted")
        self.limits = limits or m.Limits()
        self._turn_events = TurnEvents() if sink is None else None
        self.sink: EventSink = sink if sink is not None else self._turn_events  # type: ignore[assignment]
        self.npcs: dict[str, Npc] = {}
        self.world = World(self.limits)
        # deleted and replaced NPCs whose turns may not all have ended: they still end (and
        # send their terminal events) after the NPC left ``npcs``. Pruned as NPCs are added
        # and by ``idle``; a set rather than a task wrapping every worker, which cost each
        # NPC a coroutine of idle memory.
        self._retired: set[Npc] = set()
        self._closing = False
        self._nursery: trio.Nursery | None = None

    # ---- running ----

    @classmethod
    @asynccontextmanager
    async def running(
        cls, registry: EngineRegistry | None = None, limits: m.Limits | None = None, sink: EventSink | None = None
    ) -> AsyncIterator[Service]:
        """A service whose NPC workers run in a nursery of their own; on exit every turn is
        ended (``turn_ended``) and the engines are closed."""
        svc = cls(registry, limits, sink)
        async with trio.open_nursery() as nursery:
            svc._nursery = nursery
            try:
                yield svc
            finally:
                svc.close_all("turn_ended")
                with trio.move_on_after(svc.limits.exit_grace_ms / 2000):
                    await svc.wait_idle()
                nursery.cancel_scope.cancel()
        with trio.CancelScope(shield=True):
            await svc.registry.aclose()

    def attach(self, nursery: trio.Nursery) -> None:
        """Use ``nursery`` for the NPC workers (a host that manages its own task tree)."""
        self._nursery = nursery

    def close_all(self, reason: str = "turn_ended") -> None:
        """End every NPC's turns (each still gets its terminal event) and accept no new NPCs
        or turns from now on (``shutting_down``): the host is going away."""
        self._closing = True
        for npc in self.npcs.values():
            npc.close(reason)

    def cancel_all(self, reason: str = "turn_ended") -> None:
        for npc in self.npcs.values():
            npc.cancel(reason)

    def idle(self) -> bool:
        """No turn runs or waits, in any NPC (deleted and replaced NPCs included, until they
        have ended their turns)."""
        self._prune_retired()
        return not self._retired and all(_npc_idle(n) for n in self.npcs.values())

    async def wait_idle(self) -> None:
        while not self.idle():
            await trio.sleep(0.005)

    def events(self, turn_id: str) -> AsyncIterator[m.Event]:
        """A turn's events, ending with its terminal event (only without a host sink)."""
        if self._turn_events is None:
            raise RuntimeError("this service sends its events to a host sink")
        return self._turn_events.take(turn_id)

    def drop_events(self, turn_id: str) -> None:
        """The reader of ``events(turn_id)`` left before the terminal event: see
        ``TurnEvents.drop`` (only without a host sink)."""
        if self._turn_events is None:
            raise RuntimeError("this service sends its events to a host sink")
        self._turn_events.drop(turn_id)

    # ---- operations ----

    def initialize(self, p: m.InitializeParams) -> m.InitializeResult:
        if p.protocol_version not in m.SUPPORTED_PROTOCOL_VERSIONS:
            raise BridgeError(
                "invalid_params",
                f"protocol version {p.protocol_version} is not supported",
                reason="unsupported_protocol_version",
                supported=list(m.SUPPORTED_PROTOCOL_VERSIONS),
            )
        return m.InitializeResult(
            protocol_version=m.PROTOCOL_VERSION,
            server_info=m.ServerInfo(name="oam-bridge", version=__version__),
            capabilities=m.Capabilities(),
            engines=self.registry.infos(),
            default_engine=self.registry.default,
            limits=self.limits,
        )

    async def _engine_for(self, config: m.NpcConfig) -> tuple[str, Engine]:
        """The engine ``config`` names, started off the loop if it is not running yet."""
        name = self.registry.resolve(config.engine)
        if config.model is not None and name not in ("llama", "native"):
            raise BridgeError("invalid_params", f"model is for the llama and native engines, not {name!r}")
        if self.registry.started(name, config.model):
            return name, self.registry.get(name, model=config.model)
        engine = await trio.to_thread.run_sync(self.registry.get, name, config.model, abandon_on_cancel=True)
        return name, engine

    def _check_config(self, config: m.NpcConfig) -> None:
        if not config.npc_id:
            raise BridgeError("invalid_params", "npcId must not be empty")
        model = config.model
        if model is not None and (not model or "\0" in model or len(model.encode()) > MAX_MODEL_BYTES):
            raise BridgeError(
                "invalid_params", f"model must be a file path or a catalog name: 1 to {MAX_MODEL_BYTES} bytes, no NUL"
            )
        names = [t.name for t in config.tools]
        if len(set(names)) != len(names):
            raise BridgeError("invalid_params", "tool names must be unique")
        reserved = RESERVED_TOOL_NAMES.intersection(names)
        if reserved:
            raise BridgeError(
                "invalid_params", f"tool name {min(reserved)!r} is the bridge's own", reason="reserved_tool_name"
            )
        for t in config.tools:
            check_schema(t.parameters, f"parameters of tool {t.name!r}", tool=True)

    async def _build(self, config: m.NpcConfig, turns: list[list[Message]] | None) -> Npc:
        """A new NPC, not yet registered: everything that can fail happens here. Checking
        the tools' schemas and the script takes about half a millisecond per schema property:
        a large one would stall every NPC's stream, so the checks run in a worker thread."""
        await trio.to_thread.run_sync(self._check_config, config)
        engine_name, engine = await self._engine_for(config)
        if config.script is not None:
            if not isinstance(engine, Scriptable):
                raise BridgeError("invalid_params", f"script is only for scripted engines, not {engine_name!r}")
            await trio.to_thread.run_sync(validate_script, config.script)
        if config.tools and resolve_policy(config.routing, weak_tool_choice(engine)) == "semantic":
            await trio.to_thread.run_sync(warm_routing, config.tools)  # embeds the tools once
        npc = Npc(config, engine, engine_name, self.sink, self.limits.max_queued_turns_per_npc, self.world)
        if turns:
            npc.set_history([list(t) for t in turns])
        return npc

    def _register(self, npc: Npc) -> None:
        npc_id = npc.config.npc_id
        if npc.config.script is not None:
            assert isinstance(npc.engine, Scriptable), "_build refuses a script for this engine"
            npc.engine.set_script(npc_id, npc.config.script)
        self.npcs[npc_id] = npc
        assert self._nursery is not None, "the service is not running"
        self._nursery.start_soon(npc.worker)

    def _retire(self, npc: Npc) -> None:
        """``npc`` leaves: its turns end, each with its terminal event, and it takes no more."""
        npc.close("turn_ended")
        npc.engine.forget(npc.npc_id)
        self._prune_retired()
        self._retired.add(npc)

    def _prune_retired(self) -> None:
        # A retired NPC is closed: once idle it takes no turn again.
        if self._retired:
            self._retired = {n for n in self._retired if not _npc_idle(n)}

    def _check_open(self) -> None:
        if self._closing:
            raise BridgeError("shutting_down", "the bridge is shutting down")

    def _check_room(self, npc_id: str) -> None:
        if npc_id not in self.npcs and len(self.npcs) >= self.limits.max_npcs:
            raise BridgeError("limit_reached", f"at most {self.limits.max_npcs} npcs", limit="maxNpcs")

    async def create(self, config: m.NpcConfig) -> m.CreateResult:
        self._check_open()
        if config.npc_id in self.npcs:
            raise BridgeError("npc_exists", f"npc {config.npc_id!r} already exists", npcId=config.npc_id)
        self._check_room(config.npc_id)
        npc = await self._build(config, None)
        self._check_open()  # the host began closing while the engine started
        if config.npc_id in self.npcs:  # created while the engine started
            raise BridgeError("npc_exists", f"npc {config.npc_id!r} already exists", npcId=config.npc_id)
        self._register(npc)
        return m.CreateResult(npc_id=config.npc_id, engine=npc.engine_name, context_size=npc.engine.context_size)

    async def restore(self, p: m.RestoreParams) -> m.RestoreResult:
        self._check_open()
        if p.save.version != 1:
            raise BridgeError("invalid_params", f"unsupported save version {p.save.version}")
        config = p.save.config
        if p.npc_id is not None:
            config = msgspec.structs.replace(config, npc_id=p.npc_id)
        self._check_room(config.npc_id)
        npc = await self._build(config, p.save.turns)
        self._check_open()
        old = self.npcs.pop(config.npc_id, None)
        if old is not None:
            self._retire(old)
        self._register(npc)
        return m.RestoreResult(npc_id=config.npc_id, turns=len(p.save.turns))

    def npc(self, npc_id: str) -> Npc:
        npc = self.npcs.get(npc_id)
        if npc is None:
            raise BridgeError("unknown_npc", f"no npc {npc_id!r}", npcId=npc_id)
        return npc

    def respond(
        self, p: m.RespondParams, *, resume: list[Message] | None = None, return_calls: bool = False
    ) -> m.RespondResult:
        """Queue a turn. ``resume`` and ``return_calls`` (not on the wire) are for hosts that
        rebuild the transcript on every request and run no turn across a tool call (the
        OpenAI-compatible server): see ``Npc.enqueue``."""
        self._check_open()
        npc = self.npc(p.npc_id)
        has_recall = npc.view().recall_tool is not None
        if (
            isinstance(p.tool_choice, m.NamedTool)
            and p.tool_choice.tool not in npc.tools
            and not (p.tool_choice.tool == RECALL and has_recall)
        ):
            raise BridgeError("invalid_params", f"toolChoice names unknown tool {p.tool_choice.tool!r}")
        if p.tool_choice == "required" and not npc.tools and not has_recall:
            raise BridgeError("invalid_params", "toolChoice required, but the npc has no tools")
        if p.schema is not None:
            check_schema(p.schema, "schema")
        turn = npc.enqueue(p, "respond", self._speaker_name(p.speaker), resume=resume, return_calls=return_calls)
        return m.RespondResult(npc_id=p.npc_id, turn_id=turn.id)

    def _speaker_name(self, speaker: str | None) -> str | None:
        """Who says a prompt: another NPC's id stands for its persona's name (its id without
        one); any other string is a name as it is; None is the player."""
        if speaker is None:
            return None
        other = self.npcs.get(speaker)
        if other is not None:
            return other.config.persona.name if other.config.persona is not None else other.npc_id
        return speaker

    async def decide(self, p: m.DecideParams) -> m.RespondResult:
        """A decision turn: the NPC picks one of ``p.options`` (see ``_decision``). The
        options' schemas are checked in a worker thread, like tool schemas at create."""
        self._check_open()
        self.npc(p.npc_id)
        params = await trio.to_thread.run_sync(_decision, p)
        self._check_open()
        turn = self.npc(p.npc_id).enqueue(params, "decide", None, remember=p.remember)
        return m.RespondResult(npc_id=p.npc_id, turn_id=turn.id)

    def prewarm(self, p: m.PrewarmParams) -> m.RespondResult:
        self._check_open()
        # the prompt is the next line's start, never a line: no argument is taken from it
        params = m.RespondParams(npc_id=p.npc_id, prompt=p.prompt_prefix, speaker=p.speaker, pin_arguments=False)
        turn = self.npc(p.npc_id).enqueue(params, "prewarm", self._speaker_name(p.speaker), remember=False)
        return m.RespondResult(npc_id=p.npc_id, turn_id=turn.id)

    def set_tags(self, p: m.SetTagsParams) -> m.EmptyResult:
        self.npc(p.npc_id).set_tags(p.tags)
        return m.EmptyResult()

    # ---- the world ----

    def world_set(self, p: m.WorldSetParams) -> m.WorldRevision:
        return m.WorldRevision(revision=self.world.set(p))

    def world_delete(self, p: m.WorldKey) -> m.WorldDeleteResult:
        revision, deleted = self.world.delete(p.key)
        return m.WorldDeleteResult(revision=revision, deleted=deleted)

    def world_get(self, p: m.WorldGetParams) -> m.WorldGetResult:
        if p.npc_id is None:
            facts = self.world.facts()
        else:
            npc = self.npc(p.npc_id)
            facts = self.world.facts(npc.npc_id, npc.tags)
        return m.WorldGetResult(revision=self.world.revision, facts=facts)

    def submit(self, p: m.SubmitParams) -> m.SubmitResult:
        self.npc(p.npc_id).submit(p)
        return m.SubmitResult(accepted=True)

    def cancel(self, p: m.NpcRef) -> m.CancelResult:
        return m.CancelResult(cancelled=self.npc(p.npc_id).cancel())

    def transcript(self, p: m.NpcRef) -> m.Save:
        npc = self.npc(p.npc_id)
        return m.Save(version=1, config=npc.config, turns=npc.turns)

    def reset(self, p: m.NpcRef) -> m.EmptyResult:
        self.npc(p.npc_id).reset()
        return m.EmptyResult()

    def delete(self, p: m.NpcRef) -> m.EmptyResult:
        npc = self.npc(p.npc_id)
        del self.npcs[p.npc_id]
        self._retire(npc)
        return m.EmptyResult()

    def list(self) -> m.NpcListResult:
        return m.NpcListResult(
            npcs=[
                m.NpcSummary(
                    npc_id=k, engine=n.engine_name, turns=len(n.turns), busy=n.current is not None, queued=len(n.queued)
                )
                for k, n in self.npcs.items()
            ]
        )

    async def count_tokens(self, p: m.CountTokensParams) -> m.CountTokensResult:
        prompt: int | None = None
        if p.npc_id is not None:
            npc = self.npc(p.npc_id)
            engine = npc.engine
            prompt = await npc.prompt_tokens()
        else:
            name = self.registry.resolve(p.engine or "auto")
            if self.registry.started(name):
                engine = self.registry.get(name)
            else:
                engine = await trio.to_thread.run_sync(self.registry.get, name, None, abandon_on_cancel=True)
        tokens = await _count_text(engine, p.text)
        return m.CountTokensResult(tokens=tokens, prompt_tokens=prompt, context_size=engine.context_size)

    def engine_status(self) -> m.EngineStatusResult:
        return m.EngineStatusResult(engines=self.registry.infos(), default_engine=self.registry.default)


def decision_prompt(p: m.DecideParams) -> str:
    """What the model reads for a decision: the situation, then one line per option."""
    lines = [p.situation.strip(), "", "Choose one option:"]
    lines += [f"- {o.name}: {o.description}" if o.description else f"- {o.name}" for o in p.options]
    return "\n".join(lines)


# "x-oam-prose": a hint for the llama grammar (a sentence of words; see its _grammar.py),
# ignored by validation and by the other engines.
REASONING_FIELD = {
    "type": "string",
    "description": "why, in one short sentence, before choosing",
    "x-oam-prose": "reason",
}


def decision_schema(p: m.DecideParams) -> dict[str, Any]:
    """The answer's schema: ``reasoning`` (when asked for) before ``choice``, so the model
    reasons first; options with ``parameters`` add ``arguments``, one ``anyOf`` member each
    (the options without share one member, an ``enum``)."""

    def member(choice: dict[str, Any], arguments: dict[str, Any] | None) -> dict[str, Any]:
        props: dict[str, Any] = {"reasoning": REASONING_FIELD} if p.reasoning else {}
        props["choice"] = choice
        if arguments is not None:
            props["arguments"] = arguments
        return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}

    plain = [o.name for o in p.options if o.parameters is None]
    with_args = [o for o in p.options if o.parameters is not None]
    members = [member({"type": "string", "enum": plain, "description": "the option's name"}, None)] if plain else []
    members += [
        member({"type": "string", "const": o.name, "description": "the option's name"}, o.parameters) for o in with_args
    ]
    return members[0] if len(members) == 1 else {"anyOf": members}


def _decision(p: m.DecideParams) -> m.RespondParams:
    names = [o.name for o in p.options]
    if len(set(names)) != len(names):
        raise BridgeError("invalid_params", "option names must be unique")
    for o in p.options:
        if o.parameters is not None:
            check_schema(o.parameters, f"parameters of option {o.name!r}", tool=True)
    return m.RespondParams(
        npc_id=p.npc_id,
        prompt=decision_prompt(p),
        tool_choice="none",
        max_tool_rounds=0,
        max_tool_calls=0,
        schema=decision_schema(p),
    )


__all__ = ["Service", "TurnEvents", "decision_prompt", "decision_schema"]
