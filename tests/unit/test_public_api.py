"""The public in-process API: ``bridge`` and ``bridge.messages`` export exactly the documented
names, every wire type is among them, and an NPC can be created, spoken to and saved with
nothing but public imports (this file imports nothing else from ``bridge``)."""

from __future__ import annotations

import ast
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import trio

import bridge
from bridge import EngineRegistry, ScriptedEngine, Service, messages
from bridge.messages import (
    PROTOCOL_VERSION,
    Event,
    InitializeParams,
    NpcConfig,
    NpcRef,
    Persona,
    RespondParams,
    RestoreParams,
    SubmitParams,
    TextDelta,
    ToolCallRequested,
    ToolSpec,
    TurnCompleted,
    TurnStarted,
)

BRIDGE_API = {
    "__version__",
    "Service",
    "Server",
    "EngineRegistry",
    "ScriptedEngine",
    "Limits",
    "BridgeError",
    "ErrorKind",
    "ERROR_CODES",
    "messages",
}

PARAMS = {
    "ClientInfo", "CountTokensParams", "DecideParams", "DecisionOption", "EmptyParams", "Fallbacks",
    "GenerationOptions", "GuardrailPolicy", "InitializeParams", "Message", "NamedTool", "NpcConfig", "NpcRef",
    "Persona", "PrewarmParams", "RespondParams", "RestoreParams", "RoutingPolicy", "Save", "SetTagsParams",
    "SubmitParams",
    "ToolCall", "ToolChoice", "ToolSpec", "WorldGetParams", "WorldKey", "WorldSetParams",
}  # fmt: skip
RESULTS = {
    "CancelResult", "Capabilities", "CountTokensResult", "CreateResult", "EmptyResult", "EngineInfo",
    "EngineStatusResult", "Fact", "GameCapabilities", "InitializeResult", "NpcListResult", "NpcSummary",
    "RespondResult", "RestoreResult", "ServerInfo", "StreamingCapabilities", "StructuredOutputCapabilities",
    "SubmitResult", "ToolCapabilities", "TranscriptCapabilities", "TrimmingCapabilities", "WorldDeleteResult",
    "WorldGetResult", "WorldRevision",
}  # fmt: skip
EVENTS = {
    "ContextTrimmed", "ErrorInfo", "Event", "PartialJson", "TextDelta", "ToolCallCompleted", "ToolCallRequested",
    "ToolCallWithdrawn", "RoutingInfo", "ToolRecord", "TurnCompleted", "TurnFailed", "TurnKind", "TurnStarted",
    "Usage",
}  # fmt: skip
MESSAGES_API = {"PROTOCOL_VERSION", "Limits"} | PARAMS | RESULTS | EVENTS


def test_bridge_exports_exactly_the_documented_names() -> None:
    assert len(bridge.__all__) == len(set(bridge.__all__))
    assert set(bridge.__all__) == BRIDGE_API
    for name in bridge.__all__:
        assert getattr(bridge, name) is not None, name
    assert bridge.messages is messages and bridge.Limits is messages.Limits


def test_bridge_messages_exports_exactly_the_documented_names() -> None:
    assert len(messages.__all__) == len(set(messages.__all__))
    assert set(messages.__all__) == MESSAGES_API
    for name in messages.__all__:
        assert getattr(messages, name) is not None, name


def test_every_wire_type_is_public() -> None:
    """The structs bridge.messages exports are exactly those that a method's params or
    result or an event is made of, to any depth."""
    from bridge.core._messages import EVENTS as EVENT_TYPES  # the tables to walk; not the API
    from bridge.core._methods import PARAMS as PARAMS_TYPES
    from bridge.core._methods import RESULTS as RESULT_TYPES

    roots = [*PARAMS_TYPES.values(), *(t for t in RESULT_TYPES.values() if t is not None), *EVENT_TYPES.values()]
    seen: set[type] = set()
    todo: list[msgspec.inspect.Type] = list(msgspec.inspect.multi_type_info(roots))
    while todo:
        t = todo.pop()
        if isinstance(t, msgspec.inspect.StructType):
            if t.cls in seen:
                continue
            seen.add(t.cls)
            todo += [f.type for f in t.fields]
        elif isinstance(t, msgspec.inspect.UnionType):
            todo += list(t.types)
        elif isinstance(t, (msgspec.inspect.ListType, msgspec.inspect.TupleType, msgspec.inspect.DictType)):
            todo += [getattr(t, a) for a in ("item_type", "key_type", "value_type") if hasattr(t, a)]
        elif isinstance(t, msgspec.inspect.VarTupleType):
            todo.append(t.item_type)
    exported = (getattr(messages, n) for n in messages.__all__)
    public = {t for t in exported if isinstance(t, type) and issubclass(t, msgspec.Struct)}
    missing, extra = sorted(c.__name__ for c in seen - public), sorted(c.__name__ for c in public - seen)
    assert not missing, f"wire types bridge.messages does not export: {missing}"
    assert not extra, f"bridge.messages exports structs not on the wire: {extra}"


def test_this_file_uses_only_the_public_api() -> None:
    tree = ast.parse(Path(__file__).read_text(encoding="utf-8"))
    top_level = [n for n in tree.body if isinstance(n, (ast.Import, ast.ImportFrom))]
    modules = {n.module for n in top_level if isinstance(n, ast.ImportFrom)}
    modules |= {a.name for n in top_level if isinstance(n, ast.Import) for a in n.names}
    assert {m for m in modules if m and m.startswith("bridge")} == {"bridge", "bridge.messages"}


INVENTORY = ToolSpec(
    name="check_inventory",
    parameters={"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
)


async def test_an_in_process_round_trip_with_public_imports_only() -> None:
    script = [
        {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]},
        {"text": "Three barrels left."},
    ]
    registry = EngineRegistry(default="scripted", scripted=ScriptedEngine())
    with trio.fail_after(10):
        async with Service.running(registry) as svc:
            assert svc.initialize(InitializeParams(protocol_version=PROTOCOL_VERSION)).protocol_version == 1
            persona = Persona(name="Mara", role="the innkeeper")
            created = await svc.create(NpcConfig(npc_id="keeper", persona=persona, tools=[INVENTORY], script=script))
            assert created.engine == "scripted"
            turn = svc.respond(RespondParams(npc_id="keeper", prompt="Any ale?"))
            events = [ev async for ev in _answered(svc, turn.turn_id)]
            assert isinstance(events[0], TurnStarted)
            done = events[-1]
            assert isinstance(done, TurnCompleted) and done.text == "Three barrels left."
            assert done.tool_calls[0].output == {"count": 3}
            assert "".join(ev.delta for ev in events if isinstance(ev, TextDelta)) == "Three barrels left."
            save = svc.transcript(NpcRef(npc_id="keeper"))
            restored = await svc.restore(RestoreParams(save=save, npc_id="keeper2"))
            assert restored.turns == 1
            assert msgspec.json.decode(msgspec.json.encode(save))["config"]["npcId"] == "keeper"


async def _answered(svc: Service, turn_id: str) -> AsyncIterator[Event]:
    """The turn's events, each tool call answered as the game would."""
    async for ev in svc.events(turn_id):
        if isinstance(ev, ToolCallRequested):
            svc.submit(SubmitParams(npc_id="keeper", call_id=ev.call_id, output={"count": 3}))
        yield ev
