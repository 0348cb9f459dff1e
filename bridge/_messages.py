"""The wire types: the source of truth for protocol.md (tests/test_protocol_doc.py keeps
them in sync). Params are decoded once the method is known; unknown fields are rejected."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from .engines.base import GenerationOptions, Message, ToolSpec, Usage

PROTOCOL_VERSION = 1


class _Params(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    pass


class ClientInfo(_Params):
    name: str
    version: str = ""


class InitializeParams(_Params):
    protocol_version: int
    client_info: ClientInfo | None = None


class EmptyParams(_Params):
    pass


class Persona(_Params):
    name: str
    role: str = ""
    traits: list[str] = []
    speech_style: str = ""


class NpcConfig(_Params):
    """What ``npc/create`` takes; also the config part of a save."""

    npc_id: str
    instructions: str | None = None
    persona: Persona | None = None
    tools: list[ToolSpec] = []
    engine: str = "auto"
    model: str | None = None  # llama engine: a GGUF file for this NPC (default: the bridge's)
    options: GenerationOptions = GenerationOptions()
    script: list[Any] | None = None


class NamedTool(_Params):
    tool: str


ToolChoice = Literal["auto", "required", "none"] | NamedTool


class RespondParams(_Params):
    npc_id: str
    prompt: str
    tool_choice: ToolChoice = "auto"
    max_tool_rounds: int = 4
    max_tool_calls: int = 8
    schema: dict[str, Any] | None = None
    tool_timeout_ms: int = 60_000
    full_text: bool = True  # textDelta/partialJson carry the text so far (False: deltas only)


class SubmitParams(_Params):
    npc_id: str
    call_id: str
    output: Any = None
    error: str | None = None


class NpcRef(_Params):
    npc_id: str


class Save(_Params):
    """What ``npc/transcript`` returns and ``npc/restore`` takes back."""

    version: int
    config: NpcConfig
    turns: list[list[Message]]


class RestoreParams(_Params):
    save: Save
    npc_id: str | None = None


class CountTokensParams(_Params):
    text: str
    npc_id: str | None = None
    engine: str | None = None


PARAMS: dict[str, type[msgspec.Struct]] = {
    "initialize": InitializeParams,
    "shutdown": EmptyParams,
    "exit": EmptyParams,
    "npc/create": NpcConfig,
    "npc/respond": RespondParams,
    "npc/submit": SubmitParams,
    "npc/cancel": NpcRef,
    "npc/transcript": NpcRef,
    "npc/restore": RestoreParams,
    "npc/reset": NpcRef,
    "npc/delete": NpcRef,
    "npc/list": EmptyParams,
    "tokens/count": CountTokensParams,
    "engine/status": EmptyParams,
}


# ---- events (notifications from the bridge); every one carries npcId, turnId, seq ----


class _Event(msgspec.Struct, frozen=True, rename="camel", kw_only=True):
    npc_id: str
    turn_id: str
    seq: int


class TurnStarted(_Event):
    prompt: str


class TextDelta(_Event):
    delta: str
    text: str | None  # the step's text so far; null when the turn asked for deltas only
    is_reset: bool = False


class PartialJson(_Event):
    json: str | None  # the JSON text so far; null when the turn asked for deltas only
    delta: str = ""


class ToolCallRequested(_Event):
    call_id: str
    name: str
    arguments: dict[str, Any]
    timeout_ms: int


class ToolCallCompleted(_Event):
    call_id: str
    name: str
    output: Any = None
    error: str | None = None


class ToolCallWithdrawn(_Event):
    call_id: str
    name: str
    reason: Literal["cancelled", "timeout", "turn_ended"]


class ContextTrimmed(_Event):
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


class TurnCompleted(_Event, kw_only=True):
    text: str
    json: Any = None
    tool_calls: list[ToolRecord]
    usage: Usage
    steps: int
    finish_reason: str
    warnings: list[str] = []


class ErrorInfo(msgspec.Struct, frozen=True):
    code: str
    message: str
    retryable: bool


class TurnFailed(_Event):
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
TERMINAL_EVENTS = frozenset({"turn/completed", "turn/failed"})
