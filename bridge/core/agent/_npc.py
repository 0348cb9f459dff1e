"""One agent per NPC: the turn queue, per-step steering, the tool runtime, trimming and
rollback, and the one engine contract. Engines only run single steps (see ``engines.base``);
every rule lives here once.

Turn state machine (a table, illegal moves raise ``StateError``)::

    queued -> running -> awaiting_tool -> running -> completed | failed | cancelled

Events leave through an ``EventSink`` (the service's). Every turn's events carry a ``seq``
that is gap-free from 0, and every accepted turn ends with exactly one terminal event, even
when it is cancelled while the sink is full: ``_emit`` waits for room *before* it takes a
seq, with no checkpoint between taking it and ``put``, and terminal events and
``turn/toolCallWithdrawn`` are put without waiting (the sink takes them past its bound).

The engine contract (every engine gets the same treatment, whatever it produced):

- tool calls on a step whose mode is ``disallowed`` are ignored with a warning in
  ``turn/completed``, and the turn completes with the step's text;
- a ``required`` (or named) step answered without a tool call fails the turn with
  ``generation_failed`` (retryable);
- a call to a tool not shown on that step gets an error output the model sees, and the turn
  goes on;
- a structured answer that is not valid JSON fails with ``generation_failed``, saying so when
  the step was cut off by ``maxTokens`` (finish reason ``length``);
- engines never re-filter: they get the tools and the mode to use.
"""

from __future__ import annotations

import itertools
import logging
import math
import uuid
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from contextlib import aclosing
from typing import Any, Literal, Protocol

import jsonschema
import msgspec
import referencing
import referencing.exceptions
import referencing.jsonschema
import trio

from bridge.core import _messages as m
from bridge.core._world import EMPTY_VIEW, RECALL, RESPOND_DIRECTLY, RESPOND_DIRECTLY_TOOL, View, World, render_value
from bridge.engines.base import Engine, Message, StepRequest, TextChunk, ToolCall, ToolCallsChunk, ToolMode, ToolSpec, Usage
from bridge.errors import BridgeError

log = logging.getLogger("oam_bridge.agent")

WithdrawReason = Literal["cancelled", "timeout", "turn_ended"]

TURN_TRANSITIONS: dict[str, frozenset[str]] = {
    "queued": frozenset({"running", "cancelled"}),
    "running": frozenset({"awaiting_tool", "completed", "failed", "cancelled"}),
    "awaiting_tool": frozenset({"running", "failed", "cancelled"}),
    "completed": frozenset(),
    "failed": frozenset(),
    "cancelled": frozenset(),
}

# How many restored turns one lazy count covers (one worker-thread hop for slow engines).
COUNT_CHUNK = 64
NO_TAGS: frozenset[str] = frozenset()  # shared: an empty frozenset is not a singleton (216 bytes each)
# Step failures a turn's ``guardrail`` policy may turn into a fallback line or a retry.
GUARDRAIL_CODES = frozenset({"guardrail_violation", "refusal"})
FALLBACK_FIELDS = {"guardrail_violation": "guardrail_violation", "refusal": "refusal"}


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


# ---- schemas ----

# Keywords whose values are data, not schemas: a "$ref" inside them is not a reference.
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})
# Keywords whose values map names (not keywords) to schemas.
_NAMED_SCHEMAS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
# Keywords whose subschemas apply to the same instance: a cycle through these (and "$ref")
# never consumes the instance, so validating it would recurse forever.
_SAME_INSTANCE_LISTS = ("allOf", "anyOf", "oneOf")
_SAME_INSTANCE_ONE = ("not", "if", "then", "else")


def _validator_class(schema: dict[str, Any], what: str) -> Any:
    meta = schema.get("$schema")
    if meta is None:
        return jsonschema.Draft202012Validator
    if not isinstance(meta, str):
        raise BridgeError("invalid_schema", f"{what}: $schema must be a string naming a JSON Schema draft", path=["$schema"])
    cls = jsonschema.validators.validator_for(schema, default=None)  # type: ignore[arg-type]
    if cls is None:
        raise BridgeError("invalid_schema", f"{what}: unsupported $schema {meta[:200]!r}", path=["$schema"])
    return cls


def check_schema(schema: Any, what: str, *, tool: bool = False) -> None:
    """Raise ``invalid_schema`` unless ``schema`` is a JSON Schema the bridge can use.

    Checked: an object; ``$schema`` (if given) names a known draft; the schema is valid
    against its metaschema; every ``$ref`` is local (starts with ``#``) and resolves; no chain
    of ``$ref``/``allOf``/``anyOf``/``oneOf``/``not``/``if`` refers back to itself without
    consuming the instance. With ``tool=True`` the top level must be ``"type": "object"``
    (tool arguments are an object on the wire). Never raises anything else."""
    if not isinstance(schema, dict):
        raise BridgeError("invalid_schema", f"{what} must be a JSON Schema object")
    try:
        cls = _validator_class(schema, what)
        cls.check_schema(schema)
    except BridgeError:
        raise
    except jsonschema.SchemaError as e:
        raise BridgeError("invalid_schema", f"{what}: {e.message}", path=list(e.path)) from None
    except RecursionError:
        raise BridgeError("invalid_schema", f"{what}: nested too deeply") from None
    except Exception as e:  # a schema that breaks the checker itself is still the peer's
        raise BridgeError("invalid_schema", f"{what}: not a usable JSON Schema ({type(e).__name__})") from None
    try:
        _check_refs(schema, cls, what)
    except BridgeError:
        raise
    except RecursionError:
        raise BridgeError("invalid_schema", f"{what}: nested too deeply") from None
    except Exception as e:
        raise BridgeError("invalid_schema", f"{what}: references cannot be resolved ({type(e).__name__})") from None
    if tool and schema.get("type") != "object":
        raise BridgeError("invalid_schema", f'{what} must be an object schema ("type": "object")', path=["type"])


def _check_refs(root: dict[str, Any], cls: Any, what: str) -> None:
    dialect = cls.META_SCHEMA.get("$id") or cls.META_SCHEMA.get("id") or ""
    spec = referencing.jsonschema.specification_with(dialect.rstrip("#"), default=referencing.jsonschema.DRAFT202012)
    resource = spec.create_resource(root)
    registry: referencing.Registry[Any] = referencing.Registry().with_resource(resource.id() or "", resource).crawl()
    resolver = registry.resolver(base_uri=resource.id() or "")
    on_stack: set[int] = set()
    done: set[int] = set()

    def resolve(node: dict[str, Any], res: Any, key: str) -> tuple[Any, Any] | None:
        ref = node.get(key)
        if not isinstance(ref, str):
            return None
        if not ref.startswith("#"):
            raise BridgeError("invalid_schema", f"{what}: {key} {ref[:200]!r} is not local (only '#...' references are allowed)")
        if key != "$ref":
            return None  # dynamic references resolve at validation time; local is enough
        try:
            found = res.lookup(ref)
        except referencing.exceptions.Unresolvable:
            raise BridgeError("invalid_schema", f"{what}: $ref {ref[:200]!r} does not resolve") from None
        return found.contents, found.resolver

    def visit(node: Any, res: Any) -> None:
        """Walk every subschema; detect same-instance cycles (on_stack holds the current
        same-instance chain)."""
        if not isinstance(node, dict):
            if isinstance(node, list):
                for x in node:
                    visit(x, res)
            return
        if isinstance(node.get("$id"), str) or isinstance(node.get("id"), str):
            res = res.in_subresource(spec.create_resource(node))
        key = id(node)
        if key in on_stack:
            raise BridgeError("invalid_schema", f"{what}: a reference refers back to itself without consuming the instance")
        if key in done:
            return
        on_stack.add(key)
        try:
            for k in ("$ref", "$dynamicRef", "$recursiveRef"):
                target = resolve(node, res, k)
                if target is not None:
                    visit(target[0], target[1])
            for k in _SAME_INSTANCE_LISTS:
                if isinstance(node.get(k), list):
                    for x in node[k]:
                        visit(x, res)
            for k in _SAME_INSTANCE_ONE:
                visit(node.get(k), res)
            if isinstance(node.get("dependentSchemas"), dict):
                for x in node["dependentSchemas"].values():
                    visit(x, res)
        finally:
            on_stack.discard(key)
        done.add(key)
        # Subschemas that consume the instance (properties, items, ...): a fresh chain each.
        saved = set(on_stack)
        on_stack.clear()
        try:
            for k, v in node.items():
                if k in _DATA_KEYWORDS or k in _SAME_INSTANCE_LISTS or k in _SAME_INSTANCE_ONE or k == "dependentSchemas":
                    continue
                if k in _NAMED_SCHEMAS and isinstance(v, dict):
                    for x in v.values():
                        visit(x, res)
                elif isinstance(v, (dict, list)):
                    visit(v, res)
        finally:
            on_stack.clear()
            on_stack.update(saved)

    visit(root, resolver)


def make_validator(schema: dict[str, Any]) -> Any:
    """A validator for a schema ``check_schema`` accepted, with format checking (email,
    date, ...: the formats jsonschema can check with what is installed)."""
    cls = _validator_class(schema, "schema")
    return cls(schema, format_checker=cls.FORMAT_CHECKER)


def first_error(validator: Any, value: Any) -> str | None:
    """The message of the most relevant error of ``value`` (jsonschema's ``best_match``)."""
    error = jsonschema.exceptions.best_match(validator.iter_errors(value))
    return None if error is None else str(error.message)


def reorder_to_schema(value: Any, schema: dict[str, Any] | None) -> Any:
    """Return ``value`` with object keys in the schema's property order (extras last)."""
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict):
        props = schema.get("properties")
        if not isinstance(props, dict):
            props = {}
        out = {k: reorder_to_schema(value[k], props[k]) for k in props if k in value}
        out.update((k, v) for k, v in value.items() if k not in out)
        return out
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [reorder_to_schema(v, schema["items"]) for v in value]
    return value


def render_instructions(config: m.NpcConfig) -> str:
    """The persona in plain sentences, then the game's own instructions. The name is said
    twice on purpose: small models otherwise invent one when the player asks for it."""
    parts = []
    p = config.persona
    if p is not None:
        parts.append(f"You are {p.name}" + (f", {p.role}" if p.role else "") + f". Your name is {p.name}.")
        if p.traits:
            traits = p.traits[0] if len(p.traits) == 1 else ", ".join(p.traits[:-1]) + " and " + p.traits[-1]
            parts.append(f"You are {traits}.")
        if p.speech_style:
            parts.append("How you speak: " + p.speech_style)
        parts.append(f"Stay in character: reply with only what {p.name} says out loud, and never call yourself by another name.")
    if config.instructions:
        parts.append(config.instructions)
    return "\n".join(parts)


# ---- token counting ----


def _blocking(engine: Engine) -> bool:
    return bool(getattr(engine, "blocking_count", True))


def _count_batch(engine: Engine, jobs: Sequence[tuple[str, list[Message], list[ToolSpec]]]) -> list[int]:
    return [engine.count_tokens(i, msgs, tools) for i, msgs, tools in jobs]


async def _count(engine: Engine, jobs: Sequence[tuple[str, list[Message], list[ToolSpec]]]) -> list[int]:
    """Run ``engine.count_tokens`` on each job: inline for engines whose count is cheap,
    else in one worker-thread hop, so a model's tokenizer never runs on the event loop."""
    if not _blocking(engine):
        return _count_batch(engine, jobs)
    return await trio.to_thread.run_sync(_count_batch, engine, jobs)


async def count_text_tokens(engine: Engine, text: str) -> int:
    """Tokens ``text`` costs as a user message (what ``tokens/count`` answers)."""
    with_text, empty = await _count(engine, [("", [Message(role="user", content=text)], []), ("", [], [])])
    return max(0, with_text - empty)


# ---- turns ----


class _PendingCall:
    __slots__ = ("call", "done", "output", "error", "withdrawn")

    def __init__(self, call: ToolCall) -> None:
        self.call = call
        self.done = trio.Event()
        self.output: Any = None
        self.error: str | None = None
        self.withdrawn: WithdrawReason | None = None  # set when resolved by withdrawal


def _repeats(calls: list[ToolCall]) -> list[bool]:
    """For each call of a batch, whether an earlier call of the batch has its id."""
    seen: set[str] = set()
    out = []
    for call in calls:
        out.append(call.id in seen)
        seen.add(call.id)
    return out


class Turn:
    def __init__(
        self,
        npc: Npc,
        params: m.RespondParams,
        kind: m.TurnKind = "respond",
        speaker: str | None = None,
        remember: bool = True,
        resume: list[Message] | None = None,
        return_calls: bool = False,
    ) -> None:
        self.id = f"turn_{uuid.uuid4().hex[:12]}"
        self.npc = npc
        self.params = params
        self.kind: m.TurnKind = kind
        self.speaker = speaker  # the name the prompt is attributed to; None: the player
        self.remember = remember  # False: the turn completes but does not enter the history
        # Stateless hosts (see ``Npc.enqueue``): the turn's own messages so far, in place of
        # the prompt line, and tool calls handed back in turn/completed instead of requested.
        self.resume = resume
        self.return_calls = return_calls
        self.shown = False  # text or JSON reached the game (a fallback line then resets it)
        self.state = "queued"
        self.seq = 0
        self.scope = trio.CancelScope()
        self.end_reason: WithdrawReason = "cancelled"  # why the turn was cancelled, if it was

    def move(self, new: str) -> None:
        if new not in TURN_TRANSITIONS[self.state]:
            raise StateError(f"turn {self.id}: {self.state} -> {new}")
        self.state = new

    def next_seq(self) -> int:
        s = self.seq
        self.seq += 1
        return s


class Npc:
    """An NPC's configuration, committed history (complete turns only) and turn queue.

    Token accounting (trimming): the prompt of a step is counted as
    ``base(instructions, tools shown) + sum(tokens of each visible turn) + tokens of the
    turn's own messages so far``, where a turn's (or a batch of messages') tokens are
    ``count_tokens("", msgs, []) - count_tokens("", [], [])``. Each committed turn is counted
    once, from the messages the turn counted as it went; restored turns are counted lazily,
    newest first, only as far back as the window reaches (``COUNT_CHUNK`` per worker-thread
    hop on slow engines); ``base`` is cached per tool set. This is exact on engines whose
    count is additive over messages (the scripted engine) and a close estimate on chat
    templates (llama, native), whose boundary tokens it may count slightly differently.
    The visible window (first visible turn, its running total) moves with the history, so a
    step costs amortised O(1) counting, and its message list is one slice of the history's
    messages kept flat (``_messages``; a copy of references in C, no Python loop over the
    window): O(new messages) per turn, whatever the history's length. The window is the
    longest run of newest turns that fits ``context_size - maxTokens (or 256)``, exactly what
    dropping the oldest turn one at a time until it fits gave.
    """

    # Slots: thousands of idle NPCs, each without an instance dict (0.6 KiB less apiece).
    __slots__ = (
        "config", "npc_id", "engine", "engine_name", "sink", "world", "tags", "_view", "_fallback_next", "_recall_check",
        "instructions", "tools", "_arg_validators", "turns", "current", "pending", "queued", "_max_queued", "_wake", "closed",
        "_turn_tokens", "_start", "_visible", "_epoch", "_base", "_empty", "_messages", "_turn_at",
    )

    def __init__(
        self, config: m.NpcConfig, engine: Engine, engine_name: str, sink: EventSink, max_queued: int, world: World | None = None
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
        self.turns: list[list[Message]] = []
        self.current: Turn | None = None
        self.pending: dict[str, _PendingCall] = {}
        # Turns waiting for the worker, oldest first. A deque and an event made when the worker
        # waits, not a memory channel: an idle NPC costs about 1.5 KiB less (thousands of them).
        self.queued: deque[Turn] = deque()
        self._max_queued = max_queued
        self._wake: trio.Event | None = None
        self.closed = False
        # token accounting (see the class docstring)
        self._turn_tokens: list[int | None] = []  # parallel to turns; None: not counted yet
        self._start = 0  # first visible turn; every turn from here on is counted
        self._visible = 0  # sum of _turn_tokens[_start:]
        self._epoch = 0  # bumped when the history is replaced: stale counts are dropped
        self._base: dict[tuple[Any, ...], int] = {}
        self._empty: int | None = None
        # every turn's messages in order, so a window's messages are one slice
        self._messages: list[Message] = []
        self._turn_at = array("q")  # parallel to turns: where each starts in _messages

    # ---- history ----

    def set_history(self, turns: list[list[Message]]) -> None:
        """Replace the history (restore), before the worker runs. O(len(turns)); no turn is
        counted until a prompt needs it."""
        self.turns = turns
        self._messages = list(itertools.chain.from_iterable(turns))
        self._turn_at = array("q", itertools.accumulate(map(len, turns), initial=0))
        self._turn_at.pop()  # where a next turn would start
        self._turn_tokens = [None] * len(turns)
        self._start = len(turns)
        self._visible = 0
        self._epoch += 1

    def reset(self) -> None:
        """Cancel every turn, clear the history (and its counts), and make the engine forget
        the NPC; a scripted NPC's script starts again from its first step."""
        self.cancel()
        self.set_history([])
        self.engine.forget(self.npc_id)
        if self.config.script is not None:
            set_script = getattr(self.engine, "set_script", None)
            if set_script is not None:
                set_script(self.npc_id, self.config.script)

    async def _empty_tokens(self) -> int:
        if self._empty is None:
            (self._empty,) = await _count(self.engine, [("", [], [])])
        return self._empty

    async def _base_tokens(self, instructions: str, tools: list[ToolSpec]) -> int:
        key = (instructions, *((t.name, t.description) for t in tools))
        n = self._base.get(key)
        if n is None:
            (n,) = await _count(self.engine, [(instructions, [], tools)])
            if len(self._base) >= 32:  # old world views and tool sets
                self._base.clear()
            self._base[key] = n
        return n

    async def _messages_tokens(self, msgs: list[Message]) -> int:
        empty = await self._empty_tokens()
        (n,) = await _count(self.engine, [("", msgs, [])])
        return max(0, n - empty)

    def _fit(self, fixed: int, budget: int) -> int | None:
        """Move the window to the longest run of newest turns that fits ``budget`` beside
        ``fixed`` tokens. Synchronous (the window is consistent when it returns). Returns
        ``None`` when done, else the index of a turn that must be counted first."""
        counts = self._turn_tokens
        s, total = self._start, self._visible
        while fixed + total > budget and s < len(counts):
            c = counts[s]
            assert c is not None, "turns from the window's start on are counted"
            total -= c
            s += 1
        missing: int | None = None
        while s > 0 and fixed + total <= budget:
            c = counts[s - 1]
            if c is None:
                missing = s - 1
                break
            if fixed + total + c > budget:
                break
            s -= 1
            total += c
        self._start, self._visible = s, total
        return missing

    async def _count_turns(self, hi: int) -> None:
        """Count the uncounted turns in ``[hi - COUNT_CHUNK + 1, hi]`` (one thread hop)."""
        epoch = self._epoch
        lo = max(0, hi - COUNT_CHUNK + 1)
        idx = [i for i in range(lo, hi + 1) if self._turn_tokens[i] is None]
        empty = await self._empty_tokens()
        counts = await _count(self.engine, [("", self.turns[i], []) for i in idx])
        if self._epoch != epoch:
            return  # the history was replaced meanwhile: these counts are for another one
        for i, n in zip(idx, counts):
            self._turn_tokens[i] = max(0, n - empty)

    async def _window(self, fixed: int, budget: int) -> tuple[int, int]:
        """(first visible turn, tokens of the visible turns): consistent with ``self.turns``
        until the caller's next checkpoint."""
        while True:
            missing = self._fit(fixed, budget)
            if missing is None:
                return self._start, self._visible
            await self._count_turns(missing)

    def _budget(self) -> int:
        return self.engine.context_size - (self.config.options.max_tokens or 256)

    async def prompt_tokens(self) -> int:
        """Tokens of the prompt the model would see now (instructions, every tool, and the
        turns that fit the window), counted off the event loop for slow engines."""
        view = self.view()
        tools = list(self.tools.values()) + ([view.recall_tool] if view.recall_tool is not None else [])
        fixed = await self._base_tokens(self._instructions(view), tools)
        _, visible = await self._window(fixed, self._budget())
        return fixed + visible

    # ---- the world ----

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

    def _instructions(self, view: View) -> str:
        """The persona and the game's instructions, then the facts: a fact change keeps the
        prefix before them (an engine's cached prompt) intact."""
        if not view.text:
            return self.instructions
        return f"{self.instructions}\n\n{view.text}" if self.instructions else view.text

    def set_tags(self, tags: list[str]) -> None:
        self.config = msgspec.structs.replace(self.config, tags=tuple(tags))
        self.tags = frozenset(tags) if tags else NO_TAGS

    def _window_messages(self, first: int) -> list[Message]:
        """The messages of the turns from ``first`` on: one slice, copied in C."""
        return self._messages[self._turn_at[first] :] if first < len(self._turn_at) else []

    def _commit(self, working: list[Message], tokens: int) -> None:
        self.turns.append(working)
        self._turn_at.append(len(self._messages))
        self._messages.extend(working)
        self._turn_tokens.append(tokens)
        self._visible += tokens

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
        turn = Turn(self, params, kind, speaker, remember, resume, return_calls)
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
                    self._put_failed(turn, BridgeError("cancelled", "turn cancelled before it started"))
                    continue
                self.current = turn
                try:
                    await self._run(turn)
                finally:
                    self.current = None
                    self.pending.clear()
        finally:
            while self.queued:
                turn = self.queued.popleft()
                if turn.state == "queued":
                    turn.move("cancelled")
                self._put_failed(turn, BridgeError("cancelled", "turn cancelled before it started"))

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

    # ---- events ----

    def _put(self, turn: Turn, kind: Callable[..., m.Event], /, **fields: Any) -> None:
        self.sink.put(kind(npc_id=self.npc_id, turn_id=turn.id, seq=turn.next_seq(), **fields))

    async def _emit(self, turn: Turn, kind: Callable[..., m.Event], /, **fields: Any) -> None:
        await self.sink.wait_room()
        # No checkpoint from here to put: a cancelled wait never consumes a seq.
        self.sink.put(kind(npc_id=self.npc_id, turn_id=turn.id, seq=turn.next_seq(), **fields))

    async def _emit_owed(self, turn: Turn, kind: Callable[..., m.Event], /, **fields: Any) -> None:
        """An event the game is owed (the end of a call it saw requested): waits for room,
        but if the turn is cancelled meanwhile, puts it anyway before ending."""
        try:
            await self.sink.wait_room()
        except trio.Cancelled:
            self._put(turn, kind, **fields)
            raise
        self._put(turn, kind, **fields)

    def _put_failed(self, turn: Turn, err: BridgeError) -> None:
        self._put(turn, m.TurnFailed, error=m.ErrorInfo(**err.to_event()))

    # ---- turn ----

    async def _run(self, turn: Turn) -> None:
        turn.move("running")
        error: BridgeError | None = None
        try:
            with turn.scope:
                try:
                    await self._emit(turn, m.TurnStarted, prompt=turn.params.prompt, speaker=turn.speaker, kind=turn.kind)
                    if turn.kind == "prewarm":
                        await self._prewarm(turn)
                    else:
                        await self._steps(turn)
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
                self._put_failed(turn, BridgeError("cancelled", "turn cancelled"))
            raise
        # History is untouched: the turn's messages were never committed (rollback).
        if error is None:
            turn.move("cancelled")
            error = BridgeError("cancelled", "turn cancelled")
        else:
            turn.move("failed")
        self._put_failed(turn, error)

    async def _steps(self, turn: Turn) -> None:
        p = turn.params
        working: list[Message] = list(turn.resume) if turn.resume else [Message(role="user", content=p.prompt, name=turn.speaker)]
        working_tokens = await self._messages_tokens(working)
        records: list[m.ToolRecord] = []
        usage = Usage()
        rounds = calls_made = 0
        announced_drop = 0
        warnings: list[str] = []
        step = 0
        finish = "stop"
        budget = self._budget()
        schema = p.schema
        direct = False  # the model chose respond_directly, or a retry as text: words only
        retried = False
        view = EMPTY_VIEW
        while True:
            # The world as this step sees it: a change after this line applies from the next step.
            view = self.view()
            instructions = self._instructions(view)
            tools, mode = self._steer(p, step, rounds, calls_made, view, direct)
            fixed = await self._base_tokens(instructions, tools) + working_tokens
            dropped, visible = await self._window(fixed, budget)
            if fixed + visible > budget:
                raise BridgeError(
                    "context_size_exceeded",
                    f"prompt needs {fixed} tokens; the window leaves {budget}",
                    tokens=fixed,
                    contextSize=self.engine.context_size,
                )
            # From the window above to the request: no checkpoint (the history may not move).
            msgs = self._window_messages(dropped) + working
            kept = len(self.turns) - dropped
            if dropped > announced_drop:
                announced_drop = dropped
                await self._emit(
                    turn,
                    m.ContextTrimmed,
                    dropped_turns=dropped,
                    kept_turns=kept,
                    prompt_tokens=fixed + visible,
                    context_size=self.engine.context_size,
                )
            req = StepRequest(
                npc_id=self.npc_id,
                instructions=instructions,
                messages=msgs,
                tools=tools,
                tool_mode=mode,
                schema=schema,
                options=self.config.options,
                step_index=step,
                speaker=self.config.persona.name if self.config.persona else None,
            )
            try:
                text, calls, finish = await self._stream(turn, req, reset=step > 0, usage=usage, warnings=warnings)
            except BridgeError as e:
                if e.code not in GUARDRAIL_CODES or p.guardrail == "fail":
                    raise
                warn = f"{e.code}: {e.message}"
                if warn not in warnings:
                    warnings.append(warn)
                if p.guardrail == "retry" and not retried:
                    # Once more as plain text: guided generation trips guardrails far more often.
                    retried = direct = True
                    schema = None
                    step += 1
                    continue
                line = self._fallback_line(e.code)
                if line is None:
                    raise
                await self._complete_fallback(turn, line, records, usage, step + 1, warnings, view)
                return
            step += 1
            if calls and mode != "disallowed":
                if any(c.name == RESPOND_DIRECTLY for c in calls) and any(t is RESPOND_DIRECTLY_TOOL for t in tools):
                    # The bridge's no-op: never the game's, never in the history.
                    calls = [c for c in calls if c.name != RESPOND_DIRECTLY]
                    if not calls:
                        direct = True
                        continue
                shown = {t.name: t for t in tools}
                if turn.return_calls:
                    problems = self._call_problems(calls, calls_made, p, shown, view)
                    handed = [c for c, why in zip(calls, problems) if why is None and c.name != RECALL]
                    if handed:
                        for c, why in zip(calls, problems):
                            if why is not None or c.name == RECALL:
                                warnings.append(f"tool call {c.id} ({c.name}) dropped: {why or 'the bridge answers it only within a turn'}")
                        records.extend(m.ToolRecord(c.id, c.name, c.arguments, None, None) for c in handed)
                        await trio.lowlevel.checkpoint_if_cancelled()
                        self._put_completed(turn, view, text, None, records, usage, step, "tool_calls", warnings)
                        return
                    # Every call was refused: each gets its error output at once, below.
                rounds += 1
                turn.move("awaiting_tool")
                results = await self._run_calls(turn, calls, calls_made, p, shown, view)
                turn.move("running")
                calls_made += len(calls)
                new = [Message(role="assistant", content=text, tool_calls=calls)]
                for call, (output, err) in zip(calls, results):
                    records.append(m.ToolRecord(call.id, call.name, call.arguments, output, err))
                    content = err if err is not None else (output if isinstance(output, str) else msgspec.json.encode(output).decode())
                    new.append(
                        Message(role="tool", content=f"Error: {content}" if err else content, tool_call_id=call.id, name=call.name, is_error=err is not None)
                    )
                working.extend(new)
                working_tokens += await self._messages_tokens(new)
                continue
            if calls:
                warn = f"the model made {len(calls)} tool call(s) on a step where tools were disallowed; ignored"
                if warn not in warnings:
                    warnings.append(warn)
            elif mode == "required":
                raise BridgeError("generation_failed", "the model answered without calling a tool on a step that required one")
            break
        answer: Any = None
        if schema is not None:
            try:
                answer = msgspec.json.decode(text)
            except msgspec.DecodeError:
                why = " (cut off by maxTokens: finish_reason \"length\")" if finish == "length" else ""
                raise BridgeError("generation_failed", f"the structured answer is not valid JSON{why}", text=text[:200]) from None
            problem = first_error(make_validator(schema), answer)
            if problem is not None:
                raise BridgeError("generation_failed", f"the structured answer does not match the schema: {problem}")
            answer = reorder_to_schema(answer, schema)
        if retried:
            finish = "retried_as_text"
        final = Message(role="assistant", content=text)
        working.append(final)
        tokens = working_tokens + await self._messages_tokens([final])
        # A cancel that arrived while this task was already scheduled ends the turn here:
        # the commit below has no checkpoint, so it is all or nothing.
        await trio.lowlevel.checkpoint_if_cancelled()
        # Commit: the one place history changes. Nothing before this point is kept on failure.
        if turn.remember:
            self._commit(working, tokens)
        self._put_completed(turn, view, text, answer, records, usage, step, finish, warnings)

    def _put_completed(
        self, turn: Turn, view: View, text: str, answer: Any, records: list[m.ToolRecord], usage: Usage, steps: int, finish: str, warnings: list[str]
    ) -> None:
        turn.move("completed")
        self._put(
            turn,
            m.TurnCompleted,
            text=text,
            json=answer,
            tool_calls=records,
            usage=usage,
            steps=steps,
            finish_reason=finish,
            warnings=warnings,
            world_revision=view.revision,
        )

    async def _stream(self, turn: Turn, req: StepRequest, *, reset: bool, usage: Usage, warnings: list[str]) -> tuple[str, list[ToolCall], str]:
        """Run one model step, streaming its text to the game: (text, tool calls, finish
        reason). ``reset``: the first delta replaces what was shown (a step after a round)."""
        p = turn.params
        text = ""
        calls: list[ToolCall] = []
        finish = "stop"
        n_chunks = 0
        # aclosing: a cancelled step closes the engine's generator at once, so an engine
        # can stop its worker thread instead of waiting for garbage collection.
        async with aclosing(self.engine.stream_step(req)) as stream:  # type: ignore[type-var]
            async for chunk in stream:
                n_chunks += 1
                if n_chunks % 32 == 0:
                    await trio.lowlevel.checkpoint()  # let other NPCs and the reader run
                if isinstance(chunk, TextChunk):
                    text += chunk.delta
                    so_far = text if p.full_text else None
                    # ``_emit`` written out (one event per chunk, the hot path): room first,
                    # then the seq and ``put`` with no checkpoint between.
                    await self.sink.wait_room()
                    ev: m.Event
                    if req.schema is not None:
                        ev = m.PartialJson(npc_id=self.npc_id, turn_id=turn.id, seq=turn.next_seq(), json=so_far, delta=chunk.delta)
                    else:
                        ev = m.TextDelta(npc_id=self.npc_id, turn_id=turn.id, seq=turn.next_seq(), delta=chunk.delta, text=so_far, is_reset=reset)
                        reset = False
                    self.sink.put(ev)
                    turn.shown = True
                elif isinstance(chunk, ToolCallsChunk):
                    calls.extend(chunk.calls)
                else:
                    usage.add(chunk.usage)
                    finish = chunk.finish_reason
                    warnings.extend(w for w in chunk.warnings if w not in warnings)
        return text, calls, finish

    def _fallback_line(self, code: str) -> str | None:
        """The NPC's next fallback line for ``code`` (in turn), or None when it has none."""
        fb = self.config.fallbacks
        lines = [] if fb is None else (fb.guardrail_violation if code == "guardrail_violation" else fb.refusal)
        if not lines:
            return None
        if self._fallback_next is None:
            self._fallback_next = {}
        i = self._fallback_next.get(code, 0) % len(lines)
        self._fallback_next[code] = i + 1
        return lines[i]

    async def _complete_fallback(
        self, turn: Turn, line: str, records: list[m.ToolRecord], usage: Usage, steps: int, warnings: list[str], view: View
    ) -> None:
        """End the turn with a fallback line: streamed as one delta, not committed (the words
        that tripped the guardrail stay out of the history, so they cannot trip the next turn)."""
        p = turn.params
        await self._emit(turn, m.TextDelta, delta=line, text=line if p.full_text else None, is_reset=turn.shown)
        await trio.lowlevel.checkpoint_if_cancelled()
        self._put_completed(turn, view, line, None, records, usage, steps, "fallback", warnings)

    async def _prewarm(self, turn: Turn) -> None:
        """``npc/prewarm``: hand the engine the step the NPC would run now, to prepare."""
        view = self.view()
        instructions = self._instructions(view)
        tools, mode = self._steer(turn.params, 0, 0, 0, view, False)
        fixed = await self._base_tokens(instructions, tools)
        budget = self._budget()
        dropped, visible = await self._window(fixed, budget)
        if fixed + visible > budget:
            raise BridgeError("context_size_exceeded", f"prompt needs {fixed} tokens; the window leaves {budget}", tokens=fixed, contextSize=self.engine.context_size)
        req = StepRequest(
            npc_id=self.npc_id,
            instructions=instructions,
            messages=self._window_messages(dropped),
            tools=tools,
            tool_mode=mode,
            schema=None,
            options=self.config.options,
            step_index=0,
            speaker=self.config.persona.name if self.config.persona else None,
        )
        usage = Usage()
        prewarm = getattr(self.engine, "prewarm", None)
        if prewarm is not None:
            usage = await prewarm(req)
        await trio.lowlevel.checkpoint_if_cancelled()
        self._put_completed(turn, view, "", None, [], usage, 0, "prewarmed", [])

    def _steer(self, p: m.RespondParams, step: int, rounds: int, calls_made: int, view: View, direct: bool) -> tuple[list[ToolSpec], ToolMode]:
        """Tool mode and visible tools for one step: ``required``/named/``tool_or_answer``
        apply to step 0 only; a spent budget, ``none`` or a direct answer disallows, and
        disallowed steps show no tools at all. The world's ``recall`` joins the NPC's tools
        while it can see lore."""
        choice = p.tool_choice
        tools = list(self.tools.values())
        if view.recall_tool is not None:
            tools.append(view.recall_tool)
        if direct or not tools or choice == "none" or rounds >= p.max_tool_rounds or calls_made >= p.max_tool_calls:
            return [], "disallowed"
        if step == 0 and isinstance(choice, m.NamedTool):
            named = [t for t in tools if t.name == choice.tool]
            if not named:
                raise BridgeError("invalid_params", f"toolChoice names tool {choice.tool!r}, which the npc does not have now")
            return named, "required"
        if step == 0 and choice == "required":
            return tools, "required"
        if step == 0 and choice == "tool_or_answer":
            return [*tools, RESPOND_DIRECTLY_TOOL], "required"
        return tools, "allowed"

    async def _run_calls(
        self, turn: Turn, calls: list[ToolCall], calls_made: int, p: m.RespondParams, shown: dict[str, ToolSpec], view: View
    ) -> list[tuple[Any, str | None]]:
        """Run one step's calls concurrently; results keep call order. Errors become outputs.

        A call whose id repeats an earlier one of the batch gets its error output (the model
        sees it) but no event: its callId names the earlier call, which may be the game's to
        run, and that call ends with exactly one event of its own."""
        results: list[tuple[Any, str | None]] = [(None, None)] * len(calls)
        problems = self._call_problems(calls, calls_made, p, shown, view)
        repeats = _repeats(calls)

        async def one(i: int, call: ToolCall) -> None:
            if repeats[i]:
                results[i] = (None, problems[i])
                return
            if call.name == RECALL and problems[i] is None:
                results[i] = await self._recall(turn, call, view)
                return
            results[i] = await self._one_call(turn, call, p.tool_timeout_ms, problems[i])

        async with trio.open_nursery() as nursery:
            for i, call in enumerate(calls):
                nursery.start_soon(one, i, call)
        return results

    def _call_problems(self, calls: list[ToolCall], calls_made: int, p: m.RespondParams, shown: dict[str, ToolSpec], view: View) -> list[str | None]:
        """Why the game must not get each call of a step's batch (None: it may)."""
        room = p.max_tool_calls - calls_made
        return [
            self._call_problem(call, shown, view, over_budget=i >= room, duplicate=dup)
            for i, (call, dup) in enumerate(zip(calls, _repeats(calls)))
        ]

    def _call_problem(self, call: ToolCall, shown: dict[str, ToolSpec], view: View, over_budget: bool, duplicate: bool) -> str | None:
        """Why the game must not get this call (the model gets the reason as its output)."""
        if over_budget:
            return "tool call budget exceeded for this turn; answer without more tool calls"
        if duplicate or call.id in self.pending:
            return f"duplicate tool call id {call.id!r}"
        recall = call.name == RECALL and view.recall_tool is not None
        if call.name not in self.tools and not recall:
            return f"unknown tool {call.name!r}"
        if call.name not in shown:
            return f"tool {call.name!r} is not offered on this step; call one of: {', '.join(shown)}"
        try:
            problem = first_error(self._recall_validator(view) if recall else self._arg_validators[call.name], call.arguments)
        except Exception:  # a schema check_schema let through but jsonschema cannot apply
            log.exception("validating the arguments of %s", call.name)
            return "invalid arguments: they could not be checked against the tool's schema"
        return None if problem is None else f"invalid arguments: {problem}"

    async def _one_call(self, turn: Turn, call: ToolCall, timeout_ms: int, problem: str | None) -> tuple[Any, str | None]:
        if problem is not None:
            await self._emit(turn, m.ToolCallCompleted, call_id=call.id, name=call.name, error=problem)
            return None, problem
        # A turn cancelled before this task first ran asks the game for nothing more.
        await trio.lowlevel.checkpoint_if_cancelled()
        pc = _PendingCall(call)
        await self._emit(turn, m.ToolCallRequested, call_id=call.id, name=call.name, arguments=call.arguments, timeout_ms=timeout_ms)
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
        await self._emit_owed(turn, m.ToolCallCompleted, call_id=call.id, name=call.name, output=pc.output, error=pc.error)
        return pc.output, pc.error

    def _recall_validator(self, view: View) -> Any:
        cached = self._recall_check
        if cached is None or cached[0] is not view:
            assert view.recall_tool is not None
            cached = self._recall_check = (view, make_validator(view.recall_tool.parameters))
        return cached[1]

    async def _recall(self, turn: Turn, call: ToolCall, view: View) -> tuple[Any, str | None]:
        """The bridge's own tool: the lore the step's view holds for the topic, answered at
        once (a dictionary lookup: nothing to time out), seen by the game as completed only."""
        output = render_value(view.lore[call.arguments["topic"]])
        await self._emit_owed(turn, m.ToolCallCompleted, call_id=call.id, name=call.name, output=output)
        return output, None

    def _put_call_end(self, turn: Turn, pc: _PendingCall) -> None:
        """A requested call's one ending event, without waiting: withdrawn, or completed with
        the game's answer."""
        call = pc.call
        if pc.withdrawn is not None:
            self._put(turn, m.ToolCallWithdrawn, call_id=call.id, name=call.name, reason=pc.withdrawn)
        else:
            self._put(turn, m.ToolCallCompleted, call_id=call.id, name=call.name, output=pc.output, error=pc.error)
