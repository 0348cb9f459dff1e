"""NPC line quality on a real model, through the real ``oam-bridge`` subprocess, beside a
baseline revision of the bridge in the same run.

Plays the exchanges of ``bench/quality/exchanges.json`` (personas, single lines, five-turn
conversations with and without tools, the tavern routing set, schema turns) and the
written-first routing sets of ``bench/quality/routing_sets.json`` (healer, ferryman, quest
giver) on the llama engine, plus the lore set of ``bench/quality/lore.json`` (8 facts
given as ``world/set`` lore, 10 questions asked in other words, 4 unrelated lines). Every
exchange (one line, one five-turn conversation, one routing line, one schema turn, one lore
question) runs in its own fresh bridge process, so no result depends on what ran before it in
a process (the llama engine reuses KV prefixes saved from other NPCs). A spare process is
started, initialized and has its model loaded while the previous exchange plays (a pool of
one); the time this costs is printed. Each exchange is played once per seed; the figures are
summed over the seeds.

Both bridges play every exchange in the same run, one after the other: this checkout
("now") and a baseline revision checked out with ``git worktree add --detach`` into a
temporary folder (removed afterwards), started with the same Python and venv. Fields the
baseline rejects as unknown (tool ``examples``, ...) are dropped for it and named under the
table. Figures, per configuration, baseline beside now:

- **own name**: lines that answer "what's your name?" and contain the persona's name;
  **other name**: lines where the NPC calls itself by another name ("I'm Grimjack");
- **leaked**: lines that speak JSON, tool-call syntax, tool-result labels, chat-template tokens
  or the prompt's own instructions;
- **rep 4-gram**: the share of repeated 4-grams within a line (mean); **loops**: lines where
  one 4-gram comes back three times or more;
- **cut off**: lines that do not end at a sentence boundary (or ended by ``maxTokens``);
- **words**, **s/turn**: medians;
- **right action**: routing lines whose first tool call (or none, for small talk) was the
  right one, toolChoice ``auto`` with the bridge's default routing (the tavern set with its
  tools' ``examples``, and the written-first sets apart), ``required`` and ``tool_or_answer``;
- **args right**: routing lines whose right tool was called first and whose data gives the
  arguments (``args``: exact values; ``argsMatch``: a regex a free string must match), with
  those arguments;
- **grounded**: lines after a tool call that say what the tool answered (the line's own
  ``grounded`` expectation where the right tool was called: the price asked about, two menu
  items with their prices, ...; else the tool's ``mentions`` pattern), in a line that leaked
  nothing; **invented**: lines after a tool that answered prices (or after ``get_menu``) that
  name a coin amount the tool did not answer, or a dish or drink (``foodWords``) not on the menu;
- **retrieved**: lore questions whose fact reached the step (``turn/completed`` ``routing.lore``
  names it; on a bridge without it, a ``recall`` call of that topic); **said**: retrieved and
  the line says the fact's words; **retrieved none**: unrelated lines that retrieved nothing;
- **valid**: schema answers that completed and match the schema; **failed**: turns that
  ended ``turn/failed``.

Last, one five-turn conversation is played at temperature 0 twice in one process (the second
NPC may reuse the first's saved prefixes) and once in another, and the bench says whether the
transcripts are the same.

The game side answers every tool call with the tool's canned ``answer`` from the data files
(``{"ok": true}`` where there is none).

Usage::

    python bench/bench_quality.py                       # seeds 1,2 at 0.7, beside 08b80db
    python bench/bench_quality.py --seeds 1,2,3         # three seeds (about 1.5 times as long)
    python bench/bench_quality.py --quick --show        # one seed, no baseline, every line
    python bench/bench_quality.py --baseline REV        # beside another revision
    python bench/bench_quality.py --no-baseline         # this bridge alone
    python bench/bench_quality.py --seeds 4,5 --temperature 0.2 # other seeds, sampling
    python bench/bench_quality.py --model my.gguf       # your own GGUF model
    python bench/bench_quality.py --root OTHER_CHECKOUT # another version of the bridge as "now"
    python bench/bench_quality.py --only routing --check-order  # a subset, replayed reversed
    python bench/bench_quality.py --save run.json       # every exchange's result, to compare
    python bench/bench_quality.py --against run.json    # the same exchanges as a saved run?
    python bench/bench_quality.py --markdown table.md   # the table to a file too
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import statistics as st
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "bench", "quality", "exchanges.json")
SETS = os.path.join(ROOT, "bench", "quality", "routing_sets.json")
NOW = "now"

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
    r"\b(?:heal_wounds|sell_remedy|book_passage|get_fares|give_quest|report_quest)\b",
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
NUMBERS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten", "eleven", "twelve"]
COIN = re.compile(r"\b(\d+|" + "|".join(NUMBERS) + r")\s+(copper|silver|gold)", re.I)

# The lore set (bench/quality/lore.json, shared with tests/model/test_llama_lore.py): the facts,
# the questions (the key that answers each, words a line that says the fact would use), lines
# that call for no lore.
_LORE_SET = json.load(open(os.path.join(ROOT, "bench", "quality", "lore.json")))
LORE: dict[str, str] = _LORE_SET["lore"]
LORE_QUESTIONS = [(q["prompt"], q["key"], tuple(q["words"])) for q in _LORE_SET["questions"]]
LORE_UNRELATED: list[str] = _LORE_SET["unrelated"]
LORE_PERSONA: dict[str, str] = _LORE_SET["persona"]

# Started by the baseline when its tree predates the portable llama.cpp wheel (5d439a8): this
# checkout's loader registers the CPU backend (llama.cpp looks for it only beside the
# executable), then the baseline's own bridge runs. argv: the loader's file, the bridge's args.
BASELINE_LAUNCHER = (
    "import importlib.util, runpy, sys\n"
    "spec = importlib.util.spec_from_file_location('_oam_cpu', sys.argv[1])\n"
    "cpu = importlib.util.module_from_spec(spec)\n"
    "spec.loader.exec_module(cpu)\n"
    "cpu.load_backends()\n"
    "sys.argv = ['oam-bridge', *sys.argv[2:]]\n"
    "runpy.run_module('bridge', run_name='__main__', alter_sys=True)\n"
)
UNKNOWN_FIELD = re.compile(r"unknown field `(\w+)`(?: - at `\$\.(\w+)\[\d+\]`)?")


# ---- exchanges ----


@dataclass
class Exchange:
    """What one fresh bridge process plays: one NPC, its world, its prompts."""

    key: str  # unique in a run (the same key in two runs is the same exchange)
    config: str  # the table's row
    kind: str  # dialogue | routing | schema | lore | unrelated | det
    seed: int
    persona: dict[str, Any]
    tools: list[dict[str, Any]]  # as npc/create gets them
    prompts: list[str]
    options: dict[str, Any]
    answers: dict[str, Any] = field(default_factory=dict)  # tool name -> the game's answer
    respond: dict[str, Any] = field(default_factory=dict)  # more npc/respond params
    world: list[dict[str, Any]] = field(default_factory=list)  # world/set params, before the NPC
    line: dict[str, Any] = field(default_factory=dict)  # the data row (right, args, grounded, lore key, ...)
    asks_name: list[bool] = field(default_factory=list)


@dataclass
class Turn:
    prompt: str
    asks_name: bool = False
    text: str = ""
    finish: str = ""
    seconds: float = 0.0
    calls: list[dict[str, Any]] = field(default_factory=list)  # name, arguments, output, error
    error: str | None = None
    answer: Any = None
    routing: dict[str, Any] | None = None

    def first(self) -> str | None:
        return self.calls[0]["name"] if self.calls else None

    def signature(self) -> list[Any]:
        """What the model did, without timings: equal for equal behaviour."""
        return [self.text, self.finish, [[c["name"], c.get("arguments")] for c in self.calls], self.answer, self.error]


def tool_defs(tools: dict[str, Any], names: Iterable[str], examples: dict[str, list[str]]) -> list[dict[str, Any]]:
    out = []
    for n in names:
        d = {"name": n, "description": tools[n]["description"], "parameters": tools[n]["parameters"]}
        if examples.get(n):
            d["examples"] = examples[n]
        out.append(d)
    return out


def build_seed(data: dict[str, Any], sets: dict[str, Any], seed: int, temperature: float) -> list[Exchange]:
    """Every exchange of one seed."""
    tools, personas = data["tools"], data["personas"]
    examples: dict[str, list[str]] = sets["tavern_examples"]
    answers = {k: v["answer"] for k, v in tools.items()}
    out: list[Exchange] = []
    opts = {"seed": seed, "temperature": temperature}

    def add(config: str, item: str, **kw: Any) -> None:
        out.append(Exchange(key=f"{config} | {item} | seed {seed}", config=config, seed=seed, options=opts, **kw))

    for with_tools in (False, True):
        config = "dialogue, tools offered (auto)" if with_tools else "dialogue, no tools"
        for i, ex in enumerate(data["single"]):
            spec = personas[ex["npc"]]
            add(
                config,
                f"single {i}",
                kind="dialogue",
                persona=spec["persona"],
                tools=tool_defs(tools, spec["tools"], examples) if with_tools else [],
                prompts=[ex["prompt"]],
                answers=answers,
                asks_name=[bool(ex.get("asksName"))],
            )
        for i, conv in enumerate(data["conversations"]):
            spec = personas[conv["npc"]]
            add(
                config,
                f"conversation {i}",
                kind="dialogue",
                persona=spec["persona"],
                tools=tool_defs(tools, spec["tools"], examples) if with_tools else [],
                prompts=conv["prompts"],
                answers=answers,
                asks_name=[bool(re.search(r"name|who are you|call you", p, re.I)) for p in conv["prompts"]],
            )
    route = data["routing"]
    spec = personas[route["npc"]]
    for choice in ("auto", "required", "tool_or_answer"):
        config = f"tavern routing, {choice}" + (" (default routing)" if choice == "auto" else "")
        for i, line in enumerate(route["lines"]):
            add(
                config,
                f"line {i}",
                kind="routing",
                persona=spec["persona"],
                tools=tool_defs(tools, spec["tools"], examples),
                prompts=[line["prompt"]],
                answers=answers,
                respond={"toolChoice": choice, "maxToolRounds": 1},
                line={**line, "set": "tavern"},
            )
    for name, s in sets["sets"].items():
        defs = [{k: t[k] for k in ("name", "description", "parameters", "examples") if k in t} for t in s["tools"]]
        set_tools = {t["name"]: t for t in s["tools"]}
        for i, line in enumerate(s["lines"]):
            add(
                "written-first sets, auto (default routing)",
                f"{name} line {i}",
                kind="routing",
                persona=s["persona"],
                tools=defs,
                prompts=[line["prompt"]],
                answers={n: t["answer"] for n, t in set_tools.items() if "answer" in t},
                respond={"toolChoice": "auto", "maxToolRounds": 1},
                line={**line, "set": name, "tools": set_tools},
            )
    for i, ex in enumerate(data["schema"]):
        add(
            "schema answers (spoken field)",
            f"schema {i}",
            kind="schema",
            persona=personas[ex["npc"]]["persona"],
            tools=[],
            prompts=[ex["prompt"]],
            respond={"schema": ex["schema"], "toolChoice": "none"},
        )
    world = [{"key": k, "value": v, "lore": True} for k, v in LORE.items()]
    lore_opts = {**opts, "maxTokens": 60}  # as tests/model/test_llama_lore.py
    for i, (q, key, words) in enumerate(LORE_QUESTIONS):
        out.append(
            Exchange(
                key=f"lore questions | question {i} | seed {seed}",
                config="lore questions (8 facts)",
                kind="lore",
                seed=seed,
                persona=LORE_PERSONA,
                tools=[],
                prompts=[q],
                options=lore_opts,
                world=world,
                line={"key": key, "words": words},
            )
        )
    for i, q in enumerate(LORE_UNRELATED):
        out.append(
            Exchange(
                key=f"lore unrelated | line {i} | seed {seed}",
                config="lore, unrelated lines",
                kind="unrelated",
                seed=seed,
                persona=LORE_PERSONA,
                tools=[],
                prompts=[q],
                options=lore_opts,
                world=world,
            )
        )
    return out


def build(data: dict[str, Any], sets: dict[str, Any], seeds: list[int], temperature: float) -> list[Exchange]:
    out = [ex for seed in seeds for ex in build_seed(data, sets, seed, temperature)]
    personas = data["personas"]
    conv = data["conversations"][0]
    for where in ("one process", "another process"):
        out.append(
            Exchange(
                key=f"temperature 0 | {where} | seed {seeds[0]}",
                config="temperature 0, same transcript",
                kind="det",
                seed=seeds[0],
                persona=personas[conv["npc"]]["persona"],
                tools=[],
                prompts=conv["prompts"],
                options={"seed": seeds[0], "temperature": 0},
                line={"twice": where == "one process"},
            )
        )
    return out


# ---- bridges ----


@dataclass
class Side:
    """One version of the bridge: a column of the table."""

    label: str
    root: str
    command: list[str]
    dropped: set[str] = field(default_factory=set)  # fields it rejected, dropped from then on
    variants: set[str] = field(default_factory=set)  # llama.cpp CPU variants it loaded
    note: str = ""


class Bridge:
    """One ``oam-bridge`` process. Started with its handshake and a throwaway NPC that loads
    the model (created and deleted without a turn: nothing is decoded) sent at once; ``ready``
    reads their answers."""

    def __init__(self, side: Side, args: list[str]) -> None:
        self.side = side
        self.err: IO[bytes] = tempfile.TemporaryFile()
        self.started = time.perf_counter()
        self.p = subprocess.Popen(
            [*side.command, "--engine", "llama", *args],
            cwd=side.root,
            env={**os.environ, "PYTHONPATH": side.root},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self.err,
            bufsize=0,
        )
        self.ids = 0
        self.early = [
            self.send("initialize", {"protocolVersion": 1}),
            self.send("npc/create", {"npcId": "_load", "persona": {"name": "Load", "role": "none"}, "engine": "llama"}),
            self.send("npc/delete", {"npcId": "_load"}),
        ]
        self.tool_or_answer = False
        self.ready_after = 0.0  # seconds from start to the last early answer
        self.replies: list[dict[str, Any]] = []
        self.reader = threading.Thread(target=self._read_early, daemon=True)
        self.reader.start()

    def _read_early(self) -> None:
        """Reads the early answers as they come, to time when the process was ready."""
        try:
            while len(self.replies) < len(self.early):
                self.replies.append(self.line())
        except (EOFError, ValueError, OSError):
            pass
        self.ready_after = time.perf_counter() - self.started

    def ready(self) -> None:
        self.reader.join()
        if len(self.replies) < len(self.early):
            raise EOFError(f"the bridge did not start: {self.stderr()[-600:]}")
        for msg in self.replies:
            if "error" in msg:
                raise RuntimeError(f"start: {msg['error']}")
        caps = self.replies[0]["result"]["capabilities"]
        self.tool_or_answer = "tool_or_answer" in caps["tools"]["toolChoice"]

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
            raise EOFError(f"the bridge closed its stdout: {self.stderr()[-600:]}")
        return json.loads(raw)  # type: ignore[no-any-return]

    def reply(self, i: int) -> Any:
        while True:
            msg = self.line()
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]

    def call(self, method: str, params: dict[str, Any]) -> Any:
        """A request; a field this bridge rejects as unknown is dropped (and remembered for the
        whole side) and the request sent again."""
        params = self.without(method, params)
        while True:
            try:
                return self.reply(self.send(method, params))
            except RuntimeError as e:
                err = e.args[0]
                m = UNKNOWN_FIELD.search(str(err.get("message", ""))) if isinstance(err, dict) else None
                if m is None:
                    raise RuntimeError(f"{method}: {err}") from None
                self.side.dropped.add(f"{m.group(2)}[].{m.group(1)}" if m.group(2) else f"{method} {m.group(1)}")
                before = json.dumps(params)
                params = self.without(method, params)
                if json.dumps(params) == before:
                    raise RuntimeError(f"{method}: {err}") from None

    def without(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        """``params`` without the fields this side rejected: ``tools[].examples`` in any
        request's tools, ``npc/respond pinArguments`` in that method's params."""
        out = dict(params)
        for d in self.side.dropped:
            if "[]." in d:
                where, name = d.split("[].")
                if isinstance(out.get(where), list):
                    out[where] = [{k: v for k, v in x.items() if k != name} for x in out[where]]
            elif d.split(" ")[0] == method:
                out.pop(d.split(" ")[1], None)
        return out

    def turn(self, npc: str, t: Turn, answers: dict[str, Any], params: dict[str, Any]) -> Turn:
        t0 = time.perf_counter()
        turn_id = self.call("npc/respond", {"npcId": npc, "prompt": t.prompt, "fullText": False, **params})["turnId"]
        requested: list[dict[str, Any]] = []
        while True:
            msg = self.line()
            p = msg.get("params", {})
            if p.get("turnId") != turn_id:
                continue
            method = msg.get("method")
            if method == "turn/toolCallRequested":
                requested.append({"name": p["name"], "arguments": p.get("arguments")})
                self.send(
                    "npc/submit",
                    {"npcId": npc, "callId": p["callId"], "output": answers.get(p["name"], {"ok": True})},
                )
            elif method == "turn/completed":
                t.text, t.finish, t.answer = p["text"], p["finishReason"], p["json"]
                t.calls = p["toolCalls"] or requested
                t.routing = p.get("routing")
                break
            elif method == "turn/failed":
                t.error = p["error"]["code"] + ": " + p["error"]["message"]
                t.calls = requested
                break
        t.seconds = time.perf_counter() - t0
        return t

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")

    def close(self) -> None:
        assert self.p.stdin is not None
        try:
            self.p.stdin.close()
            self.p.wait(timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            self.p.kill()
            self.p.wait()
        self.side.variants.update(re.findall(r"CPU backend: (\S+)", self.stderr()))
        self.err.close()


@dataclass
class Costs:
    """What fresh processes cost: started, seconds each took to be ready, seconds the run
    waited for one, seconds closing them."""

    started: int = 0
    ready: list[float] = field(default_factory=list)
    waited: float = 0.0
    closing: float = 0.0


class Pool:
    """A pool of one: the next process starts (and loads its model) while one plays."""

    def __init__(self, side: Side, args: list[str], costs: Costs) -> None:
        self.side, self.args, self.costs = side, args, costs
        self.spare: Bridge | None = None

    def _start(self) -> Bridge:
        self.costs.started += 1
        return Bridge(self.side, self.args)

    def take(self) -> Bridge:
        t0 = time.perf_counter()
        b = self.spare or self._start()
        b.ready()
        self.costs.waited += time.perf_counter() - t0
        self.costs.ready.append(b.ready_after)
        self.spare = self._start()
        return b

    def give_back(self, b: Bridge) -> None:
        t0 = time.perf_counter()
        b.close()
        self.costs.closing += time.perf_counter() - t0

    def close(self) -> None:
        if self.spare is not None:
            self.spare.close()
            self.spare = None


def play(pool: Pool, ex: Exchange) -> list[Turn]:
    b = pool.take()
    try:
        for w in ex.world:
            b.call("world/set", w)
        respond = dict(ex.respond)
        if respond.get("toolChoice") == "tool_or_answer" and not b.tool_or_answer:
            return [Turn(p, error="skipped: no tool_or_answer") for p in ex.prompts]
        runs = 2 if ex.line.get("twice") else 1
        turns: list[Turn] = []
        for r in range(runs):
            npc = f"npc{r}"
            b.call(
                "npc/create",
                {"npcId": npc, "persona": ex.persona, "tools": ex.tools, "engine": "llama", "options": ex.options},
            )
            asks = ex.asks_name or [False] * len(ex.prompts)
            for prompt, asks_name in zip(ex.prompts, asks, strict=True):
                turns.append(b.turn(npc, Turn(prompt, asks_name=asks_name), ex.answers, respond))
        return turns
    finally:
        pool.give_back(b)


# ---- figures ----


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


def coins(text: str) -> set[tuple[int, str]]:
    """Coin amounts said: ``{(3, "copper")}`` for "3 copper" and "three copper"."""
    out = set()
    for n, metal in COIN.findall(text):
        out.add((int(n) if n.isdigit() else NUMBERS.index(n.lower()), metal.lower()))
    return out


def item_word(item: str) -> re.Pattern[str]:
    """A menu item by its last word, singular or plural: "lamb stew" by "stew"."""
    return re.compile(r"\b" + re.escape(item.split()[-1]) + r"s?\b", re.I)


def priced_items(text: str, menu: dict[str, tuple[int, str]]) -> set[str]:
    """The menu items said with their own price: the first price after the item in the same
    sentence with no other item between, else the last price before it."""
    said = set()
    for sentence in re.split(r"(?<=[.!?;])\s+", text):
        items = [(m.start(), m.end(), it) for it in menu for m in item_word(it).finditer(sentence)]
        prices = [(m.start(), m.end(), next(iter(coins(m.group(0))))) for m in COIN.finditer(sentence)]
        for a, b, it in items:
            after = [p for p in prices if p[0] >= b and not any(b <= q[0] < p[0] for q in items if q[2] != it)]
            before = [p for p in prices if p[1] <= a and not any(p[1] <= q[0] < a for q in items if q[2] != it)]
            price = after[0][2] if after else before[-1][2] if before else None
            if price == menu[it]:
                said.add(it)
    return said


def menu_of(answer: Any) -> dict[str, tuple[int, str]]:
    rows = answer.get("menu", []) if isinstance(answer, dict) else []
    return {r["item"]: next(iter(coins(r["price"]))) for r in rows if coins(r["price"])}


def grounded(ex: Exchange, t: Turn, tools: dict[str, Any]) -> bool | None:
    """Whether a line after a tool call says what the tool answered; None: nothing to check."""
    if t.error is not None or not t.calls:
        return None
    names = [c["name"] for c in t.calls]
    want = ex.line.get("grounded")
    said = not LEAK.search(t.text)  # a leaked tool result does not count as said
    if want and ex.line.get("right") in names:
        menu = menu_of(ex.answers.get(ex.line["right"]))
        ok = all(re.search(p, t.text, re.I) for p in want.get("all", []))
        if "pairs" in want:
            ok = ok and len(priced_items(t.text, menu)) >= want["pairs"]
        if "named" in want:
            ok = ok and sum(bool(item_word(i).search(t.text)) for i in want["items"]) >= want["named"]
        return said and ok
    pats = [tools[n]["mentions"] for n in names if n in tools and "mentions" in tools[n]]
    if not pats:
        return None
    return said and any(re.search(p, t.text, re.I) for p in pats)


def invented(ex: Exchange, t: Turn, food: list[str]) -> bool | None:
    """Whether a line after a tool that answered prices (or the menu) names a price the tool
    did not answer or a dish or drink not on the menu; None: nothing to check."""
    if t.error is not None:
        return None
    answered: set[tuple[int, str]] = set()
    menu: set[str] = set()
    checked = False
    for c in t.calls:
        output = ex.answers.get(c["name"])
        if output is None:
            continue
        answered |= coins(json.dumps(output))
        on_menu = menu_of(output)
        menu |= {w.lower() for item in on_menu for w in item.split()}
        checked = checked or bool(coins(json.dumps(output))) or c["name"] == "get_menu"
    if not checked:
        return None
    if coins(t.text) - answered:
        return True
    if any(c["name"] == "get_menu" for c in t.calls):
        for w in food:
            if w not in menu and re.search(r"\b" + re.escape(w) + r"s?\b", t.text, re.I):
                return True
    return False


def args_right(ex: Exchange, t: Turn) -> bool | None:
    """Whether the first call, the right tool, has the arguments the line names; None: the
    line gives none, or the first call was not the right tool."""
    want, match = ex.line.get("args", {}), ex.line.get("argsMatch", {})
    if not (want or match) or t.first() != ex.line.get("right"):
        return None
    got = t.calls[0].get("arguments") or {}

    def same(a: Any, b: Any) -> bool:
        return a.lower() == b.lower() if isinstance(a, str) and isinstance(b, str) else bool(a == b)

    return all(same(got.get(k), v) for k, v in want.items()) and all(
        isinstance(got.get(k), str) and re.search(p, got[k], re.I) for k, p in match.items()
    )


def retrieved(ex: Exchange, t: Turn, key: str | None) -> bool:
    """The lore fact ``key`` (any, for None) reached the step: named in ``routing.lore``, or
    asked for with the bridge's ``recall`` tool."""
    lore = (t.routing or {}).get("lore") or []
    recalled = [(c.get("arguments") or {}).get("topic") for c in t.calls if c["name"] == "recall"]
    if key is None:
        return bool(lore or recalled)
    return key in lore or key in recalled


def frac(n: int, d: int) -> str:
    return "-" if d == 0 else f"{n}/{d}" if d < 20 else f"{n}/{d} ({100 * n / d:.0f}%)"


def count(values: Iterable[bool | None]) -> str:
    checked = [v for v in values if v is not None]
    return frac(sum(checked), len(checked))


Played = list[tuple[Exchange, list[Turn]]]  # one configuration on one side


def figures(config: str, played: Played, data: dict[str, Any]) -> dict[str, str]:
    """One configuration's figures on one side, over all seeds."""
    pairs = [(ex, t) for ex, turns in played for t in turns]
    turns = [t for _, t in pairs]
    kind = played[0][0].kind if played else ""
    if kind == "schema":  # the bridge validated the answer against the schema; "line" is what is spoken
        for t in turns:
            if isinstance(t.answer, dict) and isinstance(t.answer.get("line"), str):
                t.text = t.answer["line"]
    spoken = [t for t in turns if t.error is None and t.text.strip()]
    tools: dict[str, Any] = dict(data["tools"])
    for ex, _ in pairs:
        tools.update(ex.line.get("tools", {}))
    f: dict[str, str] = {"turns": str(len(turns))}
    if kind == "dialogue":
        f["own name"] = count(own_name_ok(t, ex.persona["name"]) for ex, t in pairs if t.asks_name and not t.error)
        f["other name"] = count(other_name(t, ex.persona["name"]) for ex, t in pairs if t in spoken)
    if kind == "routing":
        f["right action"] = count(t.first() == ex.line["right"] for ex, t in pairs)
        for name in sorted({ex.line["set"] for ex, _ in pairs} - {"tavern"}):
            f[f"  {name}"] = count(t.first() == ex.line["right"] for ex, t in pairs if ex.line["set"] == name)
        f["args right"] = count(args_right(ex, t) for ex, t in pairs)
    if kind in ("dialogue", "routing"):
        f["grounded"] = count(grounded(ex, t, tools) for ex, t in pairs)
        f["invented"] = count(invented(ex, t, data["foodWords"]) for ex, t in pairs)
    if kind == "lore":
        f["retrieved"] = count(retrieved(ex, t, ex.line["key"]) for ex, t in pairs if not t.error)
        f["said"] = count(
            retrieved(ex, t, ex.line["key"]) and any(w in t.text.lower() for w in ex.line["words"])
            for ex, t in pairs
            if not t.error
        )
    if kind == "unrelated":
        f["retrieved none"] = count(not retrieved(ex, t, None) for ex, t in pairs if not t.error)
    if kind == "schema":
        f["valid"] = count(t.error is None and isinstance(t.answer, dict) for t in turns)
    f["leaked"] = count(bool(LEAK.search(t.text)) for t in spoken)
    if kind == "dialogue":
        f["rep 4-gram"] = f"{st.mean(repetition(t.text) for t in spoken):.3f}" if spoken else "-"
        f["loops"] = count(loops(t.text) for t in spoken)
    f["cut off"] = count(cut_off(t) for t in spoken)
    f["words"] = f"{st.median(len(t.text.split()) for t in spoken):.0f}" if spoken else "-"
    f["s/turn"] = f"{st.median(t.seconds for t in turns):.2f}" if turns else "-"
    f["failed"] = count(t.error is not None for t in turns)
    return f


def same_transcripts(played: Played) -> dict[str, str]:
    """The temperature-0 check: the first NPC's transcript against the second in the same
    process and against the one in another process."""
    runs: dict[str, list[str]] = {}
    for ex, turns in played:
        n = len(ex.prompts)
        if ex.line.get("twice"):
            runs["first"], runs["second"] = [t.text for t in turns[:n]], [t.text for t in turns[n:]]
        else:
            runs["other"] = [t.text for t in turns]

    def compare(a: str, b: str) -> str:
        if a not in runs or b not in runs:
            return "-"
        if runs[a] == runs[b]:
            return "yes"
        i = next(i for i, (x, y) in enumerate(zip(runs[a], runs[b], strict=True)) if x != y)
        return f"no (turn {i + 1})"

    return {"twice, one process": compare("first", "second"), "in two processes": compare("first", "other")}


TARGETS = {
    ("tavern routing, auto (default routing)", "right action"): "≥ 7/8 a seed",
    ("written-first sets, auto (default routing)", "right action"): "≥ 85%",
    ("tavern routing, auto (default routing)", "args right"): "≥ 90%",
    ("written-first sets, auto (default routing)", "args right"): "≥ 90%",
    ("tavern routing, auto (default routing)", "grounded"): "≥ 90%",
    ("written-first sets, auto (default routing)", "grounded"): "≥ 90%",
    ("tavern routing, auto (default routing)", "invented"): "0",
    ("written-first sets, auto (default routing)", "invented"): "0",
    ("lore questions (8 facts)", "retrieved"): "≥ 80%",
    ("lore questions (8 facts)", "said"): "≥ 80%",
    ("temperature 0, same transcript", "twice, one process"): "yes",
    ("temperature 0, same transcript", "in two processes"): "yes",
}


def table_rows(
    results: dict[tuple[str, str], list[Turn]], exchanges: list[Exchange], sides: list[Side], data: dict[str, Any]
) -> list[list[str]]:
    """One row per configuration and figure: the figure on each side, and the target."""
    configs = list(dict.fromkeys(ex.config for ex in exchanges))
    rows: list[list[str]] = []
    for config in configs:
        per_side = []
        for s in sides:
            played = [(ex, results[(s.label, ex.key)]) for ex in exchanges if ex.config == config]
            played = [
                (ex, turns) for ex, turns in played if not any((t.error or "").startswith("skipped") for t in turns)
            ]
            if played and played[0][0].kind == "det":
                per_side.append(same_transcripts(played))
            else:
                per_side.append(figures(config, played, data) if played else {})
        names = list(dict.fromkeys(n for f in per_side for n in f))
        for name in names:
            cells = [f.get(name, "-") for f in per_side]
            if all(c == "-" for c in cells):
                continue
            rows.append([config, name, *cells, TARGETS.get((config, name), "")])
    return rows


def print_table(header: str, sides: list[Side], rows: list[list[str]], notes: list[str]) -> str:
    """The table as Markdown, printed; returns the text."""
    cols = ["configuration", "figure", *(s.label for s in sides), "target"]
    out = [header, "", "| " + " | ".join(cols) + " |", "|" + "|".join("---" for _ in cols) + "|"]
    last = ""
    for r in rows:
        config = r[0] if r[0] != last else ""
        last = r[0]
        out.append("| " + " | ".join([config, *r[1:]]) + " |")
    out += ["", *notes]
    text = "\n".join(out) + "\n"
    print(text, flush=True)
    return text


# ---- the run ----


def git(*args: str) -> str:
    return subprocess.run(["git", "-C", ROOT, *args], capture_output=True, text=True, check=True).stdout.strip()


def describe(root: str) -> str:
    try:
        rev = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--", "bridge"], capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"{rev}" + (" with uncommitted changes in bridge/" if dirty else "")


def snapshot_hash(root: str) -> str:
    """A short digest of the bridge's source files: two runs with the same one ran the same code."""
    h = hashlib.sha256()
    base = Path(root, "bridge")
    for path in sorted(base.rglob("*.py")):
        if "__pycache__" not in path.parts:
            h.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes())
    return "sha256 " + h.hexdigest()[:10]


def notes_for(
    sides: list[Side],
    results: dict[tuple[str, str], list[Turn]],
    exchanges: list[Exchange],
    costs: Costs,
    seconds: float,
) -> list[str]:
    notes = []
    for s in sides:
        auto = [
            results[(s.label, ex.key)][0]
            for ex in exchanges
            if ex.kind == "routing" and ex.respond.get("toolChoice") == "auto"
        ]
        policies: dict[str, int] = {}
        for t in auto:
            p = (t.routing or {}).get("policy") or "none reported"
            policies[p] = policies.get(p, 0) + 1
        if auto:
            said = ", ".join(f"{p} {n}/{len(auto)}" for p, n in sorted(policies.items()))
            notes.append(f"- {s.label}: routing policy of the `auto` routing lines: {said}.")
        if s.dropped:
            notes.append(
                f"- {s.label} was not given (it rejects them as unknown fields, dropped and the request sent "
                f"again): {', '.join(f'`{d}`' for d in sorted(s.dropped))}."
            )
        if s.note:
            notes.append(f"- {s.label}: {s.note}")
    tavern = [ex for ex in exchanges if ex.config.startswith("tavern routing, auto")]
    seeds = list(dict.fromkeys(ex.seed for ex in tavern))
    if len(seeds) > 1:
        for s in sides:
            per_seed = [
                count(results[(s.label, ex.key)][0].first() == ex.line["right"] for ex in tavern if ex.seed == seed)
                for seed in seeds
            ]
            notes.append(f"- {s.label}: tavern routing, auto, right action per seed ({seeds}): {', '.join(per_seed)}.")
    lore = [ex for ex in exchanges if ex.kind == "lore"]
    for s in sides:
        via_recall = sum(any(c["name"] == "recall" for c in t.calls) for ex in lore for t in results[(s.label, ex.key)])
        via_routing = sum(bool((t.routing or {}).get("lore")) for ex in lore for t in results[(s.label, ex.key)])
        if lore:
            notes.append(
                f"- {s.label}: lore questions with lore in `routing.lore` {via_routing}/{len(lore)}, "
                f"with a `recall` call {via_recall}/{len(lore)}."
            )
    ready = costs.ready
    if ready:
        notes.append(
            f"- Fresh processes: {costs.started} started (one per exchange and side, plus a spare per side), "
            f"each ready (started, initialized, model loaded) {st.median(ready):.2f} s after its start (median; "
            f"{sum(ready):.0f} s in all, spent while the previous exchange played); the run waited "
            f"{costs.waited:.0f} s for them and {costs.closing:.0f} s closing them: "
            f"{costs.waited + costs.closing:.0f} s added to the run's {seconds:.0f} s."
        )
    return notes


def compare(a: dict[str, Any], b: dict[str, Any], what: str) -> list[str]:
    """The exchanges both hold: how many gave the same result, and the first that did not."""
    common = [k for k in a if k in b]
    differ = [k for k in common if a[k] != b[k]]
    out = [f"- {what}: {len(common) - len(differ)}/{len(common)} exchanges gave the same result."]
    for k in differ[:5]:
        out.append(f"  - differs: {k}: {json.dumps(a[k])[:200]} / {json.dumps(b[k])[:200]}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a GGUF model file (default: the bundled SmolLM2)")
    ap.add_argument("--root", default=ROOT, help="source tree whose bridge is 'now' (default: this repository)")
    ap.add_argument("--temperature", type=float, default=0.7, help="sampling temperature (default 0.7)")
    # two by default: three took over an hour on a shared 2-core machine (2026-12)
    ap.add_argument("--seeds", default="1,2", help="seeds, each exchange played once per seed (default 1,2)")
    ap.add_argument("--baseline", default="08b80db", help="revision played beside this one (default 08b80db)")
    ap.add_argument("--no-baseline", action="store_true", help="play this bridge alone")
    ap.add_argument("--quick", action="store_true", help="a smoke run: the first seed only, no baseline")
    ap.add_argument("--only", help="play only the configurations matching this regex")
    ap.add_argument("--check-order", action="store_true", help="play everything again in reverse order, compare")
    ap.add_argument("--save", metavar="FILE", help="write every exchange's result (JSON) to FILE")
    ap.add_argument("--against", metavar="FILE", help="compare every exchange's result with a --save FILE")
    ap.add_argument("--markdown", metavar="FILE", help="write the table to FILE too")
    ap.add_argument("--show", action="store_true", help="print every line")
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if args.quick:
        seeds = seeds[:1]
    baseline = None if args.no_baseline or args.quick else args.baseline
    bridge_args = ["--model", args.model] if args.model else []
    data = json.load(open(DATA, encoding="utf-8"))
    sets = json.load(open(SETS, encoding="utf-8"))
    exchanges = build(data, sets, seeds, args.temperature)
    if args.only:
        exchanges = [ex for ex in exchanges if re.search(args.only, ex.config, re.I)]
    root = os.path.abspath(args.root)
    now = describe(root)  # before the run: others may edit meanwhile
    sides: list[Side] = []
    costs = Costs()
    pools: dict[str, Pool] = {}
    results: dict[tuple[str, str], list[Turn]] = {}
    again: dict[tuple[str, str], list[Turn]] = {}
    jobs: list[tuple[Side, Exchange]] = []
    tmp = tempfile.mkdtemp(prefix="oam-quality-")
    tree = os.path.join(tmp, "baseline")
    t0 = progress = time.perf_counter()

    def run_all(order: list[tuple[Side, Exchange]], into: dict[tuple[str, str], list[Turn]]) -> None:
        nonlocal progress
        for i, (s, ex) in enumerate(order):
            into[(s.label, ex.key)] = play(pools[s.label], ex)
            if time.perf_counter() - progress > 60:
                progress = time.perf_counter()
                print(f"  ... {i + 1}/{len(order)} exchanges, {progress - t0:.0f} s", file=sys.stderr, flush=True)

    try:
        if baseline:
            git("worktree", "add", "--detach", "--quiet", tree, baseline)
            base = Side(baseline, tree, [sys.executable, "-m", "bridge"])
            if not os.path.exists(os.path.join(tree, "bridge", "engines", "llama", "_cpu.py")):
                cpu = os.path.join(ROOT, "bridge", "engines", "llama", "_cpu.py")
                base.command = [sys.executable, "-c", BASELINE_LAUNCHER, cpu]
                base.note = (
                    "its tree predates the portable llama.cpp build (5d439a8), so this checkout's "
                    "`bridge/engines/llama/_cpu.py` registers the same CPU backend before its bridge starts."
                )
            sides.append(base)
        # this bridge as it is at the start, copied: files edited during the run do not mix in
        shutil.copytree(
            os.path.join(root, "bridge"),
            os.path.join(tmp, "now", "bridge"),
            ignore=shutil.ignore_patterns("__pycache__"),
        )
        sides.append(Side(NOW, os.path.join(tmp, "now"), [sys.executable, "-m", "bridge"]))
        now += f", bridge/ {snapshot_hash(os.path.join(tmp, 'now'))}"
        pools = {s.label: Pool(s, bridge_args, costs) for s in sides}
        jobs = [(s, ex) for ex in exchanges for s in sides]
        t0 = progress = time.perf_counter()
        run_all(jobs, results)
        seconds = time.perf_counter() - t0
        if args.check_order:
            run_all(list(reversed(jobs)), again)
    finally:
        for p in pools.values():
            p.close()
        if baseline:
            subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", tree], check=False, capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)
        if baseline:
            git("worktree", "prune")
    if args.show:
        for s, ex in jobs:
            for t in results[(s.label, ex.key)]:
                what = t.error or (t.text.replace("\n", " / ")[:300])
                calls = " calls=" + json.dumps([[c["name"], c.get("arguments")] for c in t.calls]) if t.calls else ""
                lore = f" lore={t.routing['lore']}" if t.routing and t.routing.get("lore") else ""
                print(f"[{s.label}] [{ex.key}] {t.prompt!r} -> {what!r}{calls}{lore} ({t.finish}, {t.seconds:.1f}s)")
        print()

    def signatures(res: dict[tuple[str, str], list[Turn]]) -> dict[str, Any]:
        return {f"{side} | {key}": [t.signature() for t in turns] for (side, key), turns in res.items()}

    sig = signatures(results)
    model = args.model or "bundled SmolLM2-135M-Instruct"
    cpu_env = os.environ.get("OAM_LLAMA_CPU") or "best"
    loaded = sorted(set().union(*(s.variants for s in sides)))
    header = (
        f"Model {model}; seeds {','.join(map(str, seeds))}; temperature {args.temperature:g}; "
        f"CPU variant {cpu_env} (loaded: {', '.join(loaded) or '?'}); {time.strftime('%Y-%m-%d')}; "
        f"now = {now}" + (f"; baseline = {baseline}" if baseline else "") + "."
    )
    rows = table_rows(results, exchanges, sides, data)
    notes = notes_for(sides, results, exchanges, costs, seconds)
    if args.check_order:
        notes += compare(sig, signatures(again), "Order check (everything played again in reverse order)")
    if args.against:
        notes += compare(sig, json.load(open(args.against, encoding="utf-8")), f"Against {args.against}")
    notes.append(f"- {len(jobs)} exchanges, {sum(len(v) for v in results.values())} turns in {seconds:.0f} s.")
    text = print_table(header, sides, rows, notes)
    if args.markdown:
        with open(args.markdown, "w", encoding="utf-8") as f:
            f.write(text)
    if args.save:
        with open(args.save, "w", encoding="utf-8") as f:
            json.dump(sig, f, indent=0)


if __name__ == "__main__":
    main()
