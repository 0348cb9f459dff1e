"""The game layer on a real model, through the real ``oam-bridge`` subprocess (issue 10).

Prints three tables, each with its baseline measured in the same run:

1. **Routing** (docs/design-notes.md, "Choosing when to call a tool"): a tavern keeper with two
   tools, ``get_menu`` (what the tavern serves and the prices) and ``take_order`` (the player
   has just ordered), and lines whose right first action is known (a menu lookup, an order,
   small talk: no tool). Three policies: ``auto``; ``tool_or_answer`` (``required`` plus the
   bridge's no-op ``respond_directly``); and a decision (``npc/decide`` over the two tools and
   "answer directly") followed by a forced tool (``toolChoice: {"tool": ...}``) or an answer
   with tools off. Right actions out of the lines, and the median seconds per line.
2. **Decisions**: share of ``npc/decide`` answers whose choice is one of the options (and
   that completed), over many situations and seeds at temperature 0.7; median latency.
3. **First words**: time to the first ``turn/textDelta`` of an NPC's first turn, cold (the
   baseline), after ``npc/prewarm`` (goal ≤ 0.2x cold), and a warm NPC's turn right after a
   world fact it sees changed, beside the same NPC's turn with no change. Each NPC has its
   own persona (about 400 tokens), so no NPC reuses another's cached prompt.
4. **World views** (no model): after one fact changes, the time to work out what each of
   1,000 NPCs sees in a world of 2,000 facts (on the event loop, when each NPC's next step
   starts): the bridge's index beside checking every fact for every NPC (the baseline).

Usage::

    python bench/bench_game.py                 # the bundled model, every table
    python bench/bench_game.py --quick         # fewer repetitions
    python bench/bench_game.py --only routing  # one table (routing | decisions | first-words | views)
    python bench/bench_game.py --model my.gguf --show
"""

from __future__ import annotations

import argparse
import json
import os
import statistics as st
import subprocess
import sys
import time
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

MENU = {"ale": "2 copper", "stew": "5 copper", "bread": "1 copper", "mead": "3 copper"}
TOOLS = [
    {
        "name": "get_menu",
        "description": (
            "Look up what the tavern serves and what each thing costs. "
            "Use it when the player asks what there is or what something costs."
        ),
        "parameters": {"type": "object", "properties": {}},
    },
    {
        "name": "take_order",
        "description": "The player has just ordered food or drink: put the order in.",
        "parameters": {
            "type": "object",
            "properties": {"item": {"type": "string", "enum": sorted(MENU)}},
            "required": ["item"],
        },
    },
]
# (line, the right first action: a tool's name, or "none" for an answer without tools)
ROUTING = [
    ("What can I buy from you?", "get_menu"),
    ("How much is the stew?", "get_menu"),
    ("What do you have to drink?", "get_menu"),
    ("I'll have a mug of ale, please.", "take_order"),
    ("Bring me a bowl of stew.", "take_order"),
    ("One bread for me.", "take_order"),
    ("Good evening! Lovely fire you have.", "none"),
    ("What's your name?", "none"),
    ("Terrible weather out there, isn't it?", "none"),
    ("Thanks, have a good night!", "none"),
]
KEEPER = {
    "name": "Greta",
    "role": "the keeper of the Rusty Flagon tavern",
    "traits": ["gruff", "warm-hearted"],
    "speechStyle": "Short, plain sentences.",
}
ROUTE_OPTIONS = [
    {"name": "get_menu", "description": "look up the menu and prices: the player asks what there is or what it costs"},
    {"name": "take_order", "description": "put in an order: the player has just ordered food or drink"},
    {"name": "answer", "description": "just talk: greetings, small talk, thanks, questions about you"},
]

SITUATIONS = [
    (
        "A hooded stranger walks up to the village gate after dark.",
        [("let_in", "open the gate"), ("question", "ask who they are"), ("ring_bell", "ring the alarm bell")],
    ),
    (
        "A wolf pack is howling close to the sheep pen.",
        [
            ("light_torches", "light torches around the pen"),
            ("wake_farmer", "wake the farmer"),
            ("ignore", "do nothing"),
        ],
    ),
    (
        "A merchant offers you a bribe to look away.",
        [("accept", "take the coins"), ("refuse", "refuse and send him off"), ("arrest", "arrest the merchant")],
    ),
    (
        "A child says her cat is stuck on the tavern roof.",
        [("climb", "climb up and fetch the cat"), ("ladder", "fetch a ladder"), ("refuse", "say you are busy")],
    ),
    (
        "Two drunk farmers start shouting at each other in the tavern.",
        [
            ("calm", "calm them down"),
            ("throw_out", "throw them out"),
            ("serve_more", "serve them more ale"),
            ("call_guard", "call the guard"),
        ],
    ),
    (
        "The player asks you to join their quest to the mountains.",
        [("join", "join the quest"), ("decline", "politely decline")],
    ),
]

BASE_PERSONA = (
    "You have run this place for twenty years. You know every farmer, trader and soldier who passes through the "
    "valley, "
    "and you remember who paid and who did not. You dislike thieves, loud nobles and anyone who insults the cook. "
    "You are proud of the stew, which is made from your grandmother's recipe with barley, carrots, onions and mutton. "
    "The ale comes from the monastery up the hill and the mead from the beekeeper by the river. "
    "The village has a wooden wall, one gate to the north and one to the south, and a watchtower by the mill. "
    "Bandits have been seen on the old road this autumn, and the lord's soldiers have not come in weeks. "
    "The blacksmith is your cousin and the healer owes you money. "
    "You never talk about the war, in which you lost a brother. "
    "When strangers ask for rooms you tell them the price first: a bed is four copper a night, and the stable is one. "
    "You close the doors at midnight and open them at dawn, and you do not serve anyone who is already drunk. "
    "You speak plainly and never use long words; you call younger people 'lad' or 'lass'. "
)


class Bridge:
    def __init__(self, model: str | None) -> None:
        cmd = [sys.executable, "-m", "bridge", "--engine", "llama"] + (["--model", model] if model else [])
        self.p = subprocess.Popen(
            cmd,
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            bufsize=1,
        )
        self.next_id = 0
        self.backlog: list[dict[str, Any]] = []
        self.call("initialize", {"protocolVersion": 1, "clientInfo": {"name": "bench_game", "version": "1"}})

    def send(self, method: str, params: dict[str, Any]) -> int:
        self.next_id += 1
        assert self.p.stdin is not None
        self.p.stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}) + "\n"
        )
        self.p.stdin.flush()
        return self.next_id

    def line(self) -> dict[str, Any]:
        assert self.p.stdout is not None
        raw = self.p.stdout.readline()
        if not raw:
            raise EOFError("the bridge closed its stdout")
        return json.loads(raw)

    def call(self, method: str, params: dict[str, Any]) -> Any:
        i = self.send(method, params)
        while True:
            msg = self.line()
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']['message']}")
                return msg["result"]
            self.backlog.append(msg)

    def events(self, turn_id: str):
        """The turn's events as they arrive (the ones already read first)."""
        kept = []
        for msg in self.backlog:
            if msg.get("params", {}).get("turnId") == turn_id:
                yield msg
            else:
                kept.append(msg)
        self.backlog = kept
        while True:
            msg = self.line()
            if msg.get("params", {}).get("turnId") == turn_id:
                yield msg

    def run(self, method: str, params: dict[str, Any], answers: dict[str, Any] | None = None) -> dict[str, Any]:
        """One turn to its end: (first action, terminal params, seconds, seconds to the first
        text delta or None). Tool calls are answered from ``answers`` by name."""
        t0 = time.perf_counter()
        turn = self.call(method, params)["turnId"]
        first_text: float | None = None
        first_call: str | None = None
        npc = params["npcId"]
        for msg in self.events(turn):
            kind, p = msg["method"], msg["params"]
            if kind == "turn/textDelta" and first_text is None:
                first_text = time.perf_counter() - t0
            elif kind == "turn/toolCallRequested":
                first_call = first_call or p["name"]
                self.send(
                    "npc/submit", {"npcId": npc, "callId": p["callId"], "output": (answers or {}).get(p["name"], "ok")}
                )
            elif kind == "turn/toolCallCompleted":
                first_call = first_call or p["name"]
            elif kind in ("turn/completed", "turn/failed"):
                return {
                    "end": kind,
                    "params": p,
                    "seconds": time.perf_counter() - t0,
                    "ttft": first_text,
                    "first_call": first_call,
                }
        raise EOFError

    def close(self) -> None:
        try:
            self.call("shutdown", {})
            self.send("exit", {})
        except Exception:
            pass
        self.p.wait(timeout=30)


def keeper(b: Bridge, npc_id: str, seed: int = 7) -> None:
    b.call(
        "npc/create",
        {
            "npcId": npc_id,
            "persona": KEEPER,
            "tools": TOOLS,
            "options": {"temperature": 0.0, "seed": seed, "maxTokens": 60},
        },
    )


ANSWERS = {"get_menu": {k: v for k, v in MENU.items()}, "take_order": {"ordered": True}}


def routing(b: Bridge, show: bool) -> None:
    print("\n## Routing: right first action on the tavern lines (temperature 0)\n")
    rows = []
    for policy in ("auto", "tool_or_answer", "decision, then forced tool"):
        right, seconds = 0, []
        for i, (line, want) in enumerate(ROUTING):
            npc = f"route-{policy[:4]}-{i}"
            keeper(b, npc)
            if policy == "decision, then forced tool":
                situation = f'The player says to you: "{line}" What do you do first?'
                d = b.run(
                    "npc/decide", {"npcId": npc, "situation": situation, "options": ROUTE_OPTIONS, "reasoning": True}
                )
                choice = d["params"].get("json", {}).get("choice") if d["end"] == "turn/completed" else None
                tc: Any = {"tool": choice} if choice in ("get_menu", "take_order") else "none"
                r = b.run("npc/respond", {"npcId": npc, "prompt": line, "toolChoice": tc, "maxToolRounds": 1}, ANSWERS)
                got = choice if choice in ("get_menu", "take_order") else "none"
                took = d["seconds"] + r["seconds"]
            else:
                r = b.run(
                    "npc/respond", {"npcId": npc, "prompt": line, "toolChoice": policy, "maxToolRounds": 1}, ANSWERS
                )
                got = r["first_call"] or "none"
                took = r["seconds"]
            ok = got == want and r["end"] == "turn/completed"
            right += ok
            seconds.append(took)
            if show:
                print(
                    f"  [{policy}] {line!r}: {got} ({'right' if ok else 'wrong, want ' + want}) -> "
                    f"{r['params'].get('text', r['params'].get('error'))!r}"
                )
            b.call("npc/delete", {"npcId": npc})
        rows.append((policy, right, st.median(seconds)))
    print("| policy | right actions | median s/line |")
    print("|---|---|---|")
    for policy, right, med in rows:
        print(f"| {policy} | {right}/{len(ROUTING)} | {med:.2f} |")


def decisions(b: Bridge, n: int, show: bool) -> None:
    print(f"\n## Decisions: {n} npc/decide at temperature 0.7\n")
    b.call(
        "npc/create",
        {
            "npcId": "decider",
            "persona": {"name": "Bram", "role": "the village guard", "traits": ["watchful"]},
            "options": {"temperature": 0.7, "maxTokens": 160},
        },
    )
    valid = completed = 0
    seconds = []
    for i in range(n):
        situation, opts = SITUATIONS[i % len(SITUATIONS)]
        b.call(
            "npc/restore",
            {
                "save": {
                    "version": 1,
                    "config": {
                        "npcId": "decider",
                        "persona": {"name": "Bram", "role": "the village guard", "traits": ["watchful"]},
                        "options": {"temperature": 0.7, "seed": 1000 + i, "maxTokens": 160},
                    },
                    "turns": [],
                }
            },
        )
        options = [{"name": k, "description": d} for k, d in opts]
        r = b.run("npc/decide", {"npcId": "decider", "situation": situation, "options": options})
        seconds.append(r["seconds"])
        if r["end"] == "turn/completed":
            completed += 1
            valid += r["params"]["json"]["choice"] in {k for k, _ in opts}
        if show:
            print(f"  {situation[:40]!r}: {r['params'].get('json') or r['params'].get('error')}")
    print("| decisions | completed | choice is one of the options | median s |")
    print("|---|---|---|---|")
    print(f"| {n} | {completed}/{n} | {valid}/{n} ({100 * valid / n:.0f}%) | {st.median(seconds):.2f} |")


def persona(i: int) -> dict[str, Any]:
    # A name and a first line of its own: no NPC's prompt is a prefix of another's.
    names = ["Alda", "Borin", "Cress", "Dagny", "Edric", "Fenna", "Gorm", "Hilde", "Ivo", "Jorun", "Kell", "Liska"]
    return {
        "name": names[i % len(names)] + (str(i) if i >= len(names) else ""),
        "role": f"keeper of tavern number {i}",
        "traits": ["gruff"],
        "speechStyle": "Short sentences.",
    }


def first_words(b: Bridge, reps: int, show: bool) -> None:
    print(f"\n## First words: seconds to the first text delta, median of {reps} NPCs each\n")
    opts = {"temperature": 0.0, "seed": 3, "maxTokens": 24}
    rows: dict[str, list[float]] = {
        "cold first turn (baseline)": [],
        "first turn after npc/prewarm": [],
        "warm turn, world unchanged": [],
        "warm turn right after a visible fact changed": [],
    }
    prompt = "Evening. What's the news?"
    b.call("world/set", {"key": "bench weather", "value": "clear skies", "tags": ["bench"]})
    for i in range(reps):
        for kind in ("cold", "prewarm"):
            npc = f"fw-{kind}-{i}"
            b.call(
                "npc/create",
                {
                    "npcId": npc,
                    "persona": persona(2 * i + (kind == "prewarm")),
                    "instructions": BASE_PERSONA,
                    "tags": ["bench"],
                    "options": opts,
                },
            )
            if kind == "prewarm":
                w = b.run("npc/prewarm", {"npcId": npc})
                assert w["params"].get("finishReason") == "prewarmed", w
            r = b.run("npc/respond", {"npcId": npc, "prompt": prompt, "toolChoice": "none"})
            rows["cold first turn (baseline)" if kind == "cold" else "first turn after npc/prewarm"].append(
                r["ttft"] or r["seconds"]
            )
            if kind == "cold":
                r = b.run("npc/respond", {"npcId": npc, "prompt": "And the road?", "toolChoice": "none"})
                rows["warm turn, world unchanged"].append(r["ttft"] or r["seconds"])
                b.call("world/set", {"key": "bench weather", "value": f"a storm, number {i}", "tags": ["bench"]})
                r = b.run("npc/respond", {"npcId": npc, "prompt": "And the sky?", "toolChoice": "none"})
                rows["warm turn right after a visible fact changed"].append(r["ttft"] or r["seconds"])
            b.call("npc/delete", {"npcId": npc})
    cold = st.median(rows["cold first turn (baseline)"])
    print("| case | median s to first words | vs cold |")
    print("|---|---|---|")
    for case, xs in rows.items():
        print(
            f"| {case} | {st.median(xs):.3f} | {st.median(xs) / cold:.2f}x |"
            + (f" {[round(x, 2) for x in xs]}" if show else "")
        )


def views(reps: int) -> None:
    sys.path.insert(0, ROOT)
    import random

    from bridge.core import _messages as m
    from bridge.core._world import FACTS_HEADER, World

    n_npcs, n_facts = 1000, 2000
    rng = random.Random(1)
    places = [f"place{i}" for i in range(20)]
    world = World(m.Limits(max_world_bytes=1 << 24))
    for i in range(n_facts):
        r = rng.random()
        tags = [rng.choice(places)] if r < 0.6 else None
        ids = [f"npc{rng.randrange(n_npcs)}"] if 0.6 <= r < 0.8 else None
        world.set(m.WorldSetParams(key=f"fact {i:05d}", value=f"value {i}", tags=tags, npc_ids=ids))
    npcs = [(f"npc{i}", frozenset(rng.sample(places, 2))) for i in range(n_npcs)]

    def brute(npc_id: str, tags: frozenset[str]) -> str:
        # the first version of World.view: every fact checked for every NPC
        lines = [f.line for f in world._ordered() if f.visible_to(npc_id, tags) and not f.lore]
        return FACTS_HEADER + "\n" + "\n".join(lines)

    def timed(fn: Any) -> float:
        world.set(m.WorldSetParams(key="weather", value=f"rain {time.perf_counter()}"))  # a change: new views
        t0 = time.perf_counter()
        for npc_id, tags in npcs:
            fn(npc_id, tags)
        return (time.perf_counter() - t0) * 1000

    sample = npcs[:20]
    assert all(world.view(n, t).text == brute(n, t) for n, t in sample), "the index and the baseline agree"
    base = [timed(brute) for _ in range(reps)]
    index = [timed(world.view) for _ in range(reps)]
    print(f"\n## World views: {n_npcs} NPCs, {n_facts} facts, one change, median of {reps}\n")
    print("| how | ms for every NPC's view | per NPC | vs baseline |")
    print("|---|---|---|---|")
    for how, xs in (("check every fact (baseline)", base), ("index by scope, shared views (bridge)", index)):
        print(
            f"| {how} | {st.median(xs):.1f} | {st.median(xs) / n_npcs * 1000:.0f} µs | "
            f"{st.median(xs) / st.median(base):.2f}x |"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a GGUF model instead of the bundled one")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--only", choices=["routing", "decisions", "first-words", "views"])
    ap.add_argument("--show", action="store_true", help="print every answer")
    args = ap.parse_args()
    if args.only in (None, "views"):
        views(3 if args.quick else 7)
    if args.only == "views":
        return
    b = Bridge(args.model)
    try:
        if args.only in (None, "routing"):
            routing(b, args.show)
        if args.only in (None, "decisions"):
            decisions(b, 18 if args.quick else 60, args.show)
        if args.only in (None, "first-words"):
            first_words(b, 3 if args.quick else 7, args.show)
    finally:
        b.close()


if __name__ == "__main__":
    main()
