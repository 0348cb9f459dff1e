"""A soak of the llama engine's batching (issue 12): NPCs on the real bundled model through the
real ``oam-bridge`` subprocess, each asking turn after turn, with random cancels, forced tool
calls answered by the game, and deletes with re-creates, on fewer places and cells than
NPCs. Every turn must end with exactly one terminal event within 120 s and the bridge must
exit 0 at stdin EOF; prints the counts of turns and of how they ended.

Usage: python bench/soak_llama.py [--seconds 150] [--npcs 16] [--parallel 4] [--ctx 2048]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys

import trio

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.support.harness import open_bridge  # noqa: E402

DOOR = {
    "name": "open_door",
    "description": "Open a door.",
    "parameters": {
        "type": "object",
        "properties": {"door": {"type": "string", "enum": ["front", "back"]}},
        "required": ["door"],
    },
}


async def main(secs, npcs, parallel, ctx):
    rnd = random.Random(1)
    stats = {"turns": 0, "completed": 0, "failed": {}, "cancels": 0, "deletes": 0}
    async with trio.open_nursery() as n:
        p = await open_bridge(n, "--engine", "llama", "--llama-ctx", str(ctx), "--llama-parallel", str(parallel))
        c = p.client
        await c.initialize()
        lock = trio.Lock()

        async def call(m, params):
            async with lock:
                return await c.call(m, params)

        async def npc_loop(i):
            nid = f"n{i}"
            await call(
                "npc/create",
                {
                    "npcId": nid,
                    "engine": "llama",
                    "instructions": f"You are villager {i}. " + "The mill turns. " * rnd.randint(1, 60),
                    "tools": [DOOR],
                    "options": {"temperature": 0.7, "maxTokens": rnd.randint(8, 40), "seed": i},
                },
            )
            end = trio.current_time() + secs
            while trio.current_time() < end:
                r = rnd.random()
                ask = {"npcId": nid, "prompt": "Hello there, what news?"}
                if r < 0.2:
                    ask.update(toolChoice="required", maxToolRounds=1)
                tid = (await call("npc/respond", ask))["turnId"]
                stats["turns"] += 1
                if rnd.random() < 0.2:
                    await trio.sleep(rnd.random() * 0.5)
                    await call("npc/cancel", {"npcId": nid})
                    stats["cancels"] += 1
                with trio.fail_after(120):
                    while True:
                        ch = c._changed
                        evs = c.turn_events(tid)
                        for e in evs:
                            if e["method"] == "turn/toolCallRequested" and not e.get("_done"):
                                e["_done"] = True
                                try:
                                    await call(
                                        "npc/submit", {"npcId": nid, "callId": e["params"]["callId"], "output": "ok"}
                                    )
                                except Exception:
                                    pass
                        term = [e for e in evs if e["method"] in ("turn/completed", "turn/failed")]
                        if term:
                            break
                        await ch.wait()
                c.assert_well_formed(tid)
                if term[0]["method"] == "turn/completed":
                    stats["completed"] += 1
                else:
                    code = term[0]["params"]["error"]["code"]
                    stats["failed"][code] = stats["failed"].get(code, 0) + 1
                if rnd.random() < 0.05:
                    await call("npc/delete", {"npcId": nid})
                    stats["deletes"] += 1
                    await call(
                        "npc/create",
                        {
                            "npcId": nid,
                            "engine": "llama",
                            "instructions": f"You are villager {i} again.",
                            "tools": [DOOR],
                            "options": {"temperature": 0.7, "maxTokens": 24, "seed": i},
                        },
                    )

        async with trio.open_nursery() as m:
            for i in range(npcs):
                m.start_soon(npc_loop, i)
        print(json.dumps(stats))
        await p.process.stdin.aclose()
        with trio.fail_after(10):
            rc = await p.process.wait()
        print("exit", rc)
        n.cancel_scope.cancel()


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=150)
    ap.add_argument("--npcs", type=int, default=16)
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=2048)
    a = ap.parse_args()
    trio.run(main, a.seconds, a.npcs, a.parallel, a.ctx)
