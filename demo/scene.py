"""A short tavern scene, played through the real oam-bridge subprocess.

The game side of the protocol: start the bridge, create an NPC with a persona and a
game-executed tool, stream the keeper's words, answer the tool call as the game would, print
the transcript; then the game layer: a world fact both NPCs know, the guard prewarmed before
the player reaches him, the keeper and the guard trading lines about the fact (NPC-to-NPC),
and the guard deciding what to do when a stranger comes to the gate. Uses the default engine
(``auto``: Apple's model on a Mac, else the bundled llama.cpp model); ``--engine scripted``
plays fixed scripts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading

INVENTORY = {"ale": 3, "mead": 0, "bread": 12, "stew": 5}
SCRIPT = [
    {"text": "Welcome to the Rusty Flagon, traveller. Sit by the fire."},
    {"toolCalls": [{"name": "check_inventory", "arguments": {"item": "ale"}}]},
    {"text": "Aye, three barrels of ale left. A copper a mug."},
]
TOOLS = [
    {
        "name": "check_inventory",
        "description": "Look up how many of an item the tavern has in stock. Use it before promising anything.",
        "parameters": {
            "type": "object",
            "properties": {"item": {"type": "string", "enum": sorted(INVENTORY)}},
            "required": ["item"],
        },
    }
]
LINES = [("Good evening! What's your name?", "none"), ("Do you have any ale left?", "required")]
FACT = ("storm", "A storm is coming from the north tonight.")
GUARD = {
    "name": "Bram",
    "role": "the guard at the village gate",
    "traits": ["watchful", "blunt"],
    "speechStyle": "Short, plain sentences.",
}
OPENER = "Evening, Greta. What do you make of the weather tonight?"  # the game's line for Bram
GUARD_SCRIPT = [
    {"text": "Then I'll bar the north gate early."},
    {"json": {"reasoning": "A stranger before a storm could be trouble.", "choice": "question"}},
]
GRETA_TALK_SCRIPT = [
    {"text": "A storm is coming from the north tonight, Bram."},
    {"text": "Good. Come in for stew after."},
]
OPTIONS = [
    {"name": "let_in", "description": "open the gate and let the stranger in"},
    {"name": "question", "description": "ask the stranger who they are first"},
    {"name": "ring_bell", "description": "ring the alarm bell"},
]


class Bridge:
    def __init__(self, engine: str) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-m", "bridge", "--engine", engine],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        threading.Thread(target=self._log, daemon=True).start()
        self.next_id = 0

    def _log(self) -> None:
        for line in self.p.stderr:  # the bridge's log goes to the game's log
            sys.stderr.write("  [bridge] " + line)

    def send(self, method: str, params: dict) -> int:
        self.next_id += 1
        self.p.stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}) + "\n"
        )
        self.p.stdin.flush()
        return self.next_id

    def messages(self):
        for line in self.p.stdout:
            yield json.loads(line)

    def call(self, method: str, params: dict) -> dict:
        i = self.send(method, params)
        for msg in self.messages():
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']['data']['code']}: {msg['error']['message']}")
                return msg["result"]
        raise EOFError


def play(bridge: Bridge, npc: str, name: str, method: str, params: dict) -> dict:
    """Run one turn (``npc/respond`` or ``npc/decide``), print its words as they stream,
    answer its tool calls as the game would; return ``turn/completed``'s params."""
    turn = bridge.call(method, params)["turnId"]
    # The speaker's name is printed with the first words of each step that speaks, so a step
    # that only calls a tool leaves no empty "Greta:" line; ``open_line``: a line is unfinished.
    speaker = method == "npc/respond"
    open_line = False

    def newline() -> str:
        nonlocal open_line
        was, open_line = open_line, False
        return "\n" if was else ""

    for msg in bridge.messages():
        p = msg.get("params", {})
        if p.get("turnId") != turn:
            continue
        if msg["method"] == "turn/textDelta":
            if speaker:
                print(newline() + f"{name}:  ".ljust(8), end="")
                speaker = False
            elif p["isReset"]:
                print(newline() + " " * 8, end="")
            print(p["delta"], end="", flush=True)
            open_line = True
        elif msg["method"] == "turn/toolCallRequested":
            item = p["arguments"].get("item", "")
            count = INVENTORY.get(item, 0)
            print(f"{newline()}  [game] {p['name']}({json.dumps(p['arguments'])}) -> {count} in stock")
            bridge.send("npc/submit", {"npcId": npc, "callId": p["callId"], "output": {"item": item, "inStock": count}})
            speaker = method == "npc/respond"
        elif msg["method"] == "turn/completed":
            tail = f", world revision {p['worldRevision']}" if p["worldRevision"] else ""
            print(
                f"{newline()}  [turn done: {p['steps']} steps, {len(p['toolCalls'])} tool call(s), "
                f"{p['usage']['outputTokens']} tokens out{tail}]\n"
            )
            return p
        elif msg["method"] == "turn/failed":
            print(f"{newline()}  [turn failed: {p['error']['code']}: {p['error']['message']}]\n")
            return {}
    raise EOFError


def game_layer(bridge: Bridge, engine: str, options: dict) -> None:
    """A world fact, a prewarmed second NPC, two NPCs talking about the fact, a decision."""
    print("\n--- the game layer ---")
    rev = bridge.call("world/set", {"key": FACT[0], "value": FACT[1], "tags": ["village"]})["revision"]
    print(f"[game] world/set {FACT[0]!r} = {FACT[1]!r} (tag village) -> revision {rev}")
    bridge.call("npc/setTags", {"npcId": "greta", "tags": ["village", "tavern"]})
    guard: dict = {"npcId": "bram", "persona": GUARD, "tags": ["village", "gate"], "options": options}
    if engine == "scripted":
        guard["script"], guard["engine"] = GUARD_SCRIPT, "scripted"
    bridge.call("npc/create", guard)
    warm = bridge.call("npc/prewarm", {"npcId": "bram"})["turnId"]
    for msg in bridge.messages():
        if msg.get("params", {}).get("turnId") == warm and msg["method"] in ("turn/completed", "turn/failed"):
            print(f"[game] npc/prewarm bram -> {msg['params'].get('finishReason', 'failed')}")
            break
    facts = bridge.call("world/get", {"npcId": "bram"})["facts"]
    print("[game] what Bram knows:", "; ".join(f"{f['key']}: {f['value']}" for f in facts), "\n")
    # NPC-to-NPC: the game gives Bram an opening line; then each NPC's line is the other's
    # prompt, said by that NPC (speaker).
    print(f"Bram:   {OPENER}\n  [the game's line]\n")
    said = {"text": OPENER}
    for npc, name, other in (("greta", "Greta", "bram"), ("bram", "Bram", "greta"), ("greta", "Greta", "bram")):
        said = play(
            bridge,
            npc,
            name,
            "npc/respond",
            {"npcId": npc, "prompt": said.get("text", ""), "speaker": other, "toolChoice": "none"},
        )
    print("[game] a hooded stranger walks up to the gate. npc/decide bram:")
    decision = play(
        bridge,
        "bram",
        "Bram",
        "npc/decide",
        {
            "npcId": "bram",
            "situation": "A hooded stranger walks up to the village gate just before the storm.",
            "options": OPTIONS,
        },
    )
    if decision:
        answer = decision["json"]
        print(f"[game] Bram chose {answer['choice']!r}: {answer.get('reasoning', '')}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="auto")
    args = ap.parse_args()
    bridge = Bridge(args.engine)
    init = bridge.call("initialize", {"protocolVersion": 1, "clientInfo": {"name": "tavern-demo", "version": "1"}})
    print("engines:", ", ".join(f"{e['name']}={'yes' if e['available'] else 'no'}" for e in init["engines"]))
    # a model engine: available, and not a test backend (those say why in "reason")
    if args.engine == "auto" and not any(
        e["available"] and e["reason"] is None for e in init["engines"] if e["name"] != "scripted"
    ):
        print("no model engine is available here; playing the scripted scene instead")
        args.engine = "scripted"
    create: dict = {
        "npcId": "greta",
        "persona": {
            "name": "Greta",
            "role": "the keeper of the Rusty Flagon tavern",
            "traits": ["gruff", "warm-hearted"],
            "speechStyle": "Short, plain sentences.",
        },
        "tools": TOOLS,
        "options": {"temperature": 0.0, "maxTokens": 60, "seed": 7},
    }
    if args.engine == "scripted":
        create["script"], create["engine"] = SCRIPT + GRETA_TALK_SCRIPT, "scripted"
    npc = bridge.call("npc/create", create)
    print(f"NPC greta on engine {npc['engine']} (context {npc['contextSize']} tokens)\n")
    for line, choice in LINES:
        print(f"Player: {line}")
        play(
            bridge,
            "greta",
            "Greta",
            "npc/respond",
            {"npcId": "greta", "prompt": line, "toolChoice": choice, "maxToolRounds": 1},
        )
    save = bridge.call("npc/transcript", {"npcId": "greta"})
    print("Transcript (what the game would store in its save file):")
    for turn in save["turns"]:
        for m in turn:
            if m["role"] == "user":
                print(f"  player   : {m['content']}")
            elif m["role"] == "tool":
                print(f"  tool     : {m['name']} -> {m['content']}")
            elif m.get("toolCalls"):
                for c in m["toolCalls"]:
                    print(f"  greta    : calls {c['name']}({json.dumps(c['arguments'])})")
            else:
                print(f"  greta    : {m['content']}")
    game_layer(bridge, args.engine, create["options"])
    bridge.call("shutdown", {})
    bridge.p.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "exit"}) + "\n")
    bridge.p.stdin.close()
    return bridge.p.wait(timeout=10)


if __name__ == "__main__":
    raise SystemExit(main())
