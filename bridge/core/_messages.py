"""The wire types: the source of truth for protocol.md (tests/unit/test_protocol_doc.py keeps
them in sync). Params are decoded once the method is known; unknown fields are rejected.

Which method takes which params and returns which result is the method registry's
(``bridge/core/_methods.py``), not this module's."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from bridge.engines.base import EngineInfo, GenerationOptions, Message, ToolSpec, Usage

PROTOCOL_VERSION = 1
SUPPORTED_PROTOCOL_VERSIONS = (1,)

# Bounds on the integers a game sends: past them a value is a mistake, not a wish, and the
# bridge answers invalid_params instead of overflowing later (a 401-digit timeout once did).
MAX_TOOL_TIMEOUT_MS = 86_400_000  # a day
MAX_BUDGET = 1000
ToolTimeoutMs = Annotated[int, msgspec.Meta(ge=0, le=MAX_TOOL_TIMEOUT_MS)]
Budget = Annotated[int, msgspec.Meta(ge=0, le=MAX_BUDGET)]


class Limits(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    """Every bound the bridge enforces; advertised by ``initialize``."""

    max_line_bytes: int = 4 * 1024 * 1024
    max_pending_lines: int = 1024  # read but not yet processed; past it requests get overloaded
    max_pending_bytes: int = 16 * 1024 * 1024  # likewise in bytes; at twice it, reading pauses
    max_outbound_bytes: int = 8 * 1024 * 1024  # written but not yet read by the game: backpressure
    max_npcs: int = 10_000
    max_queued_turns_per_npc: int = 32
    max_nesting_depth: int = 100  # deeper JSON is refused (invalid_message)
    exit_grace_ms: int = 2000  # stdin EOF, exit or a signal: the process is gone within this
    max_world_fact_bytes: int = 16 * 1024  # one fact's key, JSON value and scope (not lore)
    max_world_bytes: int = 64 * 1024  # every fact that is not lore
    max_lore_bytes: int = 4 * 1024 * 1024  # every lore fact
    max_lore_fact_bytes: int = 256 * 1024  # one lore fact
    max_fact_scopes: int = 1024  # one fact's npcIds and tags entries together
    max_world_scopes: int = 65_536  # the npcIds and tags entries of every fact, lore included


class _Params(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    pass


class ClientInfo(_Params, frozen=True):
    name: str
    version: str = ""


class InitializeParams(_Params, frozen=True):
    protocol_version: int
    client_info: ClientInfo | None = None


class EmptyParams(_Params, frozen=True):
    pass


class Persona(_Params, frozen=True):
    name: str
    role: str = ""
    traits: list[str] = []
    speech_style: str = ""


MAX_FALLBACK_LINES = 32
FallbackLines = Annotated[list[Annotated[str, msgspec.Meta(min_length=1)]], msgspec.Meta(max_length=MAX_FALLBACK_LINES)]


class Fallbacks(_Params, frozen=True):
    """Lines an NPC says instead when the model's guardrails block a turn or it refuses."""

    guardrail_violation: FallbackLines = []
    refusal: FallbackLines = []


# Who decides a first step's tool under toolChoice auto and tool_or_answer: the model, the
# bridge (from what the player's line means: bridge/core/agent/_routing.py), or auto: the
# bridge where the engine's model chooses tools badly (weak_tool_choice), the model elsewhere.
RoutingPolicy = Literal["auto", "model", "semantic"]


class NpcConfig(_Params, frozen=True):
    """What ``npc/create`` takes; also the config part of a save."""

    npc_id: str
    instructions: str | None = None
    persona: Persona | None = None
    tools: list[ToolSpec] = []
    engine: str = "auto"
    model: str | None = None  # llama: a GGUF file for this NPC (default: the bridge's); native: an Apple adapter
    options: GenerationOptions = GenerationOptions()
    tags: tuple[str, ...] = ()  # a tuple: the default is shared, not a list per NPC
    fallbacks: Fallbacks | None = None
    script: list[Any] | None = None
    routing: RoutingPolicy = "auto"


class NamedTool(_Params, frozen=True):
    tool: str


ToolChoice = Literal["auto", "required", "none", "tool_or_answer"] | NamedTool
GuardrailPolicy = Literal["fail", "fallback", "retry"]


class RespondParams(_Params, frozen=True):
    npc_id: str
    prompt: str
    tool_choice: ToolChoice = "auto"
    max_tool_rounds: Budget = 4
    max_tool_calls: Budget = 8
    schema: dict[str, Any] | None = None
    tool_timeout_ms: ToolTimeoutMs = 60_000
    full_text: bool = True  # textDelta/partialJson carry the text so far (False: deltas only)
    speaker: str | None = None  # another NPC's id or a name; None: the player
    guardrail: GuardrailPolicy = "fail"
    # the player's line names a tool argument's value: the call takes it (protocol.md, npc/respond)
    pin_arguments: bool = True
    routing: RoutingPolicy | None = None  # None: the NPC's (npc/create)


class SubmitParams(_Params, frozen=True):
    npc_id: str
    call_id: str
    output: Any = None
    error: str | None = None


class NpcRef(_Params, frozen=True):
    npc_id: str


class PrewarmParams(_Params, frozen=True):
    npc_id: str
    # who will speak to the NPC next (as npc/respond's speaker; None: the player) and how their
    # line starts, when the game knows: the engine prepares that lead-in too (``Bram: ``)
    speaker: str | None = None
    prompt_prefix: str = ""


class Save(_Params, frozen=True):
    """What ``npc/transcript`` returns and ``npc/restore`` takes back."""

    version: int
    config: NpcConfig
    turns: list[list[Message]]


MAX_OPTIONS = 64


class DecisionOption(_Params, frozen=True):
    name: Annotated[str, msgspec.Meta(min_length=1)]
    description: str = ""
    parameters: dict[str, Any] | None = None


class DecideParams(_Params, frozen=True):
    npc_id: str
    situation: str
    options: Annotated[list[DecisionOption], msgspec.Meta(min_length=1, max_length=MAX_OPTIONS)]
    reasoning: bool = True
    remember: bool = False


class SetTagsParams(_Params, frozen=True):
    npc_id: str
    tags: list[str]


class WorldSetParams(_Params, frozen=True):
    key: Annotated[str, msgspec.Meta(min_length=1)]
    value: Any
    npc_ids: list[str] | None = None
    tags: list[str] | None = None
    lore: bool = False


class WorldKey(_Params, frozen=True):
    key: str


class WorldGetParams(_Params, frozen=True):
    npc_id: str | None = None


class RestoreParams(_Params, frozen=True):
    save: Save
    npc_id: str | None = None


class CountTokensParams(_Params, frozen=True):
    text: str
    npc_id: str | None = None
    engine: str | None = None


# ---- results: what methods return (protocol.md's result examples are checked against these) ----


class _Result(msgspec.Struct, frozen=True, rename="camel"):
    pass


class ServerInfo(_Result, frozen=True):
    name: str
    version: str


class ToolCapabilities(_Result, frozen=True):
    engine_executed: bool = True
    parallel_calls: bool = True
    tool_choice: list[str] = msgspec.field(
        default_factory=lambda: ["auto", "required", "none", "named", "tool_or_answer"]
    )
    budgets: bool = True
    timeouts: bool = True


class StreamingCapabilities(_Result, frozen=True):
    text_delta: bool = True
    partial_json: bool = True


class StructuredOutputCapabilities(_Result, frozen=True):
    json_schema: bool = True


class TranscriptCapabilities(_Result, frozen=True):
    save: bool = True
    restore: bool = True


class TrimmingCapabilities(_Result, frozen=True):
    announced: bool = True


class GameCapabilities(_Result, frozen=True):
    world: bool = True
    lore: bool = True
    decisions: bool = True
    guardrail_policies: list[str] = msgspec.field(default_factory=lambda: ["fail", "fallback", "retry"])
    prewarm: bool = True
    speakers: bool = True


class Capabilities(_Result, frozen=True):
    tools: ToolCapabilities = ToolCapabilities()
    streaming: StreamingCapabilities = StreamingCapabilities()
    structured_output: StructuredOutputCapabilities = StructuredOutputCapabilities()
    transcripts: TranscriptCapabilities = TranscriptCapabilities()
    trimming: TrimmingCapabilities = TrimmingCapabilities()
    game: GameCapabilities = GameCapabilities()


class InitializeResult(_Result, frozen=True):
    protocol_version: int
    server_info: ServerInfo
    capabilities: Capabilities
    engines: list[EngineInfo]
    default_engine: str
    limits: Limits


class CreateResult(_Result, frozen=True):
    npc_id: str
    engine: str
    context_size: int


class RespondResult(_Result, frozen=True):
    npc_id: str
    turn_id: str


class SubmitResult(_Result, frozen=True):
    accepted: bool


class CancelResult(_Result, frozen=True):
    cancelled: list[str]


class RestoreResult(_Result, frozen=True):
    npc_id: str
    turns: int


class EmptyResult(_Result, frozen=True):
    pass


class NpcSummary(_Result, frozen=True):
    npc_id: str
    engine: str
    turns: int
    busy: bool
    queued: int


class NpcListResult(_Result, frozen=True):
    npcs: list[NpcSummary]


class CountTokensResult(_Result, frozen=True):
    tokens: int
    prompt_tokens: int | None
    context_size: int


class EngineStatusResult(_Result, frozen=True):
    engines: list[EngineInfo]
    default_engine: str


class WorldRevision(_Result, frozen=True):
    revision: int


class WorldDeleteResult(_Result, frozen=True):
    revision: int
    deleted: bool


class Fact(_Result, frozen=True):
    key: str
    value: Any
    npc_ids: list[str] | None = None
    tags: list[str] | None = None
    lore: bool = False


class WorldGetResult(_Result, frozen=True):
    revision: int
    facts: list[Fact]


# ---- events (notifications from the bridge); every one carries npcId, turnId, seq ----


class _Event(msgspec.Struct, frozen=True, rename="camel", kw_only=True):
    npc_id: str
    turn_id: str
    seq: int


TurnKind = Literal["respond", "decide", "prewarm"]


class TurnStarted(_Event, frozen=True):
    prompt: str
    speaker: str | None = None
    kind: TurnKind = "respond"


class TextDelta(_Event, frozen=True):
    delta: str
    text: str | None  # the step's text so far; null when the turn asked for deltas only
    is_reset: bool = False


class PartialJson(_Event, frozen=True):
    json: str | None  # the JSON text so far; null when the turn asked for deltas only
    delta: str = ""


class ToolCallRequested(_Event, frozen=True):
    call_id: str
    name: str
    arguments: dict[str, Any]
    timeout_ms: int


class ToolCallCompleted(_Event, frozen=True):
    call_id: str
    name: str
    output: Any = None
    error: str | None = None


class ToolCallWithdrawn(_Event, frozen=True):
    call_id: str
    name: str
    reason: Literal["cancelled", "timeout", "turn_ended"]


class ContextTrimmed(_Event, frozen=True):
    dropped_turns: int
    kept_turns: int
    prompt_tokens: int
    context_size: int


class ToolRecord(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    call_id: str
    name: str
    arguments: dict[str, Any]
    output: Any = None
    error: str | None = None


class RoutingInfo(msgspec.Struct, frozen=True, rename="camel"):
    """How a turn's first step chose its tool: ``policy`` ``model`` (the model chose;
    ``picked`` and ``score`` null) or ``semantic`` (the bridge picked a tool, or null: answer
    in words, with the winner's similarity to the line). ``lore``: under ``semantic``, the keys
    of the lore entries the bridge put with the facts for the line, the most similar first."""

    policy: Literal["model", "semantic"]
    picked: str | None = None
    score: float | None = None
    lore: list[str] = msgspec.field(default_factory=list)


class TurnCompleted(_Event, frozen=True, kw_only=True):
    text: str
    json: Any = None
    tool_calls: list[ToolRecord]
    usage: Usage
    steps: int
    finish_reason: str
    warnings: list[str] = []
    world_revision: int = 0
    routing: RoutingInfo | None = None


class ErrorInfo(msgspec.Struct, frozen=True, omit_defaults=True):
    code: str
    message: str
    retryable: bool
    # only when the error carries figures a game acts on (bridge.errors.EVENT_DATA)
    data: dict[str, int] | None = None


class TurnFailed(_Event, frozen=True):
    error: ErrorInfo


EVENTS: dict[str, type[_Event]] = {
    "turn/started": TurnStarted,
    "turn/textDelta": TextDelta,
    "turn/partialJson": PartialJson,
    "turn/toolCallRequested": ToolCallRequested,
    "turn/toolCallCompleted": ToolCallCompleted,
    "turn/toolCallWithdrawn": ToolCallWithdrawn,
    "turn/contextTrimmed": ContextTrimmed,
    "turn/completed": TurnCompleted,
    "turn/failed": TurnFailed,
}
EVENT_NAMES: dict[type[_Event], str] = {v: k for k, v in EVENTS.items()}
Event = (
    TurnStarted
    | TextDelta
    | PartialJson
    | ToolCallRequested
    | ToolCallCompleted
    | ToolCallWithdrawn
    | ContextTrimmed
    | TurnCompleted
    | TurnFailed
)
TERMINAL_EVENTS = frozenset({"turn/completed", "turn/failed"})
