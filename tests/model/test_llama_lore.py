"""Lore without a tool call on the bundled model (``routing: "auto"``, semantic there): a
question about a fact only lore holds, asked in other words than the fact, gets the fact into
the instructions (retrieval, deterministic: asserted on at least 80% of the lines) and the
NPC's line says it (it opens with the entry's sentence that answers the question:
``_routing.lore_lead``; asserted on at least 80%); unrelated lines retrieve nothing.
Temperature 0.7, two seeds."""

from __future__ import annotations

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

LORE = {
    "the old mill": "The old mill burned down in the winter of the wolves. Nobody rebuilt it.",
    "the lighthouse keeper": "Old Brann kept the lighthouse for forty years until his eyes failed.",
    "the river ford": "The ford below the bridge floods every spring, so carts go round by the north road.",
    "the founding of the town": "Harrowgate was founded by salt traders who camped by the springs.",
    "the baron's daughter": "Lady Elsa, the baron's daughter, ran away with a travelling bard last summer.",
    "the silver mine": "The silver mine in the hills was sealed after a cave-in killed six miners.",
    "the harvest festival": "Every autumn the village lights bonfires on the green and crowns a harvest queen.",
    "the witch of the fen": "A healer lives alone in the fen; folk call her a witch but go to her when sick.",
}
# (line, the lore key that answers it, words of the fact a line that mentions it would say)
QUESTIONS = [
    ("What happened to the mill?", "the old mill", ("burn", "fire", "wolves")),
    ("Is the mill still grinding grain?", "the old mill", ("burn", "fire", "wolves")),
    ("Who used to look after the lighthouse?", "the lighthouse keeper", ("brann",)),
    ("Can I cross the river in spring?", "the river ford", ("flood", "north road")),
    ("Who started this town?", "the founding of the town", ("salt",)),
    ("Where did the baron's girl go?", "the baron's daughter", ("bard", "elsa")),
    ("Why is the mine closed?", "the silver mine", ("cave", "miners", "sealed")),
    ("What do folk do when autumn comes?", "the harvest festival", ("bonfire", "queen")),
    ("Is there anyone out in the marsh who can heal me?", "the witch of the fen", ("healer", "witch", "fen")),
    ("Tell me about the old lighthouse.", "the lighthouse keeper", ("brann", "forty")),
]
UNRELATED = ["Hello there!", "I'll take an ale, please.", "What's your name?", "Nice weather, isn't it?"]


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
