"""Soak: many NPCs with tool round trips, random cancels, late submits and tool timeouts,
through the real ``oam-bridge`` subprocess (scripted engine) over real pipes.

Each NPC plays turns back to back with a think time between them. A turn asks for one tool
call (``check_inventory``) and then streams a short answer. What the game does with the call:

- ``normal`` (70 %): submits after 0-30 ms; the call ends ``toolCallCompleted``;
- ``late`` (10 %): submits after the call's timeout (250 ms): the submit gets
  ``unknown_tool_call``, the call ends ``toolCallWithdrawn`` (timeout), the turn goes on;
- ``timeout`` (10 %): never submits: withdrawn (timeout), the turn goes on;
- ``cancel`` (10 %): ``npc/cancel`` 0-30 ms after the call was requested (sometimes with a
  submit in the same write): withdrawn (cancelled), the turn fails ``cancelled``.

Every 40 turns an NPC is deleted and created again (so histories stay bounded and RSS can
be flat), alternating with ``npc/reset``.

With ``--game`` the game layer runs too: the game sets or deletes a world fact (scoped to
everyone, a tag or some NPCs) every 20 ms, every NPC carries tags and, every fifth turn,
moves (``npc/setTags``) and is prewarmed (``npc/prewarm``, a turn of its own); one NPC in ten
is a decider whose turns are ``npc/decide`` with a scripted answer, half of them with
``guardrail`` errors played as fallbacks on ``npc/respond`` instead. Every prewarm, decision
and fallback turn must complete.

Checks: 0 lost responses (every request id answered once), 0 missing or extra terminal
events, seq 0..n without gaps, every requested call ends with exactly one of
toolCallCompleted/toolCallWithdrawn, the bridge exits 0 after stdin EOF. Prints per window
(a minute; 10 s for runs under 3 minutes) turns, turn latency p50/p99 (npc/respond sent to
the terminal event), bridge CPU per turn (``/proc/PID/stat``) and RSS, then whether latency,
CPU per turn and RSS are flat: the first window after warm-up against the last.

Usage::

    python bench/soak.py                # 10 minutes, 200 NPCs
    python bench/soak.py --minutes 1    # a quick run
    python bench/soak.py --npcs 50 --seed 3 --root OTHER_CHECKOUT
    python bench/soak.py --minutes 2 --game   # with world facts, decisions, prewarm, fallbacks

Exits 1 when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import trio

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CLK_TCK = os.sysconf("SC_CLK_TCK")
TOOL = {
    "name": "check_inventory",
    "description": "How many of an item the tavern has.",
    "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
}
TIMEOUT_MS = 250
TURNS_PER_LIFE = 40
KINDS = ["normal"] * 7 + ["late", "timeout", "cancel"]
PLACES = ["gate", "tavern", "mill", "market"]
OPTIONS = [{"name": "stay", "description": "stay put"}, {"name": "go", "description": "walk on"}]


def decider_script(turns: int) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for i in range(turns + 5):
        steps.append({"json": {"reasoning": "It is late.", "choice": "stay" if i % 2 else "go"}})
        steps.append({"error": "guardrail_violation", "message": "blocked", "delayMs": 2})
    return steps


def script(turns: int) -> list[dict[str, Any]]:
    steps: list[dict[str, Any]] = []
    for _ in range(turns + 5):
        steps.append({"toolCalls": [{"name": "check_inventory", "arguments": {"item": "ale"}}]})
        steps.append({"text": "We have three barrels of ale left, traveller, and a little bread.", "chunkMs": 1})
    return steps


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


@dataclass
class Turn:
    id: str
    started: float
    next_seq: int = 0
    terminal: str | None = None
    failure_code: str | None = None
    calls: dict[str, list[str]] = field(default_factory=dict)  # callId -> how it ended (events)
    requested: trio.Event = field(default_factory=trio.Event)
    ended: trio.Event = field(default_factory=trio.Event)


@dataclass
class Window:
    turns: int = 0
    latencies: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    rss_mib: float = 0.0


class Soak:
    def __init__(self, process: trio.Process, rng: random.Random, game: bool = False) -> None:
        self.game = game
        self.process = process
        self.rng = rng
        self.failures: list[str] = []
        self.waiting: dict[Any, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.sent_ids = 0
        self.answered = 0
        self.turns: dict[str, Turn] = {}
        self.early: dict[str, list[dict[str, Any]]] = {}  # events that came before the respond's result
        self.ids = 0
        self.windows: list[Window] = []
        self.counts: dict[str, int] = {}
        self.stop = False
        self.eof = trio.Event()
        self.send_lock = trio.Lock()  # one writer of the bridge's stdin at a time
        self.finish_reasons: dict[str, str] = {}  # game-layer turns: the finishReason due

    def fail(self, what: str) -> None:
        if len(self.failures) < 100:
            self.failures.append(what)

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    async def read(self) -> None:
        assert self.process.stdout is not None
        buf = b""
        async for data in self.process.stdout:
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                try:
                    msg = json.loads(line)
                except ValueError:
                    self.fail(f"stdout line is not JSON: {line[:200]!r}")
                    continue
                if isinstance(msg, dict) and "method" in msg:
                    self.event(msg)
                elif isinstance(msg, dict) and msg.get("id") in self.waiting:
                    self.answered += 1
                    self.waiting.pop(msg["id"]).send_nowait(msg)
                else:
                    self.fail(f"a response nobody waits for: {line[:200]!r}")
        if buf:
            self.fail(f"stdout ends in a cut-off line: {buf[:200]!r}")
        self.eof.set()
        for id_, waiter in list(self.waiting.items()):
            waiter.send_nowait({"id": id_, "error": {"data": {"code": "eof"}}})

    def event(self, msg: dict[str, Any]) -> None:
        p = msg["params"]
        turn = self.turns.get(p["turnId"])
        if turn is None:
            self.early.setdefault(p["turnId"], []).append(msg)
            return
        self.apply(turn, msg)

    def apply(self, turn: Turn, msg: dict[str, Any]) -> None:
        method, p = msg["method"], msg["params"]
        if turn.terminal is not None:
            self.fail(f"{method} after the terminal event of {turn.id}")
        if p["seq"] != turn.next_seq:
            self.fail(f"{turn.id}: seq {p['seq']} where {turn.next_seq} was due")
        turn.next_seq = p["seq"] + 1
        if method == "turn/toolCallRequested":
            turn.calls.setdefault(p["callId"], [])
            turn.requested.set()
        elif method in ("turn/toolCallCompleted", "turn/toolCallWithdrawn"):
            ends = turn.calls.setdefault(p["callId"], [])
            ends.append(method.split("/")[1] + (f"({p['reason']})" if "reason" in p else ""))
        elif method in ("turn/completed", "turn/failed"):
            turn.terminal = method
            if method == "turn/failed":
                turn.failure_code = p["error"]["code"]
            want = self.finish_reasons.pop(turn.id, None)
            if want is not None and method == "turn/completed" and p["finishReason"] != want:
                self.fail(f"{turn.id}: finishReason {p['finishReason']!r}, not {want!r}")
            self.window().turns += 1
            self.window().latencies.append(time.perf_counter() - turn.started)
            turn.requested.set()
            turn.ended.set()

    def window(self) -> Window:
        return self.windows[-1]

    async def send(self, *msgs: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        data = b"".join(json.dumps(m).encode() + b"\n" for m in msgs)
        async with self.send_lock:
            await self.process.stdin.send_all(data)

    def request(
        self, method: str, params: dict[str, Any]
    ) -> tuple[dict[str, Any], trio.MemoryReceiveChannel[dict[str, Any]]]:
        self.ids += 1
        send, recv = trio.open_memory_channel[dict[str, Any]](1)
        self.waiting[self.ids] = send
        self.sent_ids += 1
        return {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}, recv

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        msg, recv = self.request(method, params)
        await self.send(msg)
        return await recv.receive()

    async def must(self, method: str, params: dict[str, Any]) -> Any:
        r = await self.call(method, params)
        if "result" not in r:
            self.fail(f"{method} {params.get('npcId')}: {r.get('error')}")
            return None
        return r["result"]

    def config(self, npc_id: str, decider: bool) -> dict[str, Any]:
        if not self.game:
            return {"npcId": npc_id, "tools": [TOOL], "script": script(TURNS_PER_LIFE)}
        c: dict[str, Any] = {"npcId": npc_id, "tools": [TOOL], "tags": self.rng.sample(PLACES, 2)}
        if decider:
            c.update(script=decider_script(TURNS_PER_LIFE), fallbacks={"guardrailViolation": ["Not now."]})
        else:
            c["script"] = script(TURNS_PER_LIFE)
        return c

    async def world(self, npcs: int) -> None:
        """The game's side of the world: a fact changes every 20 ms."""
        while not self.stop:
            await trio.sleep(0.02)
            key = f"fact {self.rng.randrange(200)}"
            if self.rng.random() < 0.2:
                await self.must("world/delete", {"key": key})
                continue
            p: dict[str, Any] = {"key": key, "value": {"n": self.rng.randrange(1000), "text": "the mill wheel turns"}}
            r = self.rng.random()
            if r < 0.4:
                p["tags"] = [self.rng.choice(PLACES)]
            elif r < 0.6:
                p["npcIds"] = [f"npc{self.rng.randrange(npcs)}"]
            elif r < 0.7:
                p["lore"] = True
            await self.must("world/set", p)
            self.count("world changes")

    async def game_turn(self, npc_id: str, method: str, params: dict[str, Any], want: str) -> None:
        """A turn the game only waits for: it must complete, with ``want`` as finishReason."""
        started = time.perf_counter()
        r = await self.call(method, params)
        if "result" not in r:
            self.fail(f"{method} {npc_id}: {r.get('error')}")
            return
        turn = Turn(r["result"]["turnId"], started)
        self.turns[turn.id] = turn
        self.finish_reasons[turn.id] = want
        for msg in self.early.pop(turn.id, []):
            self.apply(turn, msg)
        self.count(f"turns {method} ({want})")
        with trio.move_on_after(30) as scope:
            await turn.ended.wait()
        if scope.cancelled_caught:
            self.fail(f"{turn.id} ({method}) did not end within 30 s")
        elif turn.terminal != "turn/completed":
            self.fail(f"{turn.id} ({method}) ended {turn.terminal} {turn.failure_code}")

    async def npc(self, i: int) -> None:
        npc_id = f"npc{i}"
        life = 0
        decider = self.game and i % 10 == 0
        await self.must("npc/create", self.config(npc_id, decider))
        played = 0
        while not self.stop:
            await trio.sleep(self.rng.uniform(0.5, 2.5))
            if self.stop:
                break
            if decider:
                await self.game_turn(
                    npc_id, "npc/decide", {"npcId": npc_id, "situation": "Night falls.", "options": OPTIONS}, "stop"
                )
                await self.game_turn(
                    npc_id,
                    "npc/respond",
                    {"npcId": npc_id, "prompt": "Say something awful.", "guardrail": "fallback"},
                    "fallback",
                )
            else:
                await self.turn(npc_id, self.rng.choice(KINDS))
            played += 1
            if self.game and played % 5 == 0 and not decider:
                await self.must("npc/setTags", {"npcId": npc_id, "tags": self.rng.sample(PLACES, 2)})
                await self.game_turn(npc_id, "npc/prewarm", {"npcId": npc_id}, "prewarmed")
            if played == TURNS_PER_LIFE:
                played, life = 0, life + 1
                if life % 2:
                    await self.must("npc/delete", {"npcId": npc_id})
                    await self.must("npc/create", self.config(npc_id, decider))
                    self.count("npc recreated")
                else:
                    await self.must("npc/reset", {"npcId": npc_id})
                    self.count("npc reset")

    async def turn(self, npc_id: str, kind: str) -> None:
        started = time.perf_counter()
        r = await self.call(
            "npc/respond", {"npcId": npc_id, "prompt": "Any ale left?", "maxToolRounds": 1, "toolTimeoutMs": TIMEOUT_MS}
        )
        if "result" not in r:
            self.fail(f"npc/respond {npc_id}: {r.get('error')}")
            return
        turn = Turn(r["result"]["turnId"], started)
        self.turns[turn.id] = turn
        for msg in self.early.pop(turn.id, []):
            self.apply(turn, msg)
        self.count(f"turns {kind}")
        with trio.move_on_after(30) as scope:
            await turn.requested.wait()
            calls = list(turn.calls)
            if kind == "cancel":
                await trio.sleep(self.rng.uniform(0, 0.03))
                cancel, got_cancel = self.request("npc/cancel", {"npcId": npc_id})
                msgs = [cancel]
                with_submit = calls and self.rng.random() < 0.5
                if with_submit:
                    submit, got_submit = self.request(
                        "npc/submit", {"npcId": npc_id, "callId": calls[0], "output": {"count": 3}}
                    )
                    msgs.append(submit)
                await self.send(*msgs)
                await got_cancel.receive()
                if with_submit:
                    resp = await got_submit.receive()
                    self.count(
                        "submit after cancel: " + ("accepted" if "result" in resp else resp["error"]["data"]["code"])
                    )
            elif calls and kind in ("normal", "late"):
                await trio.sleep(self.rng.uniform(0, 0.03) if kind == "normal" else (TIMEOUT_MS + 150) / 1000)
                resp = await self.call("npc/submit", {"npcId": npc_id, "callId": calls[0], "output": {"count": 3}})
                self.count(f"submit {kind}: " + ("accepted" if "result" in resp else resp["error"]["data"]["code"]))
            await turn.ended.wait()
        if scope.cancelled_caught:
            self.fail(f"{turn.id} ({kind}) did not end within 30 s")

    async def sample(self, pid: int, window_s: float) -> None:
        last_cpu = cpu_s(pid)
        while True:
            await trio.sleep(window_s)
            w = self.window()
            now = cpu_s(pid)
            w.cpu_s, last_cpu = now - last_cpu, now
            w.rss_mib = rss_mib(pid)
            self.report_window(len(self.windows), w, window_s)
            self.windows.append(Window())

    def report_window(self, n: int, w: Window, window_s: float) -> None:
        per_turn = w.cpu_s / w.turns * 1000 if w.turns else float("nan")
        print(
            f"{n * window_s / 60:6.1f} min  turns {w.turns:6,}  latency p50 {pct(w.latencies, 0.5) * 1000:6.1f} ms"
            f"  p99 {pct(w.latencies, 0.99) * 1000:6.1f} ms  CPU/turn {per_turn:6.3f} ms  RSS {w.rss_mib:6.1f} MiB",
            flush=True,
        )

    def verify(self) -> None:
        if self.sent_ids != self.answered:
            self.fail(f"{self.sent_ids - self.answered} lost response(s) of {self.sent_ids}")
        if self.early:
            self.fail(f"events for {len(self.early)} turn(s) nobody started: {list(self.early)[:3]}")
        bad: dict[str, str] = {}  # how a call ended wrongly -> an example
        for t in self.turns.values():
            if t.terminal is None:
                self.fail(f"{t.id}: no terminal event")
            for call_id, ends in t.calls.items():
                pattern = " + ".join(ends) or "never"
                self.count("call ended " + pattern)
                if len(ends) != 1:
                    if pattern not in bad:
                        bad[pattern] = f"{t.id} call {call_id}"
                    self.count("BAD call ended " + pattern)
        for pattern, example in bad.items():
            self.fail(
                f"{self.counts['BAD call ended ' + pattern]} call(s) ended {pattern}, "
                f"not with exactly one of completed/withdrawn (e.g. {example})"
            )


def flat(first: float, last: float, slack: float) -> str:
    if first != first or last != last or first == 0:
        return "n/a"
    ratio = last / first
    return f"{'flat' if ratio <= slack else 'NOT flat'} ({first:.3f} -> {last:.3f}, x{ratio:.2f})"


async def main_async(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    env = {
        **os.environ,
        "PYTHONPATH": args.root + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else ""),
    }
    process = await trio.lowlevel.open_process(
        [sys.executable, "-m", "bridge", "--engine", "scripted"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        cwd=args.root,
        env=env,
    )
    soak = Soak(process, rng, args.game)
    soak.windows.append(Window())
    window_s = args.window or (60.0 if args.minutes >= 3 else 10.0)
    print(
        f"soak: {args.npcs} NPCs for {args.minutes} min, windows of {window_s:.0f} s, bridge pid {process.pid}",
        flush=True,
    )
    status: int | None = None
    async with trio.open_nursery() as nursery:
        nursery.start_soon(soak.read)
        init = await soak.call("initialize", {"protocolVersion": 1})
        if "result" not in init:
            print(f"initialize failed: {init}")
            return 1
        nursery.start_soon(soak.sample, process.pid, window_s)
        async with trio.open_nursery() as npcs:
            for i in range(args.npcs):
                npcs.start_soon(soak.npc, i)
            if args.game:
                npcs.start_soon(soak.world, args.npcs)
            await trio.sleep(args.minutes * 60)
            soak.stop = True
            with trio.move_on_after(40):
                while any(t.terminal is None for t in soak.turns.values()):
                    await trio.sleep(0.05)
            npcs.cancel_scope.deadline = trio.current_time() + 5
        assert process.stdin is not None
        await process.stdin.aclose()
        t0 = time.perf_counter()
        with trio.move_on_after(10):
            status = await process.wait()
            await soak.eof.wait()
        exit_s = time.perf_counter() - t0
        nursery.cancel_scope.cancel()
    if status is None:
        process.kill()
        soak.fail("the bridge did not exit within 10 s of stdin EOF")
    elif status != 0:
        soak.fail(f"exit status {status}")
    soak.verify()
    full = [w for w in soak.windows if w.rss_mib > 0]
    print()
    print(
        f"turns: {sum(w.turns for w in full):,} ended; requests: {soak.sent_ids:,} sent, "
        f"{soak.answered:,} answered; exit {exit_s:.2f} s after EOF"
    )
    for k in sorted(soak.counts):
        print(f"  {k:40s} {soak.counts[k]:8,}")
    if len(full) >= 3:
        first, last = full[1], full[-1]  # the first window is warm-up
        print("latency p50: " + flat(pct(first.latencies, 0.5) * 1000, pct(last.latencies, 0.5) * 1000, 1.25))
        print("latency p99: " + flat(pct(first.latencies, 0.99) * 1000, pct(last.latencies, 0.99) * 1000, 1.5))
        print(
            "CPU/turn ms: "
            + flat(first.cpu_s / max(first.turns, 1) * 1000, last.cpu_s / max(last.turns, 1) * 1000, 1.25)
        )
        print("RSS MiB:     " + flat(first.rss_mib, last.rss_mib, 1.05))
    else:
        print("too few windows to judge flatness (use --minutes 1 or more)")
    print(f"failures: {len(soak.failures)}")
    for f in soak.failures[:40]:
        print("  " + f)
    return 1 if soak.failures else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--npcs", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument(
        "--window", type=float, default=0, help="seconds per reported window (default: 60, or 10 under 3 minutes)"
    )
    ap.add_argument(
        "--game", action="store_true", help="the game layer too: world facts, decisions, prewarm, fallbacks"
    )
    ap.add_argument(
        "--root", default=ROOT, help="source tree whose bridge package is started (default: this repository)"
    )
    args = ap.parse_args()
    args.root = os.path.abspath(args.root)
    raise SystemExit(trio.run(main_async, args))


if __name__ == "__main__":
    main()
