"""Lore without a tool call on the bundled model (``routing: "auto"``, semantic there): a
question about a fact only lore holds, asked in other words than the fact, gets the fact into
the instructions (retrieval, deterministic: asserted on at least 80% of the lines) and the
NPC's line says it (it opens with the entry's sentence that answers the question:
``_routing.lore_lead``; asserted on at least 80%); unrelated lines retrieve nothing.
Temperature 0.7, two seeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bridge import EngineRegistry, Service
from bridge.messages import (
    GenerationOptions,
    NpcConfig,
    NpcRef,
    Persona,
    RespondParams,
    TurnCompleted,
    TurnFailed,
    WorldSetParams,
)
from tests.support.needs import llama_model_problem, missing

problem = llama_model_problem()
if problem:
    missing(problem)

# The lore set, shared with bench/bench_quality.py: (line, the lore key that answers it, words
# of the fact a line that mentions it would say), and lines that call for no lore.
_SET = json.loads((Path(__file__).resolve().parents[2] / "bench" / "quality" / "lore.json").read_text())
LORE: dict[str, str] = _SET["lore"]
QUESTIONS = [(q["prompt"], q["key"], tuple(q["words"])) for q in _SET["questions"]]
UNRELATED: list[str] = _SET["unrelated"]


async def ask(svc: Service, npc: str, line: str, seed: int) -> TurnCompleted:
    options = GenerationOptions(temperature=0.7, seed=seed, max_tokens=60)
    persona = Persona(name="Greta", role="innkeeper of Harrowgate")
    await svc.create(NpcConfig(npc_id=npc, persona=persona, options=options))
    turn = svc.respond(RespondParams(npc_id=npc, prompt=line))
    try:
        async for ev in svc.events(turn.turn_id):
            if isinstance(ev, TurnCompleted):
                return ev
            if isinstance(ev, TurnFailed):
                raise AssertionError(f"{line!r}: {ev.error}")
        raise AssertionError("no turn/completed")
    finally:
        svc.delete(NpcRef(npc_id=npc))


@pytest.mark.parametrize("seed", [1, 2])
async def test_lore_reaches_the_bundled_model_without_a_tool_call(seed: int) -> None:
    retrieved, mentioned, seen = 0, 0, []
    async with Service.running(EngineRegistry(default="llama")) as svc:
        for key, value in LORE.items():
            svc.world_set(WorldSetParams(key=key, value=value, lore=True))
        for i, (line, key, words) in enumerate(QUESTIONS):
            done = await ask(svc, f"greta{i}", line, seed)
            assert done.routing is not None and done.routing.policy == "semantic" and not done.tool_calls
            hit = key in done.routing.lore
            said = hit and any(w in done.text.lower() for w in words)
            retrieved += hit
            mentioned += said
            seen.append((line, done.routing.lore, said, done.text))
        for j, line in enumerate(UNRELATED):
            done = await ask(svc, f"other{j}", line, seed)
            assert done.routing is not None and done.routing.lore == [], (line, done.routing)
    n = len(QUESTIONS)
    print(f"\nseed {seed}: lore retrieved {retrieved}/{n}, the model's line mentions it {mentioned}/{n}")
    for row in seen:
        print("  ", row)
    assert retrieved >= 0.8 * n, seen
    assert mentioned >= 0.8 * n, seen  # the line opens with the retrieved sentence (lore_lead)
