"""Many NPCs deciding at once (issue 12): grammar steps on the llama engine, beside a baseline.

For each N (``--n``, default 1, 4 and 8), N NPCs with distinct personas (bench_batch.py's)
each get an ``npc/decide`` at the same moment: a situation, three options (one with an
argument), reasoning first, greedy by default (``--temperature``). Every answer is JSON under
a grammar, so the engine samples every token under it. The real ``oam-bridge --engine llama``
subprocess runs at this revision and, with ``--baseline REV``, at another one (a ``git
worktree``), the two interleaved per round, fresh NPCs each round.

Printed per side: output tokens/s over the round's wall time, decision time p50/max, output
tokens, CPU cores used; then the ratios. With greedy decoding both sides write the same
tokens when the engine's choices are the same, so the token counts check like for like.

Usage: python bench/bench_decide.py [--n 1,4,8] [--repeat 3] [--baseline REV] [--temperature T]
"""

from __future__ import annotations

import argparse
import os
import statistics as st
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_batch import Bridge, add_worktree, cpu_seconds, npc_prompt, remove_worktree  # noqa: E402

OPTIONS = [
    {"name": "welcome", "description": "greet the stranger and offer a seat"},
    {"name": "turn_away", "description": "tell the stranger to leave"},
    {
        "name": "call_guard",
        "description": "send for the town guard",
        "parameters": {
            "type": "object",
            "properties": {"urgency": {"type": "string", "enum": ["low", "high"]}},
            "required": ["urgency"],
        },
    },
]
SITUATION = "A hooded stranger with a bloodied sword walks up to you after dark and asks for help."


def decide_round(br: Bridge, rnd: int, n: int, temperature: float) -> tuple[float, list[float], list[int], float]:
    ids = [f"d{rnd}n{i}" for i in range(n)]
    for i, npc in enumerate(ids):
        br.call(
            "npc/create",
            {
                "npcId": npc,
                "engine": "llama",
                "instructions": npc_prompt(i, rnd)[0],
                "options": {"temperature": temperature, "maxTokens": 120, "seed": i},
            },
        )
    batch = b"".join(
        br.request("npc/decide", {"npcId": npc, "situation": SITUATION, "options": OPTIONS})[1] for npc in ids
    )
    assert br.p.stdin is not None
    cpu0 = cpu_seconds([br.p.pid])
    t0 = time.perf_counter()
    br.p.stdin.write(batch)
    done: dict[str, float] = {}
    out: dict[str, int] = {}
    while len(done) < n:
        msg = br.line()
        if "error" in msg:
            raise RuntimeError(f"npc/decide: {msg['error']}")
        if msg.get("method") == "turn/completed":
            npc = msg["params"]["npcId"]
            done[npc] = time.perf_counter() - t0
            out[npc] = msg["params"]["usage"]["outputTokens"]
        elif msg.get("method") == "turn/failed":
            raise RuntimeError(f"turn failed: {msg['params']}")
    wall = max(done.values())
    cores = (cpu_seconds([br.p.pid]) - cpu0) / wall
    for npc in ids:
        br.call("npc/delete", {"npcId": npc})
    return wall, [done[x] for x in ids], [out[x] for x in ids], cores


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", default="1,4,8", help="NPC counts, comma-separated")
    ap.add_argument("--repeat", type=int, default=3, help="rounds per side and N; medians are printed")
    ap.add_argument("--baseline", metavar="REV", help="also run the bridge from this git revision")
    ap.add_argument("--temperature", type=float, default=0.0, help="the NPCs' temperature (default greedy)")
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    print(
        f"{cores} cores; bridge --engine llama with its defaults; npc/decide, 3 options, reasoning first, "
        f"temperature {args.temperature}, maxTokens 120; medians of {args.repeat}",
        flush=True,
    )
    worktree = None
    sides = {"bridge": Bridge(["--engine", "llama"])}
    try:
        if args.baseline:
            worktree = add_worktree(args.baseline)
            sides[f"bridge @{args.baseline}"] = Bridge(["--engine", "llama"], root=worktree)
        for br in sides.values():
            br.warm("llama")
        rnd = 0
        for n in [int(x) for x in args.n.split(",")]:
            rows: dict[str, list[tuple[float, list[float], list[int], float]]] = {k: [] for k in sides}
            for _ in range(args.repeat):
                rnd += 1
                for name, br in sides.items():  # interleaved: both sides see the same machine
                    rows[name].append(decide_round(br, rnd, n, args.temperature))
            print(f"\nN = {n} NPCs deciding at once (seconds)")
            print(f"{'side':28} {'tok/s':>7} {'out':>6} {'done50':>7} {'max':>6} {'cores':>6}")
            tps: dict[str, float] = {}
            worst: dict[str, float] = {}
            for name, rs in rows.items():
                tps[name] = st.median(sum(r[2]) / r[0] for r in rs)
                worst[name] = st.median(r[0] for r in rs)
                print(
                    f"{name:28} {tps[name]:7.1f} {st.median(sum(r[2]) for r in rs):6.0f} "
                    f"{st.median(st.median(r[1]) for r in rs):7.2f} {worst[name]:6.2f} "
                    f"{st.median(r[3] for r in rs):6.2f}"
                )
            if len(sides) > 1:
                base = list(sides)[1]
                print(
                    f"  bridge / baseline: tok/s {tps['bridge'] / tps[base]:.2f}, "
                    f"last decision {worst['bridge'] / worst[base]:.2f}",
                    flush=True,
                )
    finally:
        for br in sides.values():
            br.close()
        if worktree is not None:
            remove_worktree(worktree)


if __name__ == "__main__":
    main()
