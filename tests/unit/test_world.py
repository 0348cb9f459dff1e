"""World state (bridge/core/_world.py) without a model: what each NPC sees, the bounds."""

from __future__ import annotations

import random

import pytest

from bridge.core import _messages as m
from bridge.core._world import FACTS_HEADER, World, render_value
from bridge.errors import BridgeError


def brute_force(world: World, npc_id: str, tags: frozenset[str]) -> tuple[str, dict]:
    """What the NPC sees, by checking every fact (the definition the index must match)."""
    facts = sorted((f for f in world.facts() if _visible(f, npc_id, tags)), key=lambda f: f.key)
    lines = [f"- {f.key}: {render_value(f.value)}" for f in facts if not f.lore]
    return (FACTS_HEADER + "\n" + "\n".join(lines) if lines else ""), {f.key: f.value for f in facts if f.lore}


def _visible(f: m.Fact, npc_id: str, tags: frozenset[str]) -> bool:
    if f.npc_ids is None and f.tags is None:
        return True
    return npc_id in (f.npc_ids or []) or bool(tags & set(f.tags or []))


def test_every_view_matches_checking_every_fact_through_random_changes() -> None:
    rng = random.Random(7)
    world = World(m.Limits())
    npcs = [(f"n{i}", frozenset(rng.sample(["a", "b", "c", "d"], rng.randint(0, 2)))) for i in range(12)]
    for step in range(400):
        key = f"k{rng.randint(0, 40)}"
        if rng.random() < 0.2:
            world.delete(key)
        else:
            scope = rng.choice(["all", "tags", "ids", "both"])
            tags = rng.sample(["a", "b", "c", "x"], rng.randint(1, 2)) if scope in ("tags", "both") else None
            ids = rng.sample([n for n, _ in npcs], rng.randint(1, 3)) if scope in ("ids", "both") else None
            world.set(
                m.WorldSetParams(
                    key=key, value=rng.choice(["v", 3, {"o": [1]}]), tags=tags, npc_ids=ids, lore=rng.random() < 0.3
                )
            )
        for npc_id, tags in rng.sample(npcs, 4):
            view = world.view(npc_id, tags)
            assert (view.text, view.lore) == brute_force(world, npc_id, tags), f"step {step}"
            assert view.revision == world.revision
            assert world.view(npc_id, tags) is view, "computed once per revision"
            assert (view.recall_tool is None) == (not view.lore)


def test_npcs_with_the_same_tags_and_no_fact_of_their_own_share_a_view() -> None:
    world = World(m.Limits())
    world.set(m.WorldSetParams(key="gate", value="shut", tags=["gate"]))
    world.set(m.WorldSetParams(key="secret", value=1, npc_ids=["spy"]))
    a, b = world.view("a", frozenset({"gate"})), world.view("b", frozenset({"gate"}))
    assert a is b and a.text == FACTS_HEADER + "\n- gate: shut"
    spy = world.view("spy", frozenset({"gate"}))
    assert spy is not a and spy.text == FACTS_HEADER + "\n- gate: shut\n- secret: 1"


def test_bounds_refuse_the_change_and_leave_the_world_as_it_was() -> None:
    world = World(m.Limits(max_world_fact_bytes=100, max_world_bytes=250, max_lore_bytes=300, max_lore_fact_bytes=200))
    world.set(m.WorldSetParams(key="a", value="x" * 90))
    world.set(m.WorldSetParams(key="b", value="x" * 90))
    for p, limit in (
        (m.WorldSetParams(key="c", value="x" * 120), "maxWorldFactBytes"),
        (m.WorldSetParams(key="c", value="x" * 90), "maxWorldBytes"),
        (m.WorldSetParams(key="l", value="x" * 250, lore=True), "maxLoreFactBytes"),
    ):
        with pytest.raises(BridgeError) as e:
            world.set(p)
        assert e.value.code == "limit_reached" and e.value.data["limit"] == limit
    assert world.revision == 2 and [f.key for f in world.facts()] == ["a", "b"]
    world.set(m.WorldSetParams(key="a", value="y" * 90))  # a replaced fact counts once
    world.delete("b")
    world.set(m.WorldSetParams(key="c", value="x" * 90))
    world.set(m.WorldSetParams(key="l1", value="x" * 150, lore=True))
    with pytest.raises(BridgeError) as e:
        world.set(m.WorldSetParams(key="l2", value="x" * 150, lore=True))
    assert e.value.data["limit"] == "maxLoreBytes"
    world.set(m.WorldSetParams(key="l1", value="x" * 10, lore=False))  # lore made a fact frees its lore bytes
    world.set(m.WorldSetParams(key="l2", value="x" * 150, lore=True))
    for bad, reason in (("k" * 257, "invalid_key"), ("two\nlines", "invalid_key")):
        with pytest.raises(BridgeError) as e:
            world.set(m.WorldSetParams(key=bad, value=1))
        assert e.value.data["reason"] == reason
