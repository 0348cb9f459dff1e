"""A world fact's scope in the bounds (bridge/core/_world.py): its ``npcIds`` and ``tags`` count
in its size, their entries are bounded per fact and in all, and the scope index follows every
change in place (what each NPC sees is checked against every fact in tests/unit/test_world.py)."""

from __future__ import annotations

import gc

import pytest

from bridge.core import _messages as m
from bridge.core._world import World, fact_bytes
from bridge.errors import BridgeError


def refused(world: World, p: m.WorldSetParams) -> str:
    revision = world.revision
    with pytest.raises(BridgeError) as e:
        world.set(p)
    assert e.value.code == "limit_reached" and world.revision == revision
    return str(e.value.data["limit"])


def test_the_scope_counts_in_the_facts_bytes() -> None:
    assert fact_bytes(m.WorldSetParams(key="gate", value="shut")) == 4 + 6
    assert fact_bytes(m.WorldSetParams(key="gate", value="shut", tags=["a", "b"])) == 4 + 6 + 9
    assert fact_bytes(m.WorldSetParams(key="gate", value="shut", tags=[], npc_ids=["é"])) == 4 + 6 + 2 + 6
    world = World(m.Limits(max_world_fact_bytes=100, max_world_bytes=150))
    assert refused(world, m.WorldSetParams(key="k", value=1, tags=["x" * 95])) == "maxWorldFactBytes"
    world.set(m.WorldSetParams(key="a", value=1, tags=["x" * 80]))
    assert refused(world, m.WorldSetParams(key="b", value=1, npc_ids=["y" * 80])) == "maxWorldBytes"
    world.set(m.WorldSetParams(key="a", value=1))  # the replaced fact's scope bytes are freed
    world.set(m.WorldSetParams(key="b", value=1, npc_ids=["y" * 80]))


def test_scope_entries_are_bounded_per_fact_and_in_all_lore_included() -> None:
    world = World(m.Limits(max_fact_scopes=4, max_world_scopes=6))
    assert refused(world, m.WorldSetParams(key="k", value=1, tags=list("abcde"))) == "maxFactScopes"
    assert refused(world, m.WorldSetParams(key="k", value=1, tags=["a"] * 3, npc_ids=["n"] * 2)) == "maxFactScopes"
    world.set(m.WorldSetParams(key="a", value=1, tags=list("abcd")))
    world.set(m.WorldSetParams(key="b", value=1, npc_ids=["n1", "n2"], lore=True))
    assert refused(world, m.WorldSetParams(key="c", value=1, tags=["z"])) == "maxWorldScopes"
    world.set(m.WorldSetParams(key="a", value=1, tags=["a"]))  # replacing frees its entries
    world.set(m.WorldSetParams(key="c", value=1, tags=["z", "y", "x"]))
    assert refused(world, m.WorldSetParams(key="d", value=1, tags=["q"])) == "maxWorldScopes"
    world.delete("b")
    world.set(m.WorldSetParams(key="d", value=1, tags=["q"], npc_ids=["n1"]))
    assert world.view("n1", frozenset({"q"})).text.endswith("- d: 1")


def test_the_index_holds_nothing_for_a_scope_no_fact_has_and_nothing_the_collector_walks() -> None:
    world = World(m.Limits())
    for k in range(20):
        world.set(m.WorldSetParams(key=f"k{k}", value=k, tags=[f"t{k}-{i}" for i in range(1000)], lore=True))
    assert world.view("n", frozenset({"t3-7", "t4-8"})).lore == {"k3": 3, "k4": 4}
    tracked_before = len(gc.get_objects())
    for k in range(20):
        world.set(m.WorldSetParams(key=f"k{k}", value=k, tags=[f"u{k}-{i}" for i in range(1000)], lore=True))
    gc.collect()
    assert len(gc.get_objects()) - tracked_before < 200, "20,000 scope entries must not be 20,000 tracked objects"
    assert world.view("n", frozenset({"t3-7", "t4-8"})).lore == {}
    assert world.view("n", frozenset({"u3-7"})).lore == {"k3": 3}
    for k in range(20):
        world.delete(f"k{k}")
    assert (world._by_tag, world._by_npc, world._everyone, world._scopes) == ({}, {}, {}, 0)
