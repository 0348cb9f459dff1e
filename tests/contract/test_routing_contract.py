"""routing on the scripted engine, in process: the new fields on the wire (npc/create and
npc/respond ``routing``, tools' ``examples``, turn/completed ``routing``) and what each policy
does to the first step."""

from __future__ import annotations

from typing import Any

import msgspec

from bridge import EngineRegistry, Service
from bridge.messages import (
    NpcConfig,
    RespondParams,
    SubmitParams,
    ToolCallRequested,
    ToolSpec,
    TurnCompleted,
    WorldSetParams,
)
from tests.support.needs import require

TOOLS = [
    ToolSpec(
        name="get_menu",
        description="Look up what the tavern serves and what each thing costs.",
        examples=["What's on the menu?", "How much for a drink?"],
    ),
    ToolSpec(
        name="take_order",
        description="The player has just ordered food or drink: put the order in.",
        parameters={"type": "object", "properties": {"item": {"type": "string", "enum": ["ale", "stew"]}}},
        examples=["I'll take an ale.", "Bring me some food."],
    ),
]
ORDER = {"toolCalls": [{"id": "c1", "name": "take_order", "arguments": {"item": "stew"}}]}


async def turn(svc: Service, params: RespondParams) -> tuple[list[str], TurnCompleted]:
    t = svc.respond(params)
    called = []
    async for ev in svc.events(t.turn_id):
        if isinstance(ev, ToolCallRequested):
            called.append(ev.name)
            svc.submit(SubmitParams(npc_id=params.npc_id, call_id=ev.call_id, output={"ok": True}))
        if isinstance(ev, TurnCompleted):
            return called, ev
    raise AssertionError("no turn/completed")


def wire(ev: TurnCompleted) -> Any:
    return msgspec.json.decode(msgspec.json.encode(ev))["routing"]


async def test_the_scripted_engine_leaves_the_choice_to_the_model_by_default() -> None:
    async with Service.running(EngineRegistry(default="scripted")) as svc:
        await svc.create(NpcConfig(npc_id="k", tools=TOOLS, script=[{"text": "Evening."}]))
        called, done = await turn(svc, RespondParams(npc_id="k", prompt="Bring me a bowl of stew."))
        assert called == [] and wire(done) == {"policy": "model", "picked": None, "score": None, "lore": []}
        # nothing to choose: no routing
        _, done = await turn(svc, RespondParams(npc_id="k", prompt="Hi", tool_choice="none"))
        assert done.routing is None


async def test_semantic_routing_forces_the_nearest_tool_or_words() -> None:
    require("wordllama", "the vectors semantic routing reads; make setup installs it with the llama extra")
    async with Service.running(EngineRegistry(default="scripted")) as svc:
        script = [ORDER, {"text": "Stew it is."}, {"text": "Evening to you."}]
        await svc.create(NpcConfig(npc_id="k", tools=TOOLS, script=script, routing="semantic"))
        called, done = await turn(svc, RespondParams(npc_id="k", prompt="Bring me a bowl of stew."))
        assert called == ["take_order"] and done.text == "Stew it is."
        routed = wire(done)
        assert routed["policy"] == "semantic" and routed["picked"] == "take_order" and routed["score"] > 0
        called, done = await turn(svc, RespondParams(npc_id="k", prompt="Good evening to you!"))
        assert called == [] and wire(done)["picked"] is None


async def test_a_turn_overrides_the_npc_s_routing() -> None:
    async with Service.running(EngineRegistry(default="scripted")) as svc:
        await svc.create(NpcConfig(npc_id="k", tools=TOOLS, script=[ORDER, {"text": "Done."}], routing="semantic"))
        params = RespondParams(npc_id="k", prompt="Hello there!", routing="model")
        called, done = await turn(svc, params)
        assert called == ["take_order"] and wire(done)["policy"] == "model"


def test_examples_and_routing_decode_from_the_wire() -> None:
    raw = b'{"npcId":"k","tools":[{"name":"t","examples":["hi"]}],"routing":"semantic"}'
    config = msgspec.json.decode(raw, type=NpcConfig)
    assert config.routing == "semantic" and config.tools[0].examples == ["hi"]
    p = msgspec.json.decode(b'{"npcId":"k","prompt":"x","routing":"auto"}', type=RespondParams)
    assert p.routing == "auto"


MILL = "The old mill burned down in the winter of the wolves."


async def test_semantic_routing_puts_the_lore_the_line_calls_for_in_the_instructions() -> None:
    require("wordllama", "the vectors semantic routing reads; make setup installs it with the llama extra")
    async with Service.running(EngineRegistry(default="scripted")) as svc:
        svc.world_set(WorldSetParams(key="the old mill", value=MILL, lore=True))
        svc.world_set(WorldSetParams(key="the baron's vault", value="Gold under the chapel.", lore=True, tags=["x"]))
        echo = [{"echo": "instructions"}, {"echo": "instructions"}]
        await svc.create(NpcConfig(npc_id="k", instructions="Be brief.", script=echo, routing="semantic"))
        _, done = await turn(svc, RespondParams(npc_id="k", prompt="What happened to the mill?"))
        assert MILL in done.text and "vault" not in done.text and wire(done)["lore"] == ["the old mill"]
        _, done = await turn(svc, RespondParams(npc_id="k", prompt="I'll take an ale, please."))
        assert MILL not in done.text and wire(done)["lore"] == []


async def test_model_routing_retrieves_no_lore() -> None:
    async with Service.running(EngineRegistry(default="scripted")) as svc:
        svc.world_set(WorldSetParams(key="the old mill", value=MILL, lore=True))
        await svc.create(NpcConfig(npc_id="k", script=[{"echo": "instructions"}], routing="model"))
        _, done = await turn(svc, RespondParams(npc_id="k", prompt="What happened to the mill?"))
        assert MILL not in done.text and wire(done) == {"policy": "model", "picked": None, "score": None, "lore": []}
