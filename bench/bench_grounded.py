"""Does the keeper say the count the game gave? ``make demo``'s grounded exchange (issue 29,
item 4), played for N seeds on two of llama.cpp's CPU variants, with the grounding on and
off (off: the soft fact bias alone, the engine before it).

The exchange is demo/scene.py's: Greta (the same persona and ``check_inventory`` tool) is
asked her name (toolChoice none), then "Do you have any ale left?" with toolChoice required
and maxToolRounds 1; the game answers ``{"item": "ale", "inStock": 3}`` and her line should
say 3. Each configuration runs in its own ``oam-bridge`` subprocess, NPCs one after the
other as in the demo: the best CPU variant this machine runs (no ``$OAM_LLAMA_CPU``), and
``haswell`` (``$OAM_LLAMA_CPU=haswell``: AVX2 kernels, whose sums differ from AVX-512's in
the last bits); ``$OAM_LLAMA_GROUNDED`` 1 and 0. Per configuration: the demo's own options
(temperature 0, seed 7: one line, the same for every seed) and N seeds at ``--temperature``.

Columns: **said**, lines that say the count (``3`` or ``three``, a whole number);
**once**, of those, lines that say it exactly once; **sentence end**, lines that end where a
sentence ends; **brace**, lines with ``{`` or ``}``; **words**, the median; **how**, how the
count came to be said, from the bridge's debug log: by the model's own draw, taken where the
model found it nearly as likely as its best token, pressed after the model would have ended
the sentence without it, or forced (``_worker.Sampling._ground``); **s/line**, the median
time of the grounded turn.

Usage: python bench/bench_grounded.py [--seeds 20] [--temperature 0.7] [--variants best,haswell] [--show]
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import statistics as st
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "demo"))

from scene import INVENTORY, LINES, TOOLS  # noqa: E402 - the demo's own tool, stock and lines

from bridge.engines.llama._lines import value_pattern  # noqa: E402

# demo/scene.py's Greta (its create call, in main()); the demo's options are DEMO_OPTIONS
KEEPER = {
    "name": "Greta",
    "role": "the keeper of the Rusty Flagon tavern",
    "traits": ["gruff", "warm-hearted"],
    "speechStyle": "Short, plain sentences.",
}
DEMO_OPTIONS = {"temperature": 0.0, "maxTokens": 60, "seed": 7}
SENTENCE_END = re.compile(r"[.!?…][\"'”’)\]]*$")
VARIANT = re.compile(r"llama\.cpp CPU backend: (.+)$")
HOW = re.compile(r"said '([^']*)' \((\w+):")


class Bridge:
    """One ``oam-bridge`` subprocess on the llama engine, spoken to line by line."""

    def __init__(self, env: dict[str, str]) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-m", "bridge", "--engine", "llama"],
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.stderr: queue.Queue[str] = queue.Queue()
        self.variant = ""  # as the bridge says it on stderr when the model loads
        threading.Thread(target=self._read_stderr, daemon=True).start()
        self.next_id = 0

    def _read_stderr(self) -> None:
        assert self.p.stderr is not None
        for line in self.p.stderr:
            if m := VARIANT.search(line.rstrip("\n")):
                self.variant = m.group(1)
            self.stderr.put(line.rstrip("\n"))

    def log(self) -> list[str]:
        """The stderr lines written since the last call."""
        out = []
        while True:
            try:
                out.append(self.stderr.get_nowait())
            except queue.Empty:
                return out

    def send(self, method: str, params: dict[str, Any]) -> int:
        assert self.p.stdin is not None
        self.next_id += 1
        self.p.stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params}) + "\n"
        )
        self.p.stdin.flush()
        return self.next_id

    def read(self) -> dict[str, Any]:
        assert self.p.stdout is not None
        line = self.p.stdout.readline()
        if not line:
            raise EOFError("the bridge closed its stdout")
        return json.loads(line)  # type: ignore[no-any-return]

    def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        i = self.send(method, params)
        while True:
            msg = self.read()
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]  # type: ignore[no-any-return]

    def turn(self, npc: str, prompt: str, **kw: Any) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """One ``npc/respond``, every tool call answered as demo/scene.py answers it; the
        terminal event's params and the calls."""
        tid = self.call("npc/respond", {"npcId": npc, "prompt": prompt, **kw})["turnId"]
        calls = []
        while True:
            msg = self.read()
            p = msg.get("params", {})
            if p.get("turnId") != tid:
                continue
            if msg["method"] == "turn/toolCallRequested":
                calls.append(p)
                item = p["arguments"].get("item", "")
                self.send(
                    "npc/submit",
                    {"npcId": npc, "callId": p["callId"], "output": {"item": item, "inStock": INVENTORY.get(item, 0)}},
                )
            elif msg["method"] == "turn/completed":
                return p, calls
            elif msg["method"] == "turn/failed":
                raise RuntimeError(f"turn failed: {p['error']}")

    def close(self) -> None:
        try:
            self.call("shutdown", {})
            assert self.p.stdin is not None
            self.p.stdin.close()
            self.p.wait(timeout=30)
        except Exception:  # noqa: BLE001 - a bench ends its bridge whatever happened
            self.p.kill()


@dataclass
class Row:
    lines: list[str] = field(default_factory=list)
    said: int = 0
    once: int = 0
    ends: int = 0
    braces: int = 0
    asked: int = 0  # the tool was called for the ale
    words: list[int] = field(default_factory=list)
    secs: list[float] = field(default_factory=list)
    how: Counter[str] = field(default_factory=Counter)

    def add(self, text: str, calls: list[dict[str, Any]], secs: float, log: list[str]) -> None:
        items = [c["arguments"].get("item") for c in calls]
        self.asked += items == ["ale"]
        count = str(INVENTORY.get(items[-1], 0)) if items else "3"
        n = len(value_pattern(count).findall(text))
        self.lines.append(text)
        self.said += n > 0
        self.once += n == 1
        self.ends += bool(SENTENCE_END.search(text))
        self.braces += "{" in text or "}" in text
        self.words.append(len(text.split()))
        self.secs.append(secs)
        hows = [m.group(2) for line in log if (m := HOW.search(line)) and m.group(1) == count]
        self.how[hows[0] if hows else ("model" if n else "not said")] += 1


def play(bridge: Bridge, npc: str, options: dict[str, Any], row: Row) -> None:
    bridge.call("npc/create", {"npcId": npc, "persona": KEEPER, "tools": TOOLS, "options": options})
    (name_line, name_choice), (ale_line, ale_choice) = LINES
    bridge.turn(npc, name_line, toolChoice=name_choice, maxToolRounds=1)
    bridge.log()
    t = time.monotonic()
    done, calls = bridge.turn(npc, ale_line, toolChoice=ale_choice, maxToolRounds=1)
    secs = time.monotonic() - t
    time.sleep(0.05)  # the debug lines of the turn's last step
    row.add(done["text"], calls, secs, bridge.log())
    bridge.call("npc/delete", {"npcId": npc})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", type=int, default=20, help="seeds per configuration at --temperature")
    ap.add_argument(
        "--temperature", type=float, default=0.7, help="the seeded runs' temperature (the engine's default)"
    )
    ap.add_argument(
        "--variants", default="best,haswell", help="CPU variants: best (this CPU's), or a name for $OAM_LLAMA_CPU"
    )
    ap.add_argument(
        "--modes", default="on,off", help="grounding on ($OAM_LLAMA_GROUNDED=1) and off (the soft bias alone)"
    )
    ap.add_argument("--show", action="store_true", help="print every line")
    args = ap.parse_args()
    print(
        f"demo/scene.py's keeper: {LINES[1][0]!r} -> check_inventory(ale) -> in stock {INVENTORY['ale']}; "
        f"per configuration the demo's options {DEMO_OPTIONS} once, then {args.seeds} seeds at temperature "
        f"{args.temperature} (maxTokens 60); one NPC at a time",
        flush=True,
    )
    header = (
        "| CPU variant | grounding | temperature | lines | tool called | said | once | sentence end | brace | words "
        "| how | s/line |"
    )
    rows: list[str] = []
    for variant in args.variants.split(","):
        for mode in args.modes.split(","):
            env = {k: v for k, v in os.environ.items() if k not in ("OAM_LLAMA_CPU", "OAM_LLAMA_GROUNDED")}
            env["OAM_LOG"] = "debug"
            env["OAM_LLAMA_GROUNDED"] = "1" if mode == "on" else "0"
            if variant != "best":
                env["OAM_LLAMA_CPU"] = variant
            bridge = Bridge(env)
            try:
                bridge.call(
                    "initialize", {"protocolVersion": 1, "clientInfo": {"name": "bench-grounded", "version": "1"}}
                )
                runs = [(0.0, [DEMO_OPTIONS["seed"]]), (args.temperature, list(range(1, args.seeds + 1)))]
                for temp, seeds in runs:
                    row = Row()
                    for seed in seeds:
                        play(bridge, f"greta-{seed}", {**DEMO_OPTIONS, "temperature": temp, "seed": seed}, row)
                    name = f"{variant} ({bridge.variant})" if bridge.variant else variant
                    n = len(row.lines)
                    how = ", ".join(f"{k} {v}" for k, v in sorted(row.how.items()))
                    rows.append(
                        f"| {name} | {mode} | {temp:g} | {n} | {row.asked}/{n} | **{row.said}/{n}** | "
                        f"{row.once}/{row.said} | {row.ends}/{n} | {row.braces}/{n} | {st.median(row.words):g} | "
                        f"{how} | {st.median(row.secs):.2f} |"
                    )
                    print(rows[-1], flush=True)
                    if args.show:
                        for seed, text in zip(seeds, row.lines, strict=True):
                            print(f"    seed {seed}: {text}")
            finally:
                bridge.close()
    print()
    print(header)
    print("|---" * (header.count("|") - 1) + "|")
    for r in rows:
        print(r)


if __name__ == "__main__":
    main()
