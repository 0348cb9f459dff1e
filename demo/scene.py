"""A short tavern scene, played through the real oam-bridge subprocess.

The game side of the protocol in ~100 lines: start the bridge, create an NPC with a persona
and a game-executed tool, stream the keeper's words, answer the tool call as the game
would, then print the transcript. Uses the default engine (``auto``: Apple's model on a
Mac, else the bundled llama.cpp model); ``--engine scripted`` plays a fixed script.
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
        "parameters": {"type": "object", "properties": {"item": {"type": "string", "enum": sorted(INVENTORY)}}, "required": ["item"]},
    }
]
LINES = [("Good evening! What's your name?", "none"), ("Do you have any ale left?", "required")]


class Bridge:
    def __init__(self, engine: str) -> None:
        self.p = subprocess.Popen([sys.executable, "-m", "bridge", "--engine", engine], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, bufsize=1)
        threading.Thread(target=self._log, daemon=True).start()
        self.next_id = 0

    def _log(self) -> None:
        for line in self.p.stderr:  # the bridge's log goes to the game's log
            sys.stderr.write("  [bridge] " + line)

    def send(self, method: str, params: dict) -> int:
        self.next_id += 1
        self.p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}) + "\n")
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


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--engine", default="auto")
    args = ap.parse_args()
    bridge = Bridge(args.engine)
    init = bridge.call("initialize", {"protocolVersion": 1, "clientInfo": {"name": "tavern-demo", "version": "1"}})
    print("engines:", ", ".join(f"{e['name']}={'yes' if e['available'] else 'no'}" for e in init["engines"]))
    # a model engine: available, and not a test backend (those say why in "reason")
    if args.engine == "auto" and not any(e["available"] and e["reason"] is None for e in init["engines"] if e["name"] != "scripted"):
        print("no model engine is available here; playing the scripted scene instead")
        args.engine = "scripted"
    create: dict = {"npcId": "greta", "persona": {"name": "Greta", "role": "the keeper of the Rusty Flagon tavern", "traits": ["gruff", "warm-hearted"], "speechStyle": "Short, plain sentences."}, "tools": TOOLS, "options": {"temperature": 0.0, "maxTokens": 60, "seed": 7}}
    if args.engine == "scripted":
        create["script"], create["engine"] = SCRIPT, "scripted"
    npc = bridge.call("npc/create", create)
    print(f"NPC greta on engine {npc['engine']} (context {npc['contextSize']} tokens)\n")
    for line, choice in LINES:
        print(f"Player: {line}")
        turn = bridge.call("npc/respond", {"npcId": "greta", "prompt": line, "toolChoice": choice, "maxToolRounds": 1})["turnId"]
        print("Greta:  ", end="", flush=True)
        for msg in bridge.messages():
            p = msg.get("params", {})
            if p.get("turnId") != turn:
                continue
            if msg["method"] == "turn/textDelta":
                if p["isReset"]:
                    print("\n        ", end="")
                print(p["delta"], end="", flush=True)
            elif msg["method"] == "turn/toolCallRequested":
                item = p["arguments"].get("item", "")
                count = INVENTORY.get(item, 0)
                print(f"\n  [game] {p['name']}({json.dumps(p['arguments'])}) -> {count} in stock")
                bridge.send("npc/submit", {"npcId": "greta", "callId": p["callId"], "output": {"item": item, "inStock": count}})
                print("Greta:  ", end="", flush=True)
            elif msg["method"] == "turn/completed":
                print(f"\n  [turn done: {p['steps']} steps, {len(p['toolCalls'])} tool call(s), {p['usage']['outputTokens']} tokens out]\n")
                break
            elif msg["method"] == "turn/failed":
                print(f"\n  [turn failed: {p['error']['code']}: {p['error']['message']}]\n")
                break
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
    bridge.call("shutdown", {})
    bridge.p.stdin.write(json.dumps({"jsonrpc": "2.0", "method": "exit"}) + "\n")
    bridge.p.stdin.close()
    return bridge.p.wait(timeout=10)


if __name__ == "__main__":
    raise SystemExit(main())
