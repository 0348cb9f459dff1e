"""A world fact's scope (its ``npcIds`` and ``tags``) is inside the world's bounds, and a
flood of facts scoped to huge lists of tags neither grows the bridge's memory nor stalls the
NPCs that stream meanwhile; through the real ``oam-bridge`` subprocess over real pipes.

Both tests failed on commit a76effb, before the fix: a fact's scope counted nowhere (12
``world/set`` of a 3-byte value with 360,000 tags each were accepted, RSS 77 -> 680 MB,
``npc/list`` waited up to 34 s, ``world/get`` answered 46 MB). ``OAM_BRIDGE_ROOT=<a checkout
of it>`` runs this file's bridges from that tree (tests/support/harness.py).
"""

from __future__ import annotations

import json
import time

import trio

from tests.support.harness import Proc, RpcError, bridge, words
from tests.support.procfs import rss_kib


def _serialised(b: Proc) -> None:
    """Let several tasks of the test send to ``b`` at once (one write at a time)."""
    lock = trio.Lock()
    send_raw = b.send_raw

    async def send_locked(data: bytes) -> None:
        async with lock:
            await send_raw(data)

    b.send_raw = send_locked  # type: ignore[method-assign]


async def _refused(b: Proc, params: dict[str, object]) -> str:
    """The ``data.limit`` of a ``world/set`` that must be refused with ``limit_reached``."""
    try:
        await b.call("world/set", params)
    except RpcError as e:
        assert e.code == "limit_reached", e.error
        return str(e.data["limit"])
    raise AssertionError(f"world/set of {len(json.dumps(params))} bytes was accepted")


async def test_a_fact_scope_counts_in_its_size_and_is_bounded_in_entries() -> None:
    async with bridge() as b:
        limits = (await b.initialize())["limits"]
        assert (limits["maxFactScopes"], limits["maxWorldScopes"]) == (1024, 65536)
        # one fact: 1025 entries, however short, are past maxFactScopes ...
        assert await _refused(b, {"key": "k", "value": 1, "tags": list("abcdefghijklmnopqrstuvwxyz") * 40}) == (
            "maxFactScopes"
        )
        assert await _refused(b, {"key": "k", "value": 1, "tags": ["t"] * 600, "npcIds": ["n"] * 425}) == (
            "maxFactScopes"
        )
        # ... and 1000 tags of 16 bytes (about 19 KB of JSON) are past maxWorldFactBytes (16 KiB)
        assert await _refused(b, {"key": "k", "value": 1, "tags": [f"{i:016d}" for i in range(1000)]}) == (
            "maxWorldFactBytes"
        )
        # the scopes of all facts, lore included: 64 facts of 1024 tags fill maxWorldScopes
        for k in range(64):
            tags = [f"{k}:{i}" for i in range(1024)]
            await b.call("world/set", {"key": f"lore {k}", "value": "x", "tags": tags, "lore": True})
        assert await _refused(b, {"key": "one more", "value": "x", "tags": ["a"]}) == "maxWorldScopes"
        assert (await b.call("world/delete", {"key": "lore 0"}))["deleted"]
        await b.call("world/set", {"key": "one more", "value": "x", "tags": ["a"]})
        world = await b.call("world/get", {})
        assert world["revision"] == 66 and len(world["facts"]) == 64, "a refused change changes nothing"
        assert sum(len(f["tags"]) for f in world["facts"]) == 63 * 1024 + 1
        await b.finish()


async def test_a_flood_of_huge_scopes_neither_grows_memory_nor_stalls_the_npcs() -> None:
    async with bridge(guard=60) as b:
        b.keep_raw = False
        _serialised(b)
        await b.initialize()
        for i in range(5):
            script = [{"text": words(60), "chunkMs": 10}] * 50
            await b.call("npc/create", {"npcId": f"n{i}", "tags": [f"t{i}", "village"], "script": script})
        stop = trio.Event()
        waits: list[float] = []
        done: list[dict[str, object]] = []

        async def stream(npc_id: str) -> None:
            while not stop.is_set():
                done.append((await b.turn(npc_id, "Go on.", fullText=False))[1])

        async def list_npcs() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                await b.call("npc/list")
                waits.append(time.perf_counter() - t0)
                await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            for i in range(5):
                nursery.start_soon(stream, f"n{i}")
            await trio.sleep(0.5)
            rss_before = rss_kib(b.pid)
            nursery.start_soon(list_npcs)
            limits = []
            for k in range(6):  # 3.3 MB lines, under maxLineBytes (4 MiB)
                tags = [f"t{j}" for j in range(300_000)]
                limits.append(await _refused(b, {"key": f"k{k}", "value": "abc", "tags": tags}))
            await trio.sleep(0.5)  # every NPC's next step has started since
            stop.set()
        grown = rss_kib(b.pid) - rss_before
        assert limits == ["maxFactScopes"] * 6
        assert (await b.call("world/get", {}))["facts"] == []
        assert grown < 64 * 1024, f"RSS grew {grown // 1024} MiB over the flood"
        assert max(waits) < 1.0, f"npc/list waited up to {max(waits):.2f} s during the flood"
        assert done and all(e["method"] == "turn/completed" for e in done)
        await b.finish()
