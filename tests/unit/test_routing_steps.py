"""The steps routing shapes. ``npc/prewarm`` prepares the step the NPC's policy will run: under
``semantic`` routing the bridge's ``recall`` is not offered (the line's lore joins the facts
instead) and the first step shows no tools until a line picks one; under ``model`` the step
offers every tool and recall. A game that names ``recall`` as the tool choice always gets it."""

from __future__ import annotations

from typing import Any

import trio

from bridge import EngineRegistry, ScriptedEngine, Service
from bridge.core import _messages as m
from bridge.engines.base import StepRequest, Usage
from tests.support.needs import require

require("wordllama", "the vectors semantic routing reads; make setup installs it with the llama extra")

INVENTORY = m.ToolSpec(
    name="check_inventory",
    description="How many of an item are in stock.",
    parameters={"type": "object", "properties": {"item": {"type": "string"}}},
)


class PrewarmingEngine(ScriptedEngine):
    """The scripted engine, keeping each request ``npc/prewarm`` hands it."""

    def __init__(self) -> None:
        super().__init__()
        self.prewarmed: list[StepRequest] = []

    async def prewarm(self, request: StepRequest) -> Usage:
        self.prewarmed.append(request)
        return Usage()


async def prewarm_request(routing: m.RoutingPolicy) -> StepRequest:
    engine = PrewarmingEngine()
    with trio.fail_after(10):
        async with Service.running(EngineRegistry(default="scripted", scripted=engine)) as svc:
            svc.world_set(m.WorldSetParams(key="the old mill", value="It burned down.", lore=True))
            await svc.create(m.NpcConfig(npc_id="miller", tools=[INVENTORY], routing=routing, script=[]))
            turn = svc.prewarm(m.PrewarmParams(npc_id="miller"))
            async for ev in svc.events(turn.turn_id):
                assert not isinstance(ev, m.TurnFailed), ev
    [request] = engine.prewarmed
    return request


async def test_a_prewarm_under_semantic_routing_offers_no_recall_and_no_tools() -> None:
    request = await prewarm_request("semantic")
    assert request.tools == [] and request.tool_mode == "disallowed"


async def test_a_prewarm_under_model_routing_offers_the_tools_and_recall() -> None:
    request = await prewarm_request("model")
    assert [t.name for t in request.tools] == ["check_inventory", "recall"]


async def test_a_game_that_names_recall_gets_it_under_semantic_routing() -> None:
    engine = ScriptedEngine()
    script = [{"toolCalls": [{"id": "c1", "name": "recall", "arguments": {"topic": "the old mill"}}]}, {"text": "Ash."}]
    with trio.fail_after(10):
        async with Service.running(EngineRegistry(default="scripted", scripted=engine)) as svc:
            svc.world_set(m.WorldSetParams(key="the old mill", value="It burned down.", lore=True))
            await svc.create(m.NpcConfig(npc_id="miller", routing="semantic", script=script))
            turn = svc.respond(
                m.RespondParams(npc_id="miller", prompt="The mill?", tool_choice=m.NamedTool(tool="recall"))
            )
            done = [ev async for ev in svc.events(turn.turn_id)][-1]
    assert isinstance(done, m.TurnCompleted), done
    assert [(c.name, c.output) for c in done.tool_calls] == [("recall", "It burned down.")]
    assert [t.name for t in engine.requests[0].tools] == ["recall"]


async def test_a_first_step_the_bridge_routed_to_a_tool_makes_one_call() -> None:
    engine = ScriptedEngine()
    menu = m.ToolSpec(
        name="get_menu",
        description="Read the tavern's menu: dishes and drinks with prices.",
        examples=["What do you serve?", "What's to eat?"],
    )
    with trio.fail_after(10):
        async with Service.running(EngineRegistry(default="scripted", scripted=engine)) as svc:
            script = [{"toolCalls": [{"id": "c1", "name": "get_menu", "arguments": {}}]}, {"text": "Stew."}]
            await svc.create(m.NpcConfig(npc_id="k", tools=[menu], routing="semantic", script=script))
            turn = svc.respond(m.RespondParams(npc_id="k", prompt="What do you have to eat tonight?"))
            async for done in svc.events(turn.turn_id):
                if isinstance(done, m.ToolCallRequested):
                    svc.submit(m.SubmitParams(npc_id="k", call_id=done.call_id, output={"stew": "3 copper"}))
    assert isinstance(done, m.TurnCompleted) and done.routing is not None and done.routing.picked == "get_menu"
    first = engine.requests[0]
    assert [t.name for t in first.tools] == ["get_menu"] and first.max_calls == 1


REMEDY = m.ToolSpec(
    name="sell_remedy",
    description="Sell the player a remedy: a healing potion, an antidote for poison or venom, or a sleeping draught.",
    parameters={
        "type": "object",
        "properties": {"remedy": {"type": "string", "enum": ["healing potion", "antidote", "sleeping draught"]}},
    },
)
HEAL = m.ToolSpec(
    name="heal_wounds",
    description="Heal the player's wounds.",
    parameters={"type": "object", "properties": {"injury": {"type": "string", "maxLength": 60}}},
)


async def arguments_seen(
    routing: m.RoutingPolicy, tool: m.ToolSpec, arguments: dict[str, str], line: str
) -> tuple[list[dict[str, Any]], list[str], StepRequest]:
    """A turn on the scripted engine whose model calls ``tool`` with ``arguments`` on ``line``
    (``toolChoice`` required): what the game was asked to run, the warnings, the first request."""
    engine = ScriptedEngine()
    script = [{"toolCalls": [{"id": "c1", "name": tool.name, "arguments": arguments}]}, {"text": "There."}]
    seen: list[dict[str, Any]] = []
    with trio.fail_after(10):
        async with Service.running(EngineRegistry(default="scripted", scripted=engine)) as svc:
            await svc.create(m.NpcConfig(npc_id="maren", tools=[tool], routing=routing, script=script))
            turn = svc.respond(m.RespondParams(npc_id="maren", prompt=line, tool_choice="required"))
            async for done in svc.events(turn.turn_id):
                if isinstance(done, m.ToolCallRequested):
                    seen.append(done.arguments)
                    svc.submit(m.SubmitParams(npc_id="maren", call_id=done.call_id, output={"ok": True}))
    assert isinstance(done, m.TurnCompleted), done
    return seen, done.warnings, engine.requests[0]


async def test_under_semantic_routing_the_value_the_line_means_reaches_the_engine_and_the_game() -> None:
    line = "Do you have anything for snake venom?"
    seen, warnings, first = await arguments_seen("semantic", REMEDY, {"remedy": "healing potion"}, line)
    assert first.pinned == {"sell_remedy": {"remedy": "antidote"}}, "a constraining engine holds the call to it"
    assert seen == [{"remedy": "antidote"}] and len(warnings) == 1
    seen, warnings, first = await arguments_seen("model", REMEDY, {"remedy": "healing potion"}, line)
    assert first.pinned == {} and seen == [{"remedy": "healing potion"}] and warnings == []


async def test_under_semantic_routing_a_free_string_is_a_span_of_the_line() -> None:
    line = "I took an arrow in the leg, can you patch me up?"
    seen, _, _ = await arguments_seen("semantic", HEAL, {"injury": "You are mending your injury."}, line)
    assert seen == [{"injury": "took an arrow in the leg"}]
    seen, _, _ = await arguments_seen("model", HEAL, {"injury": "You are mending your injury."}, line)
    assert seen == [{"injury": "You are mending your injury."}], "a model that routes well keeps its words"
