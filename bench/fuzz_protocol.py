"""Protocol fuzzing through the real ``oam-bridge`` subprocess over real pipes.

Feeds bridge processes (one after another) random and mutated JSON-RPC lines: valid messages
of every method in protocol.md, the same with values replaced (wrong types, huge and
negative numbers, Unicode line separators, lone surrogates, deep nesting), broken
envelopes, batches, byte-level mutations (flips, cuts, invalid UTF-8, stray newlines),
garbage and oversize lines. stdout is read continuously and every line is checked:

- the process stays up until its stdin ends and then exits with status 0 (no crash);
- no ``internal_error``, in a response or in ``turn/failed``, and no traceback on stderr;
- every stdout line is one valid JSON-RPC message (a response, a batch of responses or an
  event), with U+2028, U+2029 and U+0085 escaped;
- every request sent with a well-formed id gets exactly one response (ids are unique per
  run; ids inside mutated bytes may be answered at most once, or with a null id);
- every turn's events run seq 0..n without gaps and end with exactly one terminal event;
  every requested tool call ends with exactly one of toolCallCompleted/toolCallWithdrawn.

Usage::

    python bench/fuzz_protocol.py                     # 100,000 inputs (a couple of minutes)
    python bench/fuzz_protocol.py --inputs 1000000    # the long run of issue 9
    python bench/fuzz_protocol.py --seed 7 --per-process 20000 --root OTHER_CHECKOUT

Prints inputs/s and totals; exits 1 when a check fails. ``tests/process/test_fuzz.py`` runs a short
deterministic run of the same fuzzer in ``make test``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import IO, Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NPCS = ["a", "b", "c", "d", "e", "f"]
METHODS = [
    "initialize",
    "npc/create",
    "npc/respond",
    "npc/submit",
    "npc/cancel",
    "npc/transcript",
    "npc/restore",
    "npc/reset",
    "npc/delete",
    "npc/list",
    "tokens/count",
    "engine/status",
    "npc/decide",
    "npc/prewarm",
    "npc/setTags",
    "world/set",
    "world/delete",
    "world/get",
]
TAGS = ["gate", "tavern", "north", "\u2028"]
FACT_KEYS = ["weather", "gate", "lore of the keep", "\u2028key", "k" * 300]
OPTIONS: list[dict[str, Any]] = [
    {"name": "let_in", "description": "open the gate"},
    {"name": "question"},
    {
        "name": "ring",
        "parameters": {"type": "object", "properties": {"n": {"type": "integer", "maximum": 3}}, "required": ["n"]},
    },
]
EVENT_METHODS = {
    "turn/started",
    "turn/textDelta",
    "turn/partialJson",
    "turn/toolCallRequested",
    "turn/toolCallCompleted",
    "turn/toolCallWithdrawn",
    "turn/contextTrimmed",
    "turn/completed",
    "turn/failed",
}
TERMINAL = ("turn/completed", "turn/failed")
LINE_BREAKS = ("\u2028".encode(), "\u2029".encode(), "\u0085".encode())
MUTATED_ID_PREFIX = "zzzz-mutated-"  # ids inside byte-mutated lines: never equal to a clean id
INT64 = (-(2**63), 2**63 - 1)
DEPTH_RISK = 90  # a message nested this deep may be refused whole (limits.maxNestingDepth 100)

TOOLS: list[dict[str, Any]] = [
    {
        "name": "check_inventory",
        "description": "How many of an item.",
        "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
    },
    {
        "name": "open_door",
        "description": "Open a door.",
        "parameters": {
            "type": "object",
            "properties": {"door": {"type": "string", "enum": ["north", "south"]}},
            "required": ["door"],
        },
    },
    {
        "name": "send_letter",
        "parameters": {
            "type": "object",
            "properties": {"to": {"type": "string", "format": "email"}, "on": {"type": "string", "format": "date"}},
            "required": ["to"],
        },
    },
    {
        "name": "give",
        "parameters": {
            "type": "object",
            "properties": {
                "n": {"type": "integer", "minimum": 0, "maximum": 10},
                "items": {"type": "array", "items": {"type": "string"}},
            },
        },
    },
    {"name": "noop", "parameters": {"type": "object"}},
]
TOOL_ARGS: dict[str, list[Any]] = {
    "check_inventory": [{"item": "ale"}, {"item": "\u2028bread\u0085"}, {}, {"item": 5}],
    "open_door": [{"door": "north"}, {"door": "west"}],
    "send_letter": [
        {"to": "a@b.example", "on": "2024-05-01"},
        {"to": "nobody"},
        {"to": "x@y.example", "on": "2024-13-45"},
    ],
    "give": [{"n": 3, "items": ["a"]}, {"n": 11}, {"n": "three"}],
    "noop": [{}, {"anything": [1, 2, 3]}],
    "missing_tool": [{}],
    "recall": [{"topic": "lore of the keep"}, {"topic": "weather"}, {}],
    "respond_directly": [{}, {"x": 1}],
}
WEIRD: list[Any] = [
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**63 - 1,
    -(2**63),
    2**64,
    10**30,
    -(10**400),
    1.5,
    2.0,
    -0.0,
    1e308,
    "",
    "x",
    "x" * 300,
    "x" * 5_000,
    "\u2028\u2029\u0085",
    "\ud800",
    "\U0001f600",
    [],
    {},
    {"type": "object"},
    {"$ref": "#/nowhere"},
    {"$schema": 5},
    float("nan"),
    float("inf"),
]
WORDS = [
    "Hello",
    "traveller",
    "the",
    "ale",
    "is",
    "cold",
    "\u2028",
    "\u2029",
    "\u0085",
    "é",
    "日本",
    "\U0001f37a",
    "\\",
    '"',
    "\t",
    "x" * 40,
]


@dataclass
class Stats:
    inputs: int = 0
    bytes_in: int = 0
    stdout_lines: int = 0
    responses: int = 0
    events: int = 0
    turns_started: int = 0
    terminals: int = 0
    tool_calls: int = 0
    processes: int = 0
    max_exit_s: float = 0.0
    error_codes: collections.Counter[str] = field(default_factory=collections.Counter)


@dataclass
class Report:
    stats: Stats
    failures: list[str]
    seconds: float

    @property
    def ok(self) -> bool:
        return not self.failures


def _id_key(value: Any) -> tuple[str, Any]:
    """Compare ids as JSON values: 2 and 2.0 are the same number."""
    if isinstance(value, bool) or value is None:
        return ("o", value)
    if isinstance(value, int):
        return ("n", value)
    if isinstance(value, float):
        return ("n", int(value)) if value.is_integer() else ("f", value)
    if isinstance(value, str):
        return ("s", value)
    return ("x", json.dumps(value, sort_keys=True))


def _depth(obj: Any) -> int:
    deepest, stack = 0, [(obj, 1)]
    while stack:
        o, d = stack.pop()
        deepest = max(deepest, d)
        if isinstance(o, dict):
            stack.extend((v, d + 1) for v in o.values())
        elif isinstance(o, list):
            stack.extend((v, d + 1) for v in o)
    return deepest


def _risky(obj: Any) -> bool:
    """Whether the bridge may refuse the whole line (id null) for a reason inside params:
    integers beyond 64 bits, lone surrogates, non-finite floats, or nesting near the limit."""
    if _depth(obj) >= DEPTH_RISK:
        return True
    stack = [obj]
    while stack:
        o = stack.pop()
        if isinstance(o, bool):
            continue
        if isinstance(o, int) and not INT64[0] <= o <= INT64[1]:
            return True
        if isinstance(o, float) and (o != o or o in (float("inf"), float("-inf"))):
            return True
        if isinstance(o, str) and any(0xD800 <= ord(c) <= 0xDFFF for c in o):
            return True
        if isinstance(o, dict):
            stack.extend(o.keys())
            stack.extend(o.values())
        elif isinstance(o, list):
            stack.extend(o)
    return False


class Generator:
    """Inputs for one bridge process. ``next_input`` returns the bytes of one input (one
    line, or pieces of lines for byte mutations) with the ids that must be answered exactly
    once (``expected``)."""

    def __init__(self, rng: random.Random, call_ids: collections.deque[tuple[str, str]], id_base: int) -> None:
        self.rng = rng
        self.call_ids = call_ids  # (npcId, callId) seen in toolCallRequested, filled by the reader
        self._n = id_base
        self.issued: list[Any] = []  # the clean ids of the input being built

    # ---- ids ----

    def clean_id(self) -> Any:
        self._n += 1
        r = self.rng.random()
        id_: Any
        if r < 0.45:
            id_ = 2**40 + self._n  # apart from the digits of mutated ids
        elif r < 0.9:
            id_ = f"q{self._n}"
        elif r < 0.95:
            id_ = 2**62 + self._n  # large, still a 64-bit integer
        else:
            id_ = "q" + "\u2028é" * 3 + str(self._n) + "x" * self.rng.choice([1, 100, 5000])
        self.issued.append(id_)
        return id_

    def mutated_id(self) -> str:
        self._n += 1
        return f"{MUTATED_ID_PREFIX}{self._n}"

    # ---- values ----

    def text(self, n: int | None = None) -> str:
        n = self.rng.randint(0, 12) if n is None else n
        return " ".join(self.rng.choice(WORDS) for _ in range(n))

    def weird(self, depth: int = 0) -> Any:
        r = self.rng.randrange(len(WEIRD) + 4)
        if r < len(WEIRD):
            v = WEIRD[r]
            return [] if v == [] else {} if v == {} else dict(v) if isinstance(v, dict) else v
        if r == len(WEIRD):
            return self.text()
        if r == len(WEIRD) + 1:
            return self.nested(self.rng.choice([10, 50, 99, 101, 200, 600]))
        if depth < 3 and self.rng.random() < 0.5:
            return [self.weird(depth + 1) for _ in range(self.rng.randint(0, 4))]
        if depth < 3:
            return {
                self.rng.choice(["a", "npcId", "text", "type", "$schema", ""]): self.weird(depth + 1)
                for _ in range(self.rng.randint(0, 3))
            }
        return None

    def nested(self, depth: int) -> Any:
        v: Any = 1
        for i in range(depth):
            v = [v] if i % 2 else {"k": v}
        return v

    def npc(self) -> str:
        return self.rng.choice(NPCS) if self.rng.random() < 0.97 else self.text(2)

    def tool(self) -> dict[str, Any]:
        return self.rng.choice(TOOLS)

    def step(self) -> Any:
        r = self.rng.random()
        step: dict[str, Any]
        if r < 0.4:
            step = {"text": self.text()}
        elif r < 0.7:
            name = self.rng.choice(list(TOOL_ARGS))
            calls = [
                {"name": name, "arguments": self.rng.choice(TOOL_ARGS[name])}
                for _ in range(self.rng.choice([1, 1, 2, 3]))
            ]
            step = {"toolCalls": calls}
            if self.rng.random() < 0.3:
                step["text"] = self.text(3)
        elif r < 0.85:
            step = {
                "json": self.rng.choice(
                    [
                        {"mood": "glad"},
                        {"n": 1},
                        [1, 2],
                        "x",
                        {"a": {"b": [None]}},
                        {"reasoning": "Late.", "choice": "question"},
                        {"choice": "ring", "arguments": {"n": 2}},
                        {"choice": "nope"},
                    ]
                )
            }
        elif r < 0.88:
            step = {"echo": self.rng.choice(["instructions", "prompt"])}
        elif r < 0.95:
            step = {
                "error": self.rng.choice(["refusal", "guardrail_violation", "rate_limited", "made_up"]),
                "message": self.text(3),
            }
        else:
            step = {"text": self.text(), "warnings": [self.text(2)]}
        if self.rng.random() < 0.2:
            step["delayMs"] = self.rng.randint(0, 20)
        if self.rng.random() < 0.1:
            step["chunkMs"] = self.rng.randint(0, 2)
        return step

    def params(self, method: str) -> dict[str, Any]:
        rng = self.rng
        if method == "initialize":
            return {"protocolVersion": 1, "clientInfo": {"name": "fuzz", "version": "0"}}
        if method == "npc/create":
            p: dict[str, Any] = {"npcId": self.npc()}
            if rng.random() < 0.5:
                p["instructions"] = self.text()
            if rng.random() < 0.2:
                p["persona"] = {
                    "name": self.text(1),
                    "role": self.text(2),
                    "traits": [self.text(1)],
                    "speechStyle": self.text(2),
                }
            if rng.random() < 0.7:
                p["tools"] = rng.sample(TOOLS, rng.randint(1, len(TOOLS)))
            if rng.random() < 0.8:
                p["script"] = [self.step() for _ in range(rng.randint(0, 6))]
            if rng.random() < 0.2:
                p["options"] = {
                    "temperature": rng.random(),
                    "maxTokens": rng.randint(1, 512),
                    "seed": rng.randint(0, 99),
                    "topP": rng.random(),
                }
            if rng.random() < 0.1:
                p["engine"] = rng.choice(["auto", "scripted", "bogus"])
            if rng.random() < 0.05:  # a model file that is not there, or no path at all
                p["engine"] = rng.choice(["scripted", "native", "bogus"])
                p["model"] = rng.choice(["", "a\0b", "m" * 5000, "missing.gguf", "missing.fmadapter"])
            if rng.random() < 0.3:
                p["tags"] = rng.sample(TAGS, rng.randint(0, 2))
            if rng.random() < 0.2:
                p["fallbacks"] = {
                    "guardrailViolation": [self.text(3)] * rng.randint(0, 2),
                    "refusal": rng.choice([[], [self.text(2)], [""]]),
                }
            return p
        if method == "npc/respond":
            p = {"npcId": self.npc(), "prompt": self.text()}
            if rng.random() < 0.4:
                p["toolChoice"] = rng.choice(
                    ["auto", "required", "none", {"tool": rng.choice(TOOLS)["name"]}, {"tool": "missing_tool"}]
                )
            if rng.random() < 0.3:
                p["maxToolRounds"] = rng.randint(0, 4)
            if rng.random() < 0.3:
                p["maxToolCalls"] = rng.randint(0, 8)
            p["toolTimeoutMs"] = rng.choice([1, 5, 20, 50, 100])
            if rng.random() < 0.15:
                p["schema"] = rng.choice(
                    [
                        {"type": "object", "properties": {"mood": {"type": "string"}}},
                        {"type": "array"},
                        {"type": "object", "required": ["n"]},
                    ]
                )
            if rng.random() < 0.3:
                p["fullText"] = rng.random() < 0.5
            if rng.random() < 0.2:
                p["speaker"] = rng.choice([self.npc(), self.text(1)])
            if rng.random() < 0.3:
                p["guardrail"] = rng.choice(["fail", "fallback", "retry"])
            if rng.random() < 0.1:
                p["toolChoice"] = rng.choice(["tool_or_answer", {"tool": "recall"}])
            return p
        if method == "npc/decide":
            p = {"npcId": self.npc(), "situation": self.text(), "options": rng.sample(OPTIONS, rng.randint(1, 3))}
            if rng.random() < 0.5:
                p["reasoning"] = rng.random() < 0.5
            if rng.random() < 0.3:
                p["remember"] = rng.random() < 0.5
            return p
        if method == "npc/prewarm":
            p = {"npcId": self.npc()}
            if rng.random() < 0.3:
                p["speaker"] = rng.choice([self.npc(), "a wandering bard", None])
            if rng.random() < 0.3:
                p["promptPrefix"] = self.text()
            return p
        if method == "npc/setTags":
            return {"npcId": self.npc(), "tags": rng.sample(TAGS, rng.randint(0, 3))}
        if method == "world/set":
            p = {
                "key": rng.choice(FACT_KEYS),
                "value": rng.choice(["storm", 3, {"open": False}, self.text(), "x" * rng.choice([10, 20000])]),
            }
            if rng.random() < 0.3:
                p["tags"] = rng.sample(TAGS, rng.randint(0, 2))
            if rng.random() < 0.2:
                p["npcIds"] = [self.npc()]
            if rng.random() < 0.3:
                p["lore"] = True
            return p
        if method == "world/delete":
            return {"key": rng.choice(FACT_KEYS)}
        if method == "world/get":
            return {"npcId": self.npc()} if rng.random() < 0.5 else {}
        if method == "npc/submit":
            if self.call_ids and rng.random() < 0.8:
                npc_id, call_id = self.call_ids[rng.randrange(len(self.call_ids))]
            else:
                npc_id, call_id = self.npc(), f"call_{rng.randrange(1000)}"
            p = {"npcId": npc_id, "callId": call_id}
            if rng.random() < 0.8:
                p["output"] = rng.choice([{"count": 3}, "three", None, [1, 2], self.text()])
            else:
                p["error"] = self.text(3)
            return p
        if method in ("npc/cancel", "npc/transcript", "npc/reset", "npc/delete"):
            return {"npcId": self.npc()}
        if method == "npc/restore":
            turns: list[list[dict[str, Any]]] = [
                [{"role": "user", "content": self.text()}, {"role": "assistant", "content": self.text()}]
                for _ in range(rng.randint(0, 5))
            ]
            if rng.random() < 0.2:
                turns.append(
                    [
                        {"role": "user", "content": "x"},
                        {
                            "role": "assistant",
                            "content": "",
                            "toolCalls": [{"id": "c", "name": "noop", "arguments": {}}],
                        },
                        {"role": "tool", "content": "ok", "toolCallId": "c", "name": "noop"},
                    ]
                )
            config = self.params("npc/create")
            p = {"save": {"version": rng.choice([1, 1, 1, 2]), "config": config, "turns": turns}}
            if rng.random() < 0.3:
                p["npcId"] = self.npc()
            return p
        if method == "tokens/count":
            p = {"text": self.text()}
            if rng.random() < 0.5:
                p["npcId"] = self.npc()
            elif rng.random() < 0.5:
                p["engine"] = rng.choice(["scripted", "auto", "bogus"])
            return p
        return {}

    def message(self, with_id: bool = True) -> dict[str, Any]:
        method = self.rng.choices(METHODS, weights=[1, 8, 14, 6, 3, 2, 2, 1, 1, 3, 2, 1, 3, 1, 1, 3, 1, 1])[0]
        msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
        if with_id:
            msg["id"] = self.clean_id()
        params = json.loads(json.dumps(self.params(method)))  # a copy: mutations must not touch TOOLS
        if params or self.rng.random() < 0.5:
            msg["params"] = params
        return msg

    # ---- mutations ----

    def mutate_values(self, msg: dict[str, Any]) -> None:
        params = msg.setdefault("params", {})
        for _ in range(self.rng.randint(1, 3)):
            parent: Any = params
            path_len = self.rng.randint(0, 3)
            for _ in range(path_len):
                kids = (
                    list(parent.items())
                    if isinstance(parent, dict)
                    else list(enumerate(parent))
                    if isinstance(parent, list)
                    else []
                )
                kids = [(k, v) for k, v in kids if isinstance(v, (dict, list)) and v]
                if not kids:
                    break
                parent = self.rng.choice(kids)[1]
            r = self.rng.random()
            if isinstance(parent, dict):
                if parent and r < 0.6:
                    parent[self.rng.choice(list(parent))] = self.weird()
                elif parent and r < 0.8:
                    del parent[self.rng.choice(list(parent))]
                else:
                    parent[
                        self.rng.choice(["unknownField", "npcId", "prompt", "script", "tools", "schema", "$ref"])
                    ] = self.weird()
            elif isinstance(parent, list) and parent:
                parent[self.rng.randrange(len(parent))] = self.weird()

    def mutate_envelope(self, msg: dict[str, Any]) -> tuple[dict[str, Any], bool]:
        """Break the envelope; returns the message and whether its id is still a clean one."""
        r = self.rng.randrange(8)
        if r == 0:
            msg["jsonrpc"] = self.rng.choice(["1.0", 2.0, None, "2.0 "])
        elif r == 1:
            del msg["jsonrpc"]
        elif r == 2:
            msg["id"] = self.rng.choice([True, 1.5, [1], {"a": 1}, 2**64 + self._n, -(10**30)])
            return msg, False
        elif r == 3:
            msg["id"] = None  # a request whose id is null: answered with id null
            return msg, False
        elif r == 4:
            msg["method"] = self.rng.choice(
                ["bogus", "", "npc/", "NPC/LIST", "rpc.discover", 5, None, "npc/list\u2028"]
            )
        elif r == 5:
            msg["params"] = self.rng.choice([[1, 2], "x", 5, None, True])
        elif r == 6:
            del msg["method"]
        else:
            msg["extra"] = self.weird()
        return msg, True

    def mutate_bytes(self, data: bytes) -> bytes:
        b = bytearray(data)
        for _ in range(self.rng.randint(1, 4)):
            r = self.rng.randrange(7)
            i = self.rng.randrange(len(b) + 1)
            if r == 0 and b:
                b[min(i, len(b) - 1)] = self.rng.randrange(256)
            elif r == 1:
                del b[i:]
            elif r == 2:
                b[i:i] = self.rng.choice(
                    [
                        b"\xff",
                        b"\xc3",
                        b"\xed\xa0\x80",
                        b"\x00",
                        b"\r",
                        b"\n",
                        b'"',
                        b"{",
                        b"]",
                        "\u2028".encode(),
                        b"\\u",
                        b"\\ud800",
                    ]
                )
            elif r == 3 and b:
                j = self.rng.randrange(len(b))
                b[i:i] = b[j : j + self.rng.randint(1, 40)]
            elif r == 4:
                del b[i : i + self.rng.randint(1, 10)]
            elif r == 5:
                b[i:i] = bytes(self.rng.randrange(256) for _ in range(self.rng.randint(1, 8)))
            else:
                b = b.replace(b":", b"::", 1) if self.rng.random() < 0.5 else b.replace(b",", b"", 1)
        return bytes(b)

    def garbage(self) -> bytes:
        r = self.rng.randrange(9)
        if r == 0:
            return bytes(self.rng.randrange(256) for _ in range(self.rng.randint(1, 200))).replace(b"\n", b" ")
        if r == 1:
            return self.rng.choice(
                [
                    b"5",
                    b'"x"',
                    b"null",
                    b"true",
                    b"[]",
                    b"{}",
                    b"[1,2]",
                    b"[[]]",
                    b"[{}]",
                    b"NaN",
                    b"1e999",
                    b"-",
                    b"\xef\xbb\xbf{}",
                ]
            )
        if r == 2:
            n = self.rng.choice([99, 100, 101, 1000, 100_000])
            return b"[" * n + b"]" * n
        if r == 3:
            n = self.rng.choice([50, 99, 100, 101, 3000])
            return b'{"a":' * n + b"1" + b"}" * n
        if r == 4:
            return (
                b'{"jsonrpc":"2.0","id":'
                + str(10 ** self.rng.choice([19, 40, 400, 4000])).encode()
                + b',"method":"npc/list"}'
            )
        if r == 5:
            return b'{"jsonrpc":"2.0","id":"' + b"\\u2028" * 10 + b'","method":"npc/list"'  # cut short
        if r == 6:
            return (
                b'{"jsonrpc":"2.0","method":"npc/list","id":"'
                + MUTATED_ID_PREFIX.encode()
                + b'dup","id":"'
                + MUTATED_ID_PREFIX.encode()
                + str(self._n).encode()
                + b'"}'
            )
        if r == 7:
            return b"   \t  "
        return b'{"jsonrpc":"2.0","id":"' + MUTATED_ID_PREFIX.encode() + b'\xff\xfe","method":"npc/list"}'

    def next_input(self) -> tuple[bytes, list[Any], list[Any]]:
        """One input: its bytes (ending in a newline), the ids that must be answered exactly
        once, and the ids that may be answered (at most once)."""
        self.issued = []
        data, expected = self._next()
        keys = {_id_key(i) for i in expected}
        return data, expected, [i for i in self.issued if _id_key(i) not in keys]

    def _next(self) -> tuple[bytes, list[Any]]:
        r = self.rng.random()
        expected: list[Any] = []
        if r < 0.40:
            msg = self.message()
            expected.append(msg["id"])
            return self._encode(msg), expected
        if r < 0.62:
            msg = self.message()
            self.mutate_values(msg)
            if not _risky(msg):
                expected.append(msg["id"])
            return self._encode(msg), expected
        if r < 0.68:
            msg, _ = self.mutate_envelope(self.message())
            return self._encode(msg), expected  # answered with its id or with null: either
        if r < 0.74:
            return self._encode(self.message(with_id=False)), expected
        if r < 0.82:
            batch: list[Any] = []
            for _ in range(self.rng.choice([0, 1, 2, 5, 10, 30])):
                k = self.rng.random()
                if k < 0.6:
                    batch.append(self.message())
                elif k < 0.75:
                    m = self.message()
                    self.mutate_values(m)
                    batch.append(m)
                elif k < 0.85:
                    batch.append(self.message(with_id=False))
                else:
                    batch.append(self.rng.choice([1, "x", None, [], {}, [1]]))
            if not _risky(batch):
                expected.extend(m["id"] for m in batch if isinstance(m, dict) and "id" in m)
            return self._encode(batch), expected
        if r < 0.94:
            msg = self.message()
            msg["id"] = self.mutated_id()
            return self.mutate_bytes(self._encode(msg)[:-1]) + b"\n", expected
        if r < 0.99995:
            return self.garbage() + b"\n", expected
        return (
            b'{"jsonrpc":"2.0","id":"'
            + MUTATED_ID_PREFIX.encode()
            + b'big","method":"npc/list","params":{"x":"'
            + b"a" * (5 << 20)
            + b'"}}\n',
            expected,
        )

    def _encode(self, obj: Any) -> bytes:
        return json.dumps(obj, ensure_ascii=self.rng.random() < 0.5).encode("utf-8", "surrogatepass") + b"\n"


class Session:
    """One bridge process: a writer thread feeds it, a reader thread checks stdout."""

    def __init__(self, root: str, gen: Generator, inputs: int, stats: Stats, failures: list[str], tag: str) -> None:
        self.root, self.gen, self.inputs, self.stats, self.failures, self.tag = root, gen, inputs, stats, failures, tag
        env = {
            **os.environ,
            "PYTHONPATH": root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "bridge", "--engine", "scripted"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=root,
            env=env,
        )
        self.expected: dict[tuple[str, Any], int] = {}  # clean id -> responses seen
        self.possible: dict[tuple[str, Any], int] = {}  # ids that may be answered (at most once)
        self.lock = threading.Lock()
        self.turns: dict[str, list[Any]] = {}  # turnId -> [next seq, ended, open calls]
        self.stderr_tail: collections.deque[bytes] = collections.deque(maxlen=50)
        self.tracebacks = 0

    def fail(self, what: str) -> None:
        if len(self.failures) < 200:
            self.failures.append(f"[{self.tag}] {what}")

    def run(self, ending: str) -> None:
        reader = threading.Thread(target=self._read, daemon=True)
        errs = threading.Thread(target=self._read_stderr, daemon=True)
        reader.start()
        errs.start()
        self._write(ending)
        t0 = time.perf_counter()
        try:
            status = self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.fail("the bridge did not exit within 30 s of the end of its input")
            self.proc.kill()
            status = self.proc.wait()
        exit_s = time.perf_counter() - t0
        self.stats.max_exit_s = max(self.stats.max_exit_s, exit_s)
        reader.join(10)
        errs.join(10)
        if status != 0:
            self.fail(f"exit status {status}; stderr tail: {b''.join(self.stderr_tail)[-1500:]!r}")
        if self.tracebacks:
            self.fail(f"{self.tracebacks} traceback(s) on stderr; tail: {b''.join(self.stderr_tail)[-1500:]!r}")
        missing = [k for k, n in self.expected.items() if n == 0]
        if missing:
            self.fail(f"{len(missing)} request(s) got no response, e.g. {missing[:3]}")
        for turn_id, (_, ended, calls) in self.turns.items():
            if not ended:
                self.fail(f"turn {turn_id} has no terminal event")
            if calls:
                self.fail(f"turn {turn_id}: tool call(s) {sorted(calls)[:3]} neither completed nor withdrawn")

    def _write(self, ending: str) -> None:
        assert self.proc.stdin is not None
        out: IO[bytes] = self.proc.stdin
        buf: list[bytes] = []
        size = 0

        def send(data: bytes, ids: list[Any], maybe: list[Any] = []) -> None:  # noqa: B006
            nonlocal size
            with self.lock:
                for i in ids:
                    self.expected[_id_key(i)] = 0
                for i in maybe:
                    self.possible[_id_key(i)] = 0
            buf.append(data)
            size += len(data)
            self.stats.bytes_in += len(data)
            if size > 32_768:
                flush()

        def flush() -> None:
            nonlocal size
            try:
                out.write(b"".join(buf))
                out.flush()
            except BrokenPipeError:
                self.fail("the bridge closed its stdin early (crash?)")
                raise
            buf.clear()
            size = 0

        try:
            if self.gen.rng.random() < 0.1:  # sometimes the game talks before initialize
                for _ in range(20):
                    send(*self.gen.next_input())
            init_id = self.gen.clean_id()
            send(
                json.dumps(
                    {"jsonrpc": "2.0", "id": init_id, "method": "initialize", "params": {"protocolVersion": 1}}
                ).encode()
                + b"\n",
                [init_id],
            )
            for _ in range(self.inputs):
                send(*self.gen.next_input())
                self.stats.inputs += 1
            if ending == "shutdown":
                sid = self.gen.clean_id()
                send(json.dumps({"jsonrpc": "2.0", "id": sid, "method": "shutdown"}).encode() + b"\n", [sid])
                send(b'{"jsonrpc":"2.0","method":"exit"}\n', [])
            flush()
            out.close()
        except BrokenPipeError:
            pass

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.stderr_tail.append(line)
            if b"Traceback" in line:
                self.tracebacks += 1

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            self.stats.stdout_lines += 1
            if not raw.endswith(b"\n"):
                self.fail(f"stdout ends in a cut-off line: {raw[:200]!r}")
                continue
            if any(x in raw for x in LINE_BREAKS):
                self.fail(f"unescaped Unicode line break on stdout: {raw[:200]!r}")
            try:
                msg = json.loads(raw)
            except ValueError:
                self.fail(f"stdout line is not JSON: {raw[:200]!r}")
                continue
            if isinstance(msg, list):
                if not msg:
                    self.fail("an empty batch response")
                for one in msg:
                    self._response(one, raw)
            elif isinstance(msg, dict) and "method" in msg:
                self._event(msg, raw)
            else:
                self._response(msg, raw)

    def _response(self, msg: Any, raw: bytes) -> None:
        self.stats.responses += 1
        if (
            not isinstance(msg, dict)
            or msg.get("jsonrpc") != "2.0"
            or "id" not in msg
            or ("result" in msg) == ("error" in msg)
            or set(msg) - {"jsonrpc", "id", "result", "error"}
        ):
            self.fail(f"not a JSON-RPC response: {raw[:200]!r}")
            return
        if "error" in msg:
            err = msg["error"]
            data = err.get("data") if isinstance(err, dict) else None
            if not (
                isinstance(err, dict)
                and isinstance(err.get("code"), int)
                and isinstance(err.get("message"), str)
                and isinstance(data, dict)
                and isinstance(data.get("code"), str)
                and isinstance(data.get("retryable"), bool)
            ):
                self.fail(f"malformed error: {raw[:200]!r}")
                return
            self.stats.error_codes[data["code"]] += 1
            if data["code"] == "internal_error" or err["code"] == -32603:
                self.fail(f"internal_error response: {raw[:300]!r}")
        id_ = msg["id"]
        if id_ is None:
            return
        key = _id_key(id_)
        with self.lock:
            seen = self.expected.get(key)
            if seen is not None:
                self.expected[key] = seen + 1
            else:
                seen = self.possible.get(key)
                if seen is not None:
                    self.possible[key] = seen + 1
        # An id that was never sent as such comes from a byte-mutated line (any string or
        # number can come out of one); clean ids live apart, so they never collide with it.
        if seen is not None and seen >= 1:
            self.fail(f"a second response to id {id_!r}: {raw[:200]!r}")
        if isinstance(msg.get("result"), dict) and isinstance(msg["result"].get("turnId"), str):
            self.turns.setdefault(msg["result"]["turnId"], [0, False, set()])

    def _event(self, msg: dict[str, Any], raw: bytes) -> None:
        self.stats.events += 1
        params = msg.get("params")
        method = msg.get("method")
        if (
            msg.get("jsonrpc") != "2.0"
            or "id" in msg
            or method not in EVENT_METHODS
            or not isinstance(params, dict)
            or not isinstance(params.get("seq"), int)
            or not isinstance(params.get("turnId"), str)
        ):
            self.fail(f"not a valid event: {raw[:200]!r}")
            return
        state = self.turns.setdefault(params["turnId"], [0, False, set()])
        if state[1]:
            self.fail(f"event after the terminal event: {raw[:200]!r}")
        if params["seq"] != state[0]:
            self.fail(f"seq {params['seq']} where {state[0]} was due: {raw[:200]!r}")
        state[0] = params["seq"] + 1
        if method == "turn/started":
            self.stats.turns_started += 1
        elif method == "turn/toolCallRequested":
            self.stats.tool_calls += 1
            state[2].add(params.get("callId"))
            self.gen.call_ids.append((str(params.get("npcId")), str(params.get("callId"))))
        elif method in ("turn/toolCallCompleted", "turn/toolCallWithdrawn"):
            state[2].discard(params.get("callId"))
        elif method in TERMINAL:
            self.stats.terminals += 1
            state[1] = True
            if method == "turn/failed" and params.get("error", {}).get("code") == "internal_error":
                self.fail(f"turn/failed with internal_error: {raw[:300]!r}")


def run(inputs: int, seed: int = 1, per_process: int = 50_000, root: str = ROOT, progress: bool = False) -> Report:
    """Fuzz ``inputs`` inputs through bridge processes of ``per_process`` inputs each."""
    rng = random.Random(seed)
    stats, failures = Stats(), list[str]()
    t0 = time.perf_counter()
    done = 0
    n = 0
    while done < inputs:
        k = min(per_process, inputs - done)
        call_ids: collections.deque[tuple[str, str]] = collections.deque(maxlen=64)
        gen = Generator(random.Random(rng.randrange(2**32)), call_ids, id_base=10_000_000 * n)
        Session(root, gen, k, stats, failures, f"process {n}").run(rng.choice(["eof", "eof", "shutdown"]))
        stats.processes += 1
        done += k
        n += 1
        if progress:
            el = time.perf_counter() - t0
            print(f"  {done:>9,} inputs  {done / el:>8,.0f} inputs/s  failures {len(failures)}", flush=True)
    return Report(stats, failures, time.perf_counter() - t0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--inputs", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--per-process", type=int, default=50_000, help="inputs per bridge process")
    ap.add_argument(
        "--root", default=ROOT, help="source tree whose bridge package is started (default: this repository)"
    )
    args = ap.parse_args()
    print(f"fuzzing {args.inputs:,} inputs, seed {args.seed}, {args.per_process:,} per process")
    report = run(args.inputs, args.seed, args.per_process, os.path.abspath(args.root), progress=True)
    s = report.stats
    print(
        f"inputs            {s.inputs:,} ({s.bytes_in / 1e6:,.1f} MB) in {report.seconds:,.1f} s: "
        f"{s.inputs / report.seconds:,.0f} inputs/s"
    )
    print(f"processes         {s.processes} (slowest exit after end of input: {s.max_exit_s:.2f} s)")
    print(f"stdout lines      {s.stdout_lines:,}: {s.responses:,} responses, {s.events:,} events")
    print(
        f"turns             {s.turns_started:,} started, {s.terminals:,} terminal events, "
        f"{s.tool_calls:,} tool calls requested"
    )
    print("error codes       " + ", ".join(f"{k} {v:,}" for k, v in s.error_codes.most_common()))
    print(f"crashes           {sum('exit status' in f or 'closed its stdin' in f for f in report.failures)}")
    print(f"internal errors   {sum('internal_error' in f for f in report.failures)}")
    print(f"failures          {len(report.failures)}")
    for f in report.failures[:40]:
        print("  " + f)
    raise SystemExit(0 if report.ok else 1)


if __name__ == "__main__":
    main()
