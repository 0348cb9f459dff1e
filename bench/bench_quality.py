"""NPC line quality on a real model, through the real ``oam-bridge`` subprocess.

Plays the exchanges in ``bench/quality/exchanges.json`` (personas, single turns, five-turn
conversations, tool lines whose right action is known, schema turns) on the llama engine and
prints one row per configuration:

- **own name**: lines that answer "what's your name?" and contain the persona's name;
  **other name**: lines where the NPC calls itself by another name ("I'm Grimjack");
- **leaked**: lines that speak JSON, tool-call syntax, tool-result labels, chat-template tokens
  or the prompt's own instructions;
- **rep 4-gram**: the share of repeated 4-grams within a line (mean); **loops**: lines where
  one 4-gram comes back three times or more;
- **cut off**: lines that do not end at a sentence boundary (or ended by ``maxTokens``);
- **words**, **s/turn**: medians; **right action**: tool lines whose first tool call (or none,
  for small talk) was the right one; **grounded**: lines after a tool call that say what the
  tool answered (the tool's ``mentions`` pattern in the data file: the price, the count),
  in a line that leaked nothing;
  **valid**: schema answers that completed and match the schema; **failed**: turns that
  ended ``turn/failed``.

Last, one five-turn conversation is played twice at temperature 0 with the same seed, in
one bridge process, and the bench says whether the two transcripts are the same.

The game side answers every tool call with the tool's canned ``answer`` from the data file.

Usage::

    python bench/bench_quality.py                       # the bundled model
    python bench/bench_quality.py --model my.gguf       # your own GGUF model
    python bench/bench_quality.py --root OTHER_CHECKOUT # another version of the bridge
    python bench/bench_quality.py --show                # print every line too
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics as st
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "bench", "quality", "exchanges.json")

LEAK_PATTERNS = [
    r"\{\s*\"",
    r"tool_calls",
    r"\"arguments\"",
    r"\[(?:result|error) (?:of|from) tool",
    r"<\|im_",
    r"<\|",
    r"\|>",
    r"Arguments schema",
    r"You can call these tools",
    r"reply with only JSON",
    r"You must call a tool",
    r"Answer with JSON",
    r"Speech style:",
    r"Traits:",
    r"Stay in character",
    r"\b(?:get_menu|take_order|check_inventory|open_gate|get_price)\b",
    # the prompt text of this version (bridge/engines/_text/_prompt.py, bridge/core/agent/_persona.py)
    r"Tools the game runs",
    r"reply with only",
    r"Call one of these tools",
    r"Reply with a JSON object",
    r"How you speak:",
    r"says out loud",
    r"\banswered:",
    r"respond_directly",
]
LEAK = re.compile("|".join(LEAK_PATTERNS), re.I)
SELF_NAME = re.compile(r"\b(?:I am|I'm|my name is|my name's|name's|call me|they call me)\s+(?:the\s+)?([A-Z][a-z]+)")
NOT_NAMES = {
    "A",
    "An",
    "The",
    "Here",
    "Just",
    "Not",
    "Sorry",
    "Afraid",
    "Glad",
    "Happy",
    "Busy",
    "Fine",
    "Well",
    "Only",
    "Still",
    "Always",
    "Your",
    "So",
    "Sure",
    "Good",
    "In",
    "On",
    "At",
    "From",
    "Too",
    "Very",
    "No",
    "Yes",
    "Old",
    "Keeper",
    "Guard",
    "Merchant",
    "Healer",
    "Blacksmith",
    "Fisherman",
    "Smith",
}
SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*\s*$")


@dataclass
class Turn:
    config: str
    npc: str
    prompt: str
    text: str = ""
    finish: str = ""
    seconds: float = 0.0
    calls: list[str] = field(default_factory=list)
    error: str | None = None
    answer: Any = None
    asks_name: bool = False
    right: str | None = "?"  # the right first action of a routing line ("?": not a routing line)
    grounded: bool | None = None  # after a tool call with a ``mentions`` pattern: said it


class Bridge:
    def __init__(self, root: str, args: list[str]) -> None:
        env = {**os.environ, "PYTHONPATH": root}
        self.p = subprocess.Popen(
            [sys.executable, "-m", "bridge", "--engine", "llama", *args],
            cwd=root,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            bufsize=0,
        )
        self.ids = 0
        init = self.call("initialize", {"protocolVersion": 1})
        # the bridge's own respond_directly (toolChoice "tool_or_answer", issue 10); before
        # it, the bench defined that no-op tool itself
        self.tool_or_answer = "tool_or_answer" in init["capabilities"]["tools"]["toolChoice"]

    def send(self, method: str, params: dict[str, Any]) -> int:
        assert self.p.stdin is not None
        self.ids += 1
        self.p.stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}).encode() + b"\n"
        )
        return self.ids

    def line(self) -> dict[str, Any]:
        assert self.p.stdout is not None
        raw = self.p.stdout.readline()
        if not raw:
            raise EOFError("the bridge closed its stdout")
        return json.loads(raw)  # type: ignore[no-any-return]

    def call(self, method: str, params: dict[str, Any] | None = None) -> Any:
        i = self.send(method, params or {})
        while True:
            msg = self.line()
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def turn(self, t: Turn, answers: dict[str, Any], **params: Any) -> Turn:
        t0 = time.perf_counter()
        turn_id = self.call("npc/respond", {"npcId": t.npc, "prompt": t.prompt, "fullText": False, **params})["turnId"]
        while True:
            msg = self.line()
            p = msg.get("params", {})
            if p.get("turnId") != turn_id:
                continue
            method = msg.get("method")
            if method == "turn/toolCallRequested":
                t.calls.append(p["name"])
                self.send(
                    "npc/submit",
                    {"npcId": t.npc, "callId": p["callId"], "output": answers.get(p["name"], {"ok": True})},
                )
            elif method == "turn/completed":
                t.text, t.finish, t.answer = p["text"], p["finishReason"], p["json"]
                t.calls = [c["name"] for c in p["toolCalls"]] or t.calls
                break
            elif method == "turn/failed":
                t.error = p["error"]["code"] + ": " + p["error"]["message"]
                break
        t.seconds = time.perf_counter() - t0
        return t

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(timeout=30)


def four_grams(text: str) -> list[tuple[str, ...]]:
    words = re.findall(r"[\w']+", text.lower())
    return [tuple(words[i : i + 4]) for i in range(len(words) - 3)]


def repetition(text: str) -> float:
    grams = four_grams(text)
    return 0.0 if not grams else 1 - len(set(grams)) / len(grams)


def loops(text: str) -> bool:
    grams = four_grams(text)
    return any(grams.count(g) >= 3 for g in set(grams))


def claimed_names(text: str) -> list[str]:
    return [n for n in SELF_NAME.findall(text) if n not in NOT_NAMES]


def own_name_ok(t: Turn, name: str) -> bool:
    return name.split()[-1].lower() in t.text.lower()


def other_name(t: Turn, name: str) -> bool:
    parts = {w.lower() for w in name.split()}
    return any(n.lower() not in parts for n in claimed_names(t.text))


def cut_off(t: Turn) -> bool:
    return t.finish == "length" or not SENTENCE_END.search(t.text.strip())


def pct(n: int, d: int) -> str:
    return "-" if d == 0 else f"{n}/{d}"


def ground(turns: list[Turn], tools: dict[str, Any]) -> None:
    """Marks the lines that followed a call of a tool with a ``mentions`` pattern."""
    for t in turns:
        pats = [tools[c]["mentions"] for c in t.calls if c in tools and "mentions" in tools[c]]
        if pats and t.error is None:  # a leaked tool result does not count as said
            t.grounded = not LEAK.search(t.text) and any(re.search(p, t.text, re.I) for p in pats)


def summarize(
    config: str, turns: list[Turn], personas: dict[str, Any], schema_ok: list[bool] | None = None
) -> dict[str, str]:
    spoken = [t for t in turns if t.error is None and t.text.strip()]
    checked = [t for t in turns if t.grounded is not None]
    named = [t for t in turns if t.asks_name and t.error is None]
    routing = [t for t in turns if t.right != "?"]
    name = {k: v["persona"]["name"] for k, v in personas.items()}
    return {
        "configuration": config,
        "turns": str(len(turns)),
        "own name": pct(sum(own_name_ok(t, name[t.npc]) for t in named), len(named)),
        "other name": pct(sum(other_name(t, name[t.npc]) for t in spoken), len(spoken)),
        "leaked": pct(sum(bool(LEAK.search(t.text)) for t in spoken), len(spoken)),
        "rep 4-gram": f"{st.mean(repetition(t.text) for t in spoken):.3f}" if spoken else "-",
        "loops": pct(sum(loops(t.text) for t in spoken), len(spoken)),
        "cut off": pct(sum(cut_off(t) for t in spoken), len(spoken)),
        "words": f"{st.median(len(t.text.split()) for t in spoken):.0f}" if spoken else "-",
        "s/turn": f"{st.median(t.seconds for t in turns):.2f}" if turns else "-",
        "right action": pct(sum((t.calls[0] if t.calls else None) == t.right for t in routing), len(routing))
        if routing
        else "-",
        "grounded": pct(sum(bool(t.grounded) for t in checked), len(checked)),
        "valid": pct(sum(schema_ok), len(schema_ok)) if schema_ok is not None else "-",
        "failed": pct(sum(t.error is not None for t in turns), len(turns)),
    }


def create(
    b: Bridge,
    npc_id: str,
    spec: dict[str, Any],
    tools: dict[str, Any],
    with_tools: bool,
    options: dict[str, Any],
    suffix: str = "",
) -> str:
    name = npc_id + suffix
    defs = (
        [
            {"name": n, "description": tools[n]["description"], "parameters": tools[n]["parameters"]}
            for n in spec["tools"]
        ]
        if with_tools
        else []
    )
    b.call(
        "npc/create", {"npcId": name, "persona": spec["persona"], "tools": defs, "engine": "llama", "options": options}
    )
    return name


def run(root: str, bridge_args: list[str], options: dict[str, Any], show: bool) -> list[dict[str, str]]:
    data = json.load(open(DATA))
    tools, personas = data["tools"], data["personas"]
    answers = {k: v["answer"] for k, v in tools.items()}
    b = Bridge(root, bridge_args)
    rows: list[dict[str, str]] = []
    all_turns: list[Turn] = []
    try:
        for with_tools in (False, True):
            config = "dialogue, tools offered (auto)" if with_tools else "dialogue, no tools"
            sfx = "-t" if with_tools else ""
            turns: list[Turn] = []
            for i, ex in enumerate(data["single"]):
                npc = create(b, ex["npc"], personas[ex["npc"]], tools, with_tools, options, f"{sfx}-s{i}")
                turns.append(b.turn(Turn(config, npc, ex["prompt"], asks_name=bool(ex.get("asksName"))), answers))
            for i, conv in enumerate(data["conversations"]):
                npc = create(b, conv["npc"], personas[conv["npc"]], tools, with_tools, options, f"{sfx}-c{i}")
                for prompt in conv["prompts"]:
                    asks = bool(re.search(r"name|who are you|call you", prompt, re.I))
                    turns.append(b.turn(Turn(config, npc, prompt, asks_name=asks), answers))
            for t in turns:
                t.npc = t.npc.split("-")[0]
            ground(turns, tools)
            rows.append(summarize(config, turns, personas))
            all_turns += turns
        route = data["routing"]
        direct = {
            "name": "respond_directly",
            "description": (
                "Answer the player directly, without any other action: small talk, questions about you, "
                "anything no other tool is for."
            ),
            "parameters": {"type": "object", "properties": {}, "required": []},
        }
        for mode in ("auto", "required", "required + respond_directly"):
            turns = []
            for i, line in enumerate(route["lines"]):
                spec = personas[route["npc"]]
                npc = create(b, route["npc"], spec, tools, True, options, f"-r{len(mode)}-{i}")
                params: dict[str, Any] = {"maxToolRounds": 1}
                if mode == "required":
                    params["toolChoice"] = "required"
                elif mode != "auto" and b.tool_or_answer:
                    params["toolChoice"] = "tool_or_answer"
                elif mode != "auto":
                    b.call("npc/delete", {"npcId": npc})
                    defs = [
                        {"name": n, "description": tools[n]["description"], "parameters": tools[n]["parameters"]}
                        for n in spec["tools"]
                    ] + [direct]
                    b.call(
                        "npc/create",
                        {
                            "npcId": npc,
                            "persona": spec["persona"],
                            "tools": defs,
                            "engine": "llama",
                            "options": options,
                        },
                    )
                    params["toolChoice"] = "required"
                t = b.turn(
                    Turn(f"routing: {mode}", npc, line["prompt"], right=line["right"]),
                    {**answers, "respond_directly": {"ok": True}},
                    **params,
                )
                t.calls = [c for c in t.calls if c != "respond_directly"] or []
                t.npc = route["npc"]
                turns.append(t)
            ground(turns, tools)
            rows.append(summarize(f"routing: {mode}", turns, personas))
            all_turns += turns
        turns, ok = [], []
        for i, ex in enumerate(data["schema"]):
            npc = create(b, ex["npc"], personas[ex["npc"]], tools, False, options, f"-j{i}")
            t = b.turn(Turn("schema answers", npc, ex["prompt"]), answers, schema=ex["schema"], toolChoice="none")
            t.npc = ex["npc"]
            # the bridge validated the answer against the schema; "line" is what is spoken
            ok.append(t.error is None and isinstance(t.answer, dict))
            if isinstance(t.answer, dict) and isinstance(t.answer.get("line"), str):
                t.text = t.answer["line"]
            turns.append(t)
        rows.append(summarize("schema answers (spoken field)", turns, personas, ok))
        all_turns += turns
        same = deterministic(b, data, options)
    finally:
        b.close()
    print(f"same transcript twice at temperature 0, seed {options.get('seed')}: {same}\n")
    if show:
        for t in all_turns:
            what = t.error or (t.text.replace("\n", " / ")[:300])
            calls = f" calls={t.calls}" if t.calls else ""
            print(f"[{t.config}] {t.npc}: {t.prompt!r} -> {what!r}{calls} ({t.finish}, {t.seconds:.1f}s)")
        print()
    return rows


def deterministic(b: Bridge, data: dict[str, Any], options: dict[str, Any]) -> str:
    conv = data["conversations"][0]
    spec = data["personas"][conv["npc"]]
    texts = []
    for run in range(2):
        npc = create(b, conv["npc"], spec, data["tools"], False, {**options, "temperature": 0}, f"-det{run}")
        texts.append([b.turn(Turn("det", npc, p), {}).text for p in conv["prompts"]])
    if texts[0] == texts[1]:
        return "yes"
    first = next(i for i, (x, y) in enumerate(zip(*texts, strict=True)) if x != y)
    return f"no (turn {first + 1} differs: {texts[0][first]!r} / {texts[1][first]!r})"


def print_table(rows: list[dict[str, str]]) -> None:
    cols = list(rows[0])
    print("| " + " | ".join(cols) + " |")
    print("|" + "|".join("---" for _ in cols) + "|")
    for r in rows:
        print("| " + " | ".join(r[c] for c in cols) + " |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a GGUF model file (default: the bundled SmolLM2)")
    ap.add_argument("--root", default=ROOT, help="source tree whose bridge is started (default: this repository)")
    ap.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: the engine's)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--show", action="store_true", help="print every line")
    args = ap.parse_args()
    bridge_args = ["--model", args.model] if args.model else []
    options: dict[str, Any] = {"seed": args.seed}
    if args.temperature is not None:
        options["temperature"] = args.temperature
    t0 = time.perf_counter()
    rows = run(os.path.abspath(args.root), bridge_args, options, args.show)
    print_table(rows)
    print(
        f"\n{sum(int(r['turns']) for r in rows)} turns in {time.perf_counter() - t0:.0f} s; "
        f"model {args.model or 'bundled SmolLM2-135M-Instruct'}; options {options}"
    )


if __name__ == "__main__":
    main()
