"""The narrow engine interface every inference engine implements.

The agent loop (steering, budgets, tool runtime, trimming, rollback) lives once in
``bridge.core.agent``. An engine only turns one *step request* into a stream of chunks:
text deltas, then optionally one batch of tool calls, then a final ``StepDone``.

Contract:
- ``stream_step`` is an async generator run on the trio thread. Blocking work (a model
  forward pass) must go to a worker thread; cancellation of the calling task must reach
  that work within a token or two.
- The engine uses ``request.tools`` and ``request.tool_mode`` as given and never re-filters
  them: a ``"disallowed"`` step carries no tools, a named tool choice carries only that tool.
  What the model does with them is judged once, in ``bridge.core.agent._steering`` (the same for
  every engine): calls on a disallowed step are ignored with a warning; a ``"required"`` step
  answered without a call fails ``generation_failed``; a call to a tool not in
  ``request.tools`` becomes an error output the model sees. An engine need not enforce any of
  this itself (a grammar that does is welcome).
- With ``schema`` set and no tool calls, the text produced is the JSON answer; when it was
  cut off by ``max_tokens`` the step ends with finish reason ``"length"``.
- Errors are raised as ``bridge.errors.BridgeError`` with a stable code; any other exception
  is a bug (reported as ``internal_error``).
- ``count_tokens`` may be slow (a tokenizer): the agent calls it in a worker thread unless
  the engine sets ``blocking_count = False`` (``CountCost``), so it must be safe to call from
  a thread while the engine streams a step. The agent counts messages in batches and adds the
  counts up (see ``bridge.core.agent._window``), so a count should be close to additive over
  messages.
- Optional capabilities are small protocols of their own (``Scriptable``, ``Prewarmable``,
  ``TextCounter``, ``CountCost``), checked with ``isinstance``: an engine has one by having
  its members, nothing to inherit or register.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

import msgspec

ToolMode = Literal["allowed", "required", "disallowed"]


class ToolSpec(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    """A tool the model may call; the game executes it."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = msgspec.field(default_factory=lambda: {"type": "object"})
    # Lines a player might say that call for this tool: the bridge's semantic routing compares
    # the player's line with them (bridge/core/agent/_routing.py). Never shown to the model.
    examples: list[str] = []


class ToolCall(msgspec.Struct, frozen=True, rename="camel"):
    id: str
    name: str
    arguments: dict[str, Any]


class Message(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """One transcript entry. ``role`` is user, assistant or tool. A user message with a
    ``name`` was said by someone other than the player (another NPC: ``npc/respond``'s
    ``speaker``); a tool message's ``name`` is the tool's."""

    role: Literal["user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCall] = []
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False


# Bounds on what a game may ask for: past them a value is a mistake, refused as invalid_params
# when the options are decoded instead of overflowing inside an engine.
MAX_MAX_TOKENS = 1_000_000
# absent or null: the engine's default. 0 is refused: it meant the default on one engine and
# was ignored on another, and a turn of no tokens is never what a game wants.
MaxTokens = Annotated[int, msgspec.Meta(ge=1, le=MAX_MAX_TOKENS)]
Seed = Annotated[int, msgspec.Meta(ge=0, le=0xFFFF_FFFF)]  # what llama.cpp takes (uint32)
Temperature = Annotated[float, msgspec.Meta(ge=0, le=100)]
TopP = Annotated[float, msgspec.Meta(ge=0, le=1)]


class GenerationOptions(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    temperature: Temperature | None = None
    max_tokens: MaxTokens | None = None
    seed: Seed | None = None
    top_p: TopP | None = None


class StepRequest(msgspec.Struct, frozen=True):
    """Everything the model sees for one step, already steered and trimmed."""

    npc_id: str
    instructions: str
    messages: list[Message]
    tools: list[ToolSpec]
    tool_mode: ToolMode
    schema: dict[str, Any] | None
    options: GenerationOptions
    step_index: int
    # The NPC's name (its persona's), for engines that keep a small model in character:
    # the llama engine makes the NPC say this name where it would introduce itself.
    speaker: str | None = None
    # The most calls the step may make: the turn's remaining maxToolCalls (None: no limit from
    # the agent). An engine that constrains generation holds a batch to it (the llama grammar).
    max_calls: int | None = None
    # Per tool, the argument values the player's line names (closed sets only; the agent's
    # ``_arguments``): an engine that constrains generation may hold the arguments to them.
    # Whatever the engine does, the agent sets a differing value to the pinned one after the step.
    pinned: dict[str, dict[str, str]] = {}
    # A sentence of the NPC's lore that answers the player's line (``_routing.lore_lead``): an
    # engine that keeps a small model grounded opens the spoken line with it (the llama engine).
    lead: str | None = None
    # ``npc/prewarm`` only: how the NPC's next prompt starts, as the model reads it (``Bram: ``
    # for a line that speaker will say); an engine that prepares the prompt prepares this too.
    prompt_prefix: str = ""


class TextChunk(msgspec.Struct, frozen=True):
    delta: str


class ToolCallsChunk(msgspec.Struct, frozen=True):
    calls: list[ToolCall]


class Usage(msgspec.Struct, rename="camel"):
    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0

    def add(self, other: Usage) -> None:
        self.input_tokens += other.input_tokens
        self.output_tokens += other.output_tokens
        self.cached_tokens += other.cached_tokens


class StepDone(msgspec.Struct, frozen=True):
    usage: Usage = msgspec.field(default_factory=Usage)
    finish_reason: str = "stop"
    warnings: list[str] = []  # e.g. schema features the engine could not enforce


Chunk = TextChunk | ToolCallsChunk | StepDone


def user_text(message: Message) -> str:
    """What the model reads for a user message: ``Name: line`` when someone other than the
    player said it, else the line as it is. Every engine renders speakers this way."""
    if message.role == "user" and message.name:
        return f"{message.name}: {message.content}"
    return message.content


class EngineInfo(msgspec.Struct, frozen=True, rename="camel"):
    name: str
    available: bool
    reason: str | None = None
    context_size: int = 0
    features: list[str] = []
    # llama: the build of llama.cpp's CPU backend in use ("haswell", "zen4", ... or "built in")
    cpu_variant: str | None = None
    # llama: where the prompt's form comes from, once the model has loaded: "gguf" (the model
    # file's own chat template) or "chatml-fallback" (the file has none: ChatML)
    chat_template: str | None = None
    # llama, once the model has loaded: threads for single-token passes (one NPC generating),
    # and for larger ones (prompt chunks, several NPCs at once)
    threads: int | None = None
    batch_threads: int | None = None
    # native on Apple's model: the languages it speaks (BCP 47, "en", "zh-Hans"); else null
    languages: list[str] | None = None


class Engine(Protocol):
    name: str

    @property
    def context_size(self) -> int: ...

    def info(self) -> EngineInfo: ...

    def count_tokens(self, instructions: str, messages: list[Message], tools: list[ToolSpec]) -> int:
        """Tokens the engine would spend on this prompt (used for trimming)."""
        ...

    def stream_step(self, request: StepRequest) -> AsyncIterator[Chunk]: ...

    def forget(self, npc_id: str) -> None:
        """Drop any per-NPC cached state (reset, delete, restore)."""
        ...

    async def aclose(self) -> None: ...


# Optional capabilities. runtime_checkable: ``isinstance`` checks that the members exist
# (not their signatures); these declarations give mypy the signatures.


@runtime_checkable
class CountCost(Protocol):
    """``blocking_count = False``: the engine's counts (``count_tokens``, ``count_text``) are
    cheap enough for the event loop (the scripted engine). An engine that says nothing counts
    in a worker thread: see ``counts_block``."""

    blocking_count: bool


def counts_block(engine: object) -> bool:
    """Whether the engine's counts must run off the event loop (unless it says otherwise)."""
    return bool(engine.blocking_count) if isinstance(engine, CountCost) else True


@runtime_checkable
class ToolChoiceStrength(Protocol):
    """``weak_tool_choice = True``: the engine's model chooses tools badly (the bundled SmolLM2:
    never a tool under ``auto``, nearly always the first one when forced), so the bridge's
    ``routing: "auto"`` picks the first step's tool itself. An engine that says nothing is
    trusted to choose."""

    weak_tool_choice: bool


def weak_tool_choice(engine: object) -> bool:
    return bool(engine.weak_tool_choice) if isinstance(engine, ToolChoiceStrength) else False


@runtime_checkable
class TextCounter(Protocol):
    def count_text(self, text: str) -> int:
        """Tokens of ``text`` alone, with no chat template or message framing (``tokens/count``;
        ``""`` is 0). Blocks like ``count_tokens`` (``counts_block``)."""
        ...


@runtime_checkable
class Scriptable(Protocol):
    def set_script(self, npc_id: str, steps: list[Any]) -> None:
        """Give one NPC its own script (``NpcConfig.script``), from its first step. Only an
        engine with this method takes NPCs with a script."""
        ...


@runtime_checkable
class Prewarmable(Protocol):
    async def prewarm(self, request: StepRequest) -> Usage:
        """Prepare the NPC's next step ahead of time (``npc/prewarm``): the llama engine
        evaluates the request's prompt into the NPC's saved state, the native engine prewarms
        Apple's session. ``request`` is the step the NPC would run now for an empty player
        line: ``messages`` ends with the history, no new user message. Cancellable like a
        step. Without this capability a prewarm does nothing (and still completes)."""
        ...
