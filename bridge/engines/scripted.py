"""The scripted engine: plays back fixed steps and records every request it receives.

A step is a dict (the JSON a game's CI writes) or a callable ``(StepRequest) -> dict``:

- ``{"text": "Hello"}``: streamed word by word;
- ``{"toolCalls": [{"name": "open_door", "arguments": {...}}]}``: one batch of calls, after
  the step's ``"text"`` if it has one;
- ``{"json": {...}}``: a structured answer, streamed as JSON text;
- ``{"error": "guardrail_violation", "message": "..."}``: the step fails with that code
  (``"data": {"retryAfterMs": 1500}``: its ``turn/failed`` ``error.data``);
- ``{"echo": "instructions"}`` / ``{"echo": "prompt"}``: says what the model was given, the
  step's instructions (persona, instructions, world facts) or the last user message as the
  model reads it (``Name: line`` for another speaker), so a game's CI can check its prompts;
- any step may add ``"delayMs"`` (wait before it) and ``"chunkMs"`` (wait between chunks).

When an NPC's script runs out the engine echoes the last user message, so a bridge started
without a script still answers.

Steps given as data are checked when they are set (``validate_script``): anything else, a
``null`` for any key but ``"json"`` included, is ``invalid_params`` with ``data.reason``
``"invalid_script"``, at the request that carried it.
The engine plays what the script says whatever the step's ``tool_mode``: judging a call on a
disallowed step, or a missing one on a required step, is the agent's job (``bridge.core.agent._steering``).
It keeps the last ``max_requests`` step requests (``requests``, for tests) and forgets an
NPC's script, cursor and requests in ``forget``.
"""

from __future__ import annotations

import heapq
import itertools
import json
import math
import operator
import re
import uuid
from array import array
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Annotated, Any, Literal

import msgspec
import trio

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
from bridge.errors import ERROR_CODES, EVENT_DATA, BridgeError

Step = dict[str, Any] | Callable[[StepRequest], dict[str, Any]]
_WORDS = re.compile(r"\S+\s*|\s+")
MAX_DELAY_MS = 86_400_000  # a day, like toolTimeoutMs
_DelayMs = Annotated[float, msgspec.Meta(ge=0, le=MAX_DELAY_MS)]


# A key may be absent, but only ``json`` (any JSON answer, null included) may be null: the
# steps are played from the dicts themselves, where a null would be taken for a value
# (``{"toolCalls": null}`` once failed the turn with internal_error, ``{"error": null}`` as
# generation_failed). UNSET fields accept their type only, never null.


class _ScriptedCall(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    id: str | msgspec.UnsetType = msgspec.UNSET
    arguments: dict[str, Any] = {}


_Figure = Annotated[int, msgspec.Meta(ge=0, le=2**53 - 1)]


class _ErrorData(msgspec.Struct, forbid_unknown_fields=True):
    """An error step's ``data``: the figures ``turn/failed`` passes on (``EVENT_DATA``)."""

    retryAfterMs: _Figure | msgspec.UnsetType = msgspec.UNSET  # noqa: N815 (wire names)
    promptTokens: _Figure | msgspec.UnsetType = msgspec.UNSET  # noqa: N815
    contextSize: _Figure | msgspec.UnsetType = msgspec.UNSET  # noqa: N815


class _ScriptedStep(msgspec.Struct, rename="camel", forbid_unknown_fields=True):
    """The shape of one step given as data (checked, then played from the dict itself)."""

    text: str = ""
    tool_calls: list[_ScriptedCall] | msgspec.UnsetType = msgspec.UNSET
    json: Any = None
    error: str | msgspec.UnsetType = msgspec.UNSET
    message: str | msgspec.UnsetType = msgspec.UNSET
    data: _ErrorData | msgspec.UnsetType = msgspec.UNSET
    delay_ms: _DelayMs = 0
    chunk_ms: _DelayMs = 0
    warnings: list[str] = []
    finish_reason: str = "stop"
    echo: Literal["instructions", "prompt"] | msgspec.UnsetType = msgspec.UNSET


def validate_script(steps: Any, what: str = "script") -> None:
    """Raise ``invalid_params`` (``reason="invalid_script"``) unless ``steps`` is a list of
    valid steps. Callables (Python tests) are taken as they are."""
    if not isinstance(steps, list):
        raise BridgeError("invalid_params", f"{what} must be a list of steps", reason="invalid_script")
    for i, step in enumerate(steps):
        if callable(step):
            continue
        if not isinstance(step, dict):
            raise BridgeError(
                "invalid_params",
                f"{what} step {i} must be an object, not {type(step).__name__}",
                reason="invalid_script",
                step=i,
            )
        try:
            msgspec.convert(step, _ScriptedStep)
        except msgspec.ValidationError as e:
            raise BridgeError("invalid_params", f"{what} step {i}: {e}", reason="invalid_script", step=i) from None


def _count(text: str) -> int:
    return len(text.split())


def _count_message(m: Message) -> int:
    n = 4 + _count(m.content)
    for c in m.tool_calls:
        n += 4 + len(json.dumps(c.arguments)) // 4
    return n


def _count_base(instructions: str, tools: list[ToolSpec]) -> int:
    n = _count(instructions) + 4
    for t in tools:
        n += 8 + _count(t.description) + len(json.dumps(t.parameters)) // 4
    return n


def _count_prompt(instructions: str, messages: list[Message], tools: list[ToolSpec]) -> int:
    """Words, plus a fixed overhead per message and per tool: additive over messages."""
    return _count_base(instructions, tools) + sum(map(_count_message, messages))


def _find(messages: list[Message], message: Message) -> int:
    """Where ``message`` itself (not an equal one) is in ``messages``, else -1; the scan runs
    in C."""
    return next(itertools.compress(itertools.count(), map(operator.is_, messages, itertools.repeat(message))), -1)


class _PromptCount:
    """One NPC's latest prompt with running token totals, so that counting its next prompt
    (``usage.input_tokens`` of every step) costs the messages that changed, not the window.

    A prompt is the visible window of the history plus the turn's own messages; the next
    one is mostly the same messages with the window's start moved and new messages at the
    end (the agent passes the very same ``Message`` objects). The cached prompt is aligned
    with the new one by identity and their shared run found by slice comparison, both in C
    (identical objects compare at once); only the messages dropped from either end or added
    are touched in Python, and the cache becomes the new prompt. Counts stay exact: a cached
    message stands only for one that is identical or equal to it, and whatever does not
    align (the first prompt, an unrelated one) is counted whole.

    ``totals[i]`` is the running total before ``messages[i]``, from an arbitrary origin
    (only differences are used). 16 bytes per cached message beside the messages, which the
    NPC's history holds anyway."""

    __slots__ = ("messages", "totals", "_instructions", "_tools", "_base")

    def __init__(self) -> None:
        self.messages: list[Message] = []
        self.totals = array("q", [0])
        self._instructions: str | None = None
        self._tools: list[ToolSpec] = []
        self._base = 0

    def count(self, instructions: str, msgs: list[Message], tools: list[ToolSpec]) -> int:
        if (
            instructions != self._instructions
            or len(tools) != len(self._tools)
            or any(a is not b for a, b in zip(tools, self._tools, strict=True))
        ):
            self._instructions, self._tools, self._base = instructions, list(tools), _count_base(instructions, tools)
        self._follow(msgs)
        return self._base + self.totals[-1] - self.totals[0]

    def _follow(self, msgs: list[Message]) -> None:
        """Make the cached prompt ``msgs``, counting only what is new to it."""
        old, totals = self.messages, self.totals
        s = j = -1  # msgs[j] stands for old[s]
        if msgs and old:
            s = _find(old, msgs[0])  # the window's start moved on (or stayed)
            if s >= 0:
                j = 0
            else:
                j = _find(msgs, old[0])  # it reaches further back than before
                s = 0 if j >= 0 else -1
        if s < 0:  # nothing to align: count it whole
            del old[:], totals[1:]
            s = j = 0
        # k: how many messages from there on the two share (a turn that failed left messages
        # the next prompt does not have, hence the search)
        n = min(len(msgs) - j, len(old) - s)
        k = n
        if old[s : s + n] != msgs[j : j + n]:
            k, bad = 0, n
            while bad - k > 1:
                mid = (k + bad) // 2
                if old[s : s + mid] == msgs[j : j + mid]:
                    k = mid
                else:
                    bad = mid
        del old[s + k :], totals[s + k + 1 :]
        del old[:s], totals[:s]
        if j:
            before, running = [], totals[0]
            for msg in reversed(msgs[:j]):
                running -= _count_message(msg)
                before.append(running)
            before.reverse()
            totals[0:0] = array("q", before)
            old[0:0] = msgs[:j]
        total = totals[-1]
        for msg in msgs[j + k :]:
            total += _count_message(msg)
            totals.append(total)
        old.extend(msgs[j + k :])


class ScriptedEngine:
    name = "scripted"
    blocking_count = False  # a word count: cheap enough for the event loop

    def __init__(
        self,
        script: list[Step] | None = None,
        npc_scripts: dict[str, list[Step]] | None = None,
        context_size: int = 4096,
        max_requests: int = 256,
    ) -> None:
        validate_script(list(script or []))
        for npc_id, steps in (npc_scripts or {}).items():
            validate_script(steps, f"script of npc {npc_id!r}")
        self._default = list(script or [])
        self._npc_scripts = {k: list(v) for k, v in (npc_scripts or {}).items()}
        self._cursor: dict[str, int] = {}
        self._prompts: dict[str, _PromptCount] = {}  # per NPC: its latest prompt, counted
        self._context_size = context_size
        self.requests: deque[StepRequest] = deque(maxlen=max_requests)  # the latest, for tests

    @classmethod
    def from_file(cls, path: str) -> ScriptedEngine:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        if isinstance(data, list):
            return cls(script=data)
        if not isinstance(data, dict):
            raise BridgeError(
                "invalid_params", "a script file is a list of steps or an object", reason="invalid_script"
            )
        npcs = data.get("npcs", {})
        size = data.get("contextSize", 4096)
        if not isinstance(npcs, dict):
            raise BridgeError("invalid_params", "npcs must map npc ids to steps", reason="invalid_script")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise BridgeError("invalid_params", "contextSize must be a positive integer", reason="invalid_script")
        return cls(script=data.get("default", []), npc_scripts=npcs, context_size=size)

    @property
    def context_size(self) -> int:
        return self._context_size

    def info(self) -> EngineInfo:
        return EngineInfo(
            name=self.name,
            available=True,
            context_size=self._context_size,
            features=["tools", "streaming", "schema", "deterministic"],
        )

    validate_script = staticmethod(validate_script)

    def set_script(self, npc_id: str, steps: list[Step]) -> None:
        validate_script(steps)
        self._npc_scripts[npc_id] = list(steps)
        self._cursor.pop(npc_id, None)

    def count_tokens(self, instructions: str, messages: list[Message], tools: list[ToolSpec]) -> int:
        return _count_prompt(instructions, messages, tools)

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` alone (``tokens/count``): its words, no message overhead."""
        return _count(text)

    def forget(self, npc_id: str) -> None:
        """Drop the NPC's script, its place in the default script, its counted prompt and its
        kept requests."""
        self._npc_scripts.pop(npc_id, None)
        self._cursor.pop(npc_id, None)
        self._prompts.pop(npc_id, None)
        if any(r.npc_id == npc_id for r in self.requests):
            kept = [r for r in self.requests if r.npc_id != npc_id]
            self.requests.clear()
            self.requests.extend(kept)

    async def aclose(self) -> None:
        pass

    def _next_step(self, request: StepRequest) -> dict[str, Any]:
        steps = self._npc_scripts.get(request.npc_id, self._default)
        i = self._cursor.get(request.npc_id, 0)
        if i >= len(steps):
            last = next((m.content for m in reversed(request.messages) if m.role == "user"), "")
            if request.schema is not None:
                return {"json": {}}
            return {"text": f"You said: {last}"}
        self._cursor[request.npc_id] = i + 1
        step = steps[i]
        return step(request) if callable(step) else step

    async def stream_step(self, request: StepRequest) -> AsyncIterator[Chunk]:
        self.requests.append(request)
        sleep = _Pacer.current().sleep
        step = self._next_step(request)
        if step.get("delayMs"):
            await trio.sleep(step["delayMs"] / 1000)
        chunk_s = step.get("chunkMs", 0) / 1000
        prompt = self._prompts.get(request.npc_id)
        if prompt is None:
            prompt = self._prompts[request.npc_id] = _PromptCount()
        usage = Usage(input_tokens=prompt.count(request.instructions, request.messages, request.tools))
        if "error" in step:
            code = step["error"]
            if code not in ERROR_CODES:
                code = "generation_failed"
            data = step.get("data") or {}
            raise BridgeError(
                code, step.get("message", f"scripted {code}"), **{k: data[k] for k in EVENT_DATA if k in data}
            )
        if "toolCalls" in step:
            for piece in _WORDS.findall(step.get("text", "")):  # a preamble before the calls
                yield TextChunk(piece)
            calls = [
                ToolCall(
                    id=c.get("id") or f"call_{uuid.uuid4().hex[:12]}",
                    name=c["name"],
                    arguments=c.get("arguments", {}),
                )
                for c in step["toolCalls"]
            ]
            yield ToolCallsChunk(calls)
            usage.output_tokens = 8 * len(calls)
            yield StepDone(usage=usage, finish_reason="tool_calls", warnings=list(step.get("warnings", [])))
            return
        if "json" in step:
            body = msgspec.json.encode(step["json"]).decode()
            pieces = [body[i : i + 16] for i in range(0, len(body), 16)]
        elif "echo" in step:
            if step["echo"] == "instructions":
                said = request.instructions
            else:
                said = next((user_text(m) for m in reversed(request.messages) if m.role == "user"), "")
            pieces = _WORDS.findall(said)
        else:
            pieces = _WORDS.findall(step.get("text", ""))
        for piece in pieces:
            if chunk_s:
                await sleep(chunk_s)
            yield TextChunk(piece)
        usage.output_tokens = len(pieces)
        yield StepDone(
            usage=usage, finish_reason=step.get("finishReason", "stop"), warnings=list(step.get("warnings", []))
        )


class _Pacer:
    """The waits between streamed chunks, for every NPC of one trio run.

    A ``trio.sleep`` per chunk costs a cancel scope and a deadline of its own; with hundreds
    of NPCs streaming, that bookkeeping is most of what the process does. Here one system
    task sleeps until the earliest due wait and wakes every task due within ``SLACK`` of it,
    so NPCs streaming at the same pace wake together. A wait ends up to ``SLACK`` early."""

    SLACK = 0.0005
    _by_run: dict[Any, _Pacer] = {}

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, Any]] = []
        self._seq = 0
        self._scope: trio.CancelScope | None = None
        trio.lowlevel.spawn_system_task(self._run, name="oam-scripted-pacer")

    @classmethod
    def current(cls) -> _Pacer:
        token = trio.lowlevel.current_trio_token()
        pacer = cls._by_run.get(token)
        if pacer is None:
            cls._by_run.clear()  # an earlier trio.run is over: its pacer went with it
            pacer = cls._by_run[token] = cls()
        return pacer

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await trio.lowlevel.checkpoint()
            return
        await trio.lowlevel.checkpoint_if_cancelled()
        entry = [trio.lowlevel.current_task()]  # emptied when the wait is aborted
        deadline = trio.current_time() + seconds
        self._seq += 1
        heapq.heappush(self._heap, (deadline, self._seq, entry))
        if self._scope is not None and deadline < self._scope.deadline:
            self._scope.deadline = deadline

        def abort(_: Any) -> trio.lowlevel.Abort:
            entry.clear()
            return trio.lowlevel.Abort.SUCCEEDED

        await trio.lowlevel.wait_task_rescheduled(abort)

    async def _run(self) -> None:
        while True:
            with trio.CancelScope(deadline=self._heap[0][0] if self._heap else math.inf) as scope:
                self._scope = scope
                await trio.sleep_forever()
            self._scope = None
            due = trio.current_time() + self.SLACK
            while self._heap and self._heap[0][0] <= due:
                _, _, entry = heapq.heappop(self._heap)
                if entry:
                    trio.lowlevel.reschedule(entry[0])
