"""Routing on the bundled model with default settings (``routing: "auto"``, which routes
semantically because the llama engine flags the bundled model ``weak_tool_choice``): the
seeds' tavern set (bench/quality/exchanges.json ``routing``, its tools' examples from
bench/quality/routing_sets.json) gets the right first action on at least 7 of 8 lines, at
temperature 0.7, with two seeds."""

from __future__ import annotations

import json
import os

import pytest

from bridge import EngineRegistry, Service
from bridge.messages import (
    GenerationOptions,
    NpcConfig,
    NpcRef,
    Persona,
    RespondParams,
    SubmitParams,
    ToolCallRequested,
    ToolSpec,
    TurnCompleted,
    TurnFailed,
)
from tests.support.harness import ROOT
from tests.support.needs import llama_model_problem, missing

problem = llama_model_problem()
if problem:
    missing(problem)

EXCHANGES = json.load(open(os.path.join(ROOT, "bench", "quality", "exchanges.json"), encoding="utf-8"))
EXAMPLES = json.load(open(os.path.join(ROOT, "bench", "quality", "routing_sets.json"), encoding="utf-8"))
ROUTE = EXCHANGES["routing"]
SPEC = EXCHANGES["personas"][ROUTE["npc"]]
TOOLS = [
    ToolSpec(
        name=n,
        description=EXCHANGES["tools"][n]["description"],
        parameters=EXCHANGES["tools"][n]["parameters"],
        examples=EXAMPLES["tavern_examples"][n],
    )
    for n in SPEC["tools"]
]


@pytest.mark.parametrize("seed", [1, 2])
async def test_the_tavern_set_is_routed_right_with_default_settings(seed: int) -> None:
    persona = Persona(name=SPEC["persona"]["name"], role=SPEC["persona"]["role"])
    right, seen = 0, []
    async with Service.running(EngineRegistry(default="llama")) as svc:
        for i, line in enumerate(ROUTE["lines"]):
            npc = f"greta{i}"
            options = GenerationOptions(temperature=0.7, seed=seed)
            await svc.create(NpcConfig(npc_id=npc, persona=persona, tools=TOOLS, options=options))
            turn = svc.respond(RespondParams(npc_id=npc, prompt=line["prompt"], max_tool_rounds=1))
            first = None
            async for ev in svc.events(turn.turn_id):
                if isinstance(ev, ToolCallRequested):
                    first = first or ev.name
                    svc.submit(
                        SubmitParams(npc_id=npc, call_id=ev.call_id, output=EXCHANGES["tools"][ev.name]["answer"])
                    )
                elif isinstance(ev, TurnCompleted):
                    assert ev.routing is not None and ev.routing.policy == "semantic"
                    # the first call made, also one whose arguments the bridge refused (the grammar
                    # does not enforce take_order's quantity bounds): routing is what is measured
                    first = first or (ev.tool_calls[0].name if ev.tool_calls else None)
                elif isinstance(ev, TurnFailed):
                    raise AssertionError(f"{line['prompt']!r}: {ev.error}")
            right += first == line["right"]
            seen.append((line["prompt"], first, line["right"]))
            svc.delete(NpcRef(npc_id=npc))
    assert right >= 7, seen
