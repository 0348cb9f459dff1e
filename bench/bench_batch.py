"""Many NPCs at once (issue 12): N NPCs ask at the same moment, beside llama-server.

For each N (``--n``, default 1, 4 and 8), N NPCs with distinct personas (prompts of about
100 tokens) each ask one question at the same moment, greedy; three sides, interleaved per
repeat, each round with fresh NPCs whose prompts start with the round's number (no side
finds them cached):

- **bridge**: the real ``oam-bridge --engine llama`` subprocess: the N ``npc/respond`` go out
  in one write; time to first token is the first ``turn/textDelta`` of each turn,
  completion its ``turn/completed``; output tokens are ``usage.outputTokens``.
- **llama-server**: llama.cpp's own server, built from the llama.cpp vendored in the installed
  llama-cpp-python's sdist, started with ``-np N -cb``, called directly: N streamed
  ``POST /v1/chat/completions`` (system: the NPC's instructions, user: the question), sent
  together; time to first token is the first non-empty ``content`` delta.
- **remote**: ``oam-bridge --engine openai --openai-url`` pointed at that llama-server.

With ``--baseline REV`` the bridge side also runs from another git revision (a ``git
worktree`` in a temporary folder, its ``bridge`` package on this venv), so "as fast as
before" is measured in the same run.

Like for like: the llama engine shapes spoken lines (``SpokenLine``: past half of
``maxTokens`` a line ends at the next sentence end, and the model may end it sooner), so
the bridge rarely generates all ``--tokens``. By default (``--server-tokens bridge``) each
NPC on the llama-server and remote sides is asked for exactly as many tokens as the same
NPC generated through the bridge in that repeat (llama-server runs ``--ignore-eos``), so
every side does the same work; ``--server-tokens full`` asks them for ``--tokens`` each.
Actual output tokens are printed per side. Aggregate tokens/s = all NPCs' output tokens /
wall time from sending the first request to the last completion. With more than one repeat
the ratios are also printed paired by repeat (median and range of each repeat's ratio, and
from 5 repeats the bootstrap 90% interval of that median): the two sides of a repeat run
seconds apart, medians of each side minutes apart, and on a shared machine the speed moves
in between (a repeat's ratio moved 0.7-1.5 on the 2-core VM).

Threads, the same on both sides: one NPC's token is decoded with T threads (the bridge's
``--llama-threads T``, llama-server's ``-t T``; T defaults to cores - 1, the bridge's default)
and prompt chunks and passes of several NPCs with B (``--llama-batch-threads B``, ``-tb B``;
B defaults to every core, ``--server-tb`` sets it). llama.cpp computes every batch of more
than one token with the batch threads (``llama_context::graph_compute``), so with several
NPCs generating both sides decode on B cores. "cores used" is the side's processes' CPU time
over the round's wall time (the remote side: bridge plus server). On a busy machine
every-core decoding stalls whenever one core is taken (ggml's threads meet at a barrier on
each op): compare the cores columns.

``--places P``: P NPCs decode together (the bridge's ``--llama-parallel P``, llama-server's
``-np P``); the others wait for a place, as 32 NPCs on 8 places. ``--no-remote`` leaves out
the openai engine's side.

llama-server is a measuring stick, not a dependency: built once (a few minutes on 2 cores)
into ``$XDG_CACHE_HOME/oam-bridge/llama-server-<version>/`` (default ``~/.cache``) and
reused. Building needs cmake and a C++ compiler (``apt-get install -y cmake g++``) and pip's
access to PyPI for the sdist. This bench is not part of ``make test``.

Usage: python bench/bench_batch.py [--n 1,4,8] [--tokens 64] [--repeat 3] [--threads T]
       [--ctx 2048] [--baseline REV] [--server-tokens bridge|full] [--server-tb N] [--places P]
       [--no-remote] [--quick] [--lore]

``--lore``: every NPC's instructions start with the same ~250 tokens of town lore (the
game's world, as a town's NPCs share it). The bridge reads it once per round and the other
NPCs share its KV cells (counted once in --llama-ctx); llama-server reads it once per NPC.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import random
import shutil
import socket
import statistics as st
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PY = sys.executable

import httpx  # noqa: E402
import trio  # noqa: E402

# (name, who, what they know, question): with the instructions around them, about 100 prompt tokens
PERSONAS = [
    (
        "Greta",
        "the tavern keeper of the Gilded Flagon in Eldmoor",
        "She knows every ale, stew and rumour in town and loves to tell travellers about them at length",
        "What is on the menu tonight, and what would you recommend?",
    ),
    (
        "Brann",
        "the gate guard of Eldmoor",
        "He has watched the north road for twenty years and remembers every caravan, bandit and storm",
        "What has happened on the road this week?",
    ),
    (
        "Mira",
        "a travelling merchant with a cart full of goods",
        "She sells silk, spices, lamps, rope, knives and maps, and she describes every item in detail",
        "What do you have for sale today?",
    ),
    (
        "Old Tom",
        "a fisherman on the grey lake",
        "He talks about the weather, the fish, the boats and the old days on the water",
        "How was the fishing this morning?",
    ),
    (
        "Sister Ilse",
        "the healer at the temple of the dawn",
        "She treats fevers, wounds and curses with herbs and prayers and explains her remedies carefully",
        "I have a bad cough. What should I do?",
    ),
    (
        "Dorn",
        "the blacksmith by the river",
        "He forges swords, horseshoes, nails and plough blades and is proud of his craft",
        "Can you tell me how you make a good sword?",
    ),
    (
        "Lysa",
        "the court bard of the castle",
        "She knows songs about every king, battle and lost love of the last hundred years",
        "Tell me the story of the old king and the dragon.",
    ),
    (
        "Harrow",
        "the old archivist of the castle library",
        "He keeps maps, ledgers and chronicles and loves explaining the history of the realm",
        "What is the history of this castle?",
    ),
]


# --lore: the town's lore, the same for every NPC (about 250 tokens), before each persona
LORE = (
    "Eldmoor is a walled town of four thousand souls in the valley of the grey river, three days north of "
    "the capital. Its castle stands on the hill above the market square, where the Gilded Flagon, the temple "
    "of the dawn and the guild hall face each other. The north road brings caravans of wool, salt and iron; "
    "the river brings barges of grain and timber. Baron Aldric rules the town from the castle, his steward "
    "Wendel collects the taxes on market days, and Captain Roswitha commands the forty guards of the walls. "
    "This spring the harvest was poor, bread costs twice what it did, and people blame the miller. Bandits "
    "were seen on the north road last month, so caravans now travel together with hired swords. A fever "
    "came with the barges in the winter and the temple's healers still tend the sick. The old dragon of the "
    "Ashen Peaks has not been seen for forty years, but shepherds speak of smoke on the mountain again. "
    "Travellers pay two copper coins at the gate, a room at the Flagon costs five, and a sword from the "
    "smithy costs three gold crowns. Everyone in Eldmoor knows these things and speaks of them freely. "
)
lore = False


def npc_prompt(i: int, rnd: int) -> tuple[str, str]:
    """NPC ``i``'s instructions and question in round ``rnd`` (the round first: no side has
    the prompt cached from an earlier round; with ``--lore`` the town's lore follows it)."""
    name, who, knows, question = PERSONAS[i % len(PERSONAS)]
    if i >= len(PERSONAS):
        name = f"{name} the {i // len(PERSONAS) + 1}th"
    return (
        f"Day {rnd}. {LORE if lore else ''}You are {name}, {who}. {knows}. Stay in character and speak as {name} "
        f"would, in plain "
        f"spoken words. Give long, detailed answers that name many things, and never break character or "
        f"mention being an AI."
    ), question


# -- llama-server: built once from the installed llama-cpp-python's sdist -----------------------


def cache_root() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "oam-bridge")


def llama_server_binary() -> tuple[str, str]:
    """(path, llama-cpp-python version) of llama-server built from the llama.cpp vendored in
    the installed llama-cpp-python's sdist, into ``<cache>/llama-server-<version>/`` once."""
    return llama_cpp_tool("llama-server")


def llama_cpp_tool(target: str) -> tuple[str, str]:
    """(path, llama-cpp-python version) of one of llama.cpp's own programs (``llama-server``,
    ``llama-bench``), built from the llama.cpp vendored in the installed llama-cpp-python's
    sdist into ``<cache>/llama-server-<version>/build/bin`` once."""
    version = importlib.metadata.version("llama-cpp-python")
    home = os.path.join(cache_root(), f"llama-server-{version}")
    build = os.path.join(home, "build")
    binary = os.path.join(build, "bin", target)
    if os.path.exists(binary):
        return binary, version
    if shutil.which("cmake") is None:
        raise SystemExit(f"bench: cmake is needed to build {target} once (apt-get install -y cmake)")
    os.makedirs(home, exist_ok=True)
    src = os.path.join(home, "src")
    if not os.path.isdir(os.path.join(src, "vendor", "llama.cpp")):
        with tempfile.TemporaryDirectory(dir=home) as dl:
            print(f"downloading the llama-cpp-python {version} sdist", flush=True)
            subprocess.run(
                [
                    PY,
                    "-m",
                    "pip",
                    "download",
                    f"llama-cpp-python=={version}",
                    "--no-binary",
                    ":all:",
                    "--no-deps",
                    "-q",
                    "-d",
                    dl,
                ],
                check=True,
            )
            (sdist,) = [f for f in os.listdir(dl) if f.endswith(".tar.gz")]
            with tarfile.open(os.path.join(dl, sdist)) as tar:
                tar.extractall(dl, filter="data")
            (top,) = [d for d in os.listdir(dl) if os.path.isdir(os.path.join(dl, d))]
            shutil.rmtree(src, ignore_errors=True)
            os.rename(os.path.join(dl, top), src)
    t0 = time.monotonic()
    print(f"building {target} (a few minutes on 2 cores)", flush=True)
    subprocess.run(
        [
            "cmake",
            "-S",
            os.path.join(src, "vendor", "llama.cpp"),
            "-B",
            build,
            "-DLLAMA_BUILD_SERVER=ON",
            "-DLLAMA_CURL=OFF",
            "-DGGML_NATIVE=ON",
            "-DCMAKE_BUILD_TYPE=Release",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    subprocess.run(
        ["cmake", "--build", build, "--target", target, f"-j{os.cpu_count() or 2}"],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    print(f"built {target} in {time.monotonic() - t0:.0f} s", flush=True)
    return binary, version


def add_worktree(rev: str) -> str:
    """A git worktree of ``rev`` in a temporary folder (its ``bridge`` package runs on this
    venv), for a baseline measured in the same run."""
    path = tempfile.mkdtemp(prefix="oam-bench-")
    subprocess.run(["git", "-C", ROOT, "worktree", "add", "--detach", "-q", path, rev], check=True)
    return path


def remove_worktree(path: str) -> None:
    subprocess.run(["git", "-C", ROOT, "worktree", "remove", "--force", path], check=False)
    shutil.rmtree(path, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pids: list[int]) -> float:
    """User plus system CPU time of these processes (all their threads), from /proc."""
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


class LlamaServer:
    def __init__(
        self, binary: str, model: str, n: int, ctx: int, threads: int | None, batch_threads: int | None
    ) -> None:
        """``threads``/``batch_threads``: ``-t``/``-tb``; None leaves llama-server's default."""
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [
            binary,
            "-m",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "-np",
            str(n),
            "-cb",
            "-c",
            str(ctx * n),
            *(["-t", str(threads)] if threads is not None else []),
            *(["-tb", str(batch_threads)] if batch_threads is not None else []),
            "--ignore-eos",
            "--jinja",
            "--no-webui",
        ]
        self.log = tempfile.TemporaryFile()
        self.p = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + 120
        while True:
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.p.poll() is not None or time.monotonic() > deadline:
                self.log.seek(0)
                tail = self.log.read()[-2000:].decode("utf-8", "replace")
                self.close()
                raise SystemExit(f"llama-server did not start:\n{tail}")
            time.sleep(0.2)

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.terminate()
            try:
                self.p.wait(10)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


# -- one round: N NPCs asking at once ----------------------------------------------------------


@dataclass
class Round:
    ttft: list[float]  # per NPC, seconds from the send of the first request
    done: list[float]
    tokens: list[int]  # output tokens per NPC
    prompt_tokens: list[int]
    wall: float
    cores: float  # CPU seconds / wall seconds

    @property
    def tok_s(self) -> float:
        return sum(self.tokens) / self.wall


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    k = q * (len(s) - 1)
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


class Bridge:
    """An ``oam-bridge`` subprocess; ``root`` is the tree whose ``bridge`` package runs,
    ``launcher`` the command that starts it (default ``python -m bridge``)."""

    def __init__(self, args: list[str], root: str = ROOT, launcher: list[str] | None = None) -> None:
        env = dict(os.environ, PYTHONPATH=root)
        self.p = subprocess.Popen(
            [*(launcher or [PY, "-m", "bridge"]), *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=root,
            env=env,
            bufsize=0,
        )
        self.ids = 0
        self.call("initialize", {"protocolVersion": 1})

    def request(self, method: str, params: dict[str, Any]) -> tuple[int, bytes]:
        self.ids += 1
        return self.ids, json.dumps(
            {"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}
        ).encode() + b"\n"

    def line(self) -> dict[str, Any]:
        assert self.p.stdout is not None
        raw = self.p.stdout.readline()
        if not raw:
            raise RuntimeError("the bridge exited")
        return json.loads(raw)  # type: ignore[no-any-return]

    def call(self, method: str, params: dict[str, Any]) -> Any:
        i, data = self.request(method, params)
        assert self.p.stdin is not None
        self.p.stdin.write(data)
        while True:
            msg = self.line()
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg["result"]

    def round(self, engine: str, rnd: int, budgets: list[int], extra_pids: list[int] = ()) -> Round:  # type: ignore[assignment]
        n = len(budgets)
        ids = [f"r{rnd}n{i}" for i in range(n)]
        for i, npc in enumerate(ids):
            instructions, _ = npc_prompt(i, rnd)
            self.call(
                "npc/create",
                {
                    "npcId": npc,
                    "engine": engine,
                    "instructions": instructions,
                    "options": {"temperature": 0, "maxTokens": budgets[i], "seed": 1},
                },
            )
        batch = b"".join(
            self.request("npc/respond", {"npcId": npc, "prompt": npc_prompt(i, rnd)[1], "fullText": False})[1]
            for i, npc in enumerate(ids)
        )
        pids = [self.p.pid, *extra_pids]
        assert self.p.stdin is not None
        cpu0 = cpu_seconds(pids)
        t0 = time.perf_counter()
        self.p.stdin.write(batch)  # every NPC asks at the same moment
        first: dict[str, float] = {}
        done: dict[str, float] = {}
        usage: dict[str, dict[str, int]] = {}
        while len(done) < n:
            msg = self.line()
            method = msg.get("method")
            if "error" in msg:
                raise RuntimeError(f"npc/respond: {msg['error']}")
            if method == "turn/textDelta":
                first.setdefault(msg["params"]["npcId"], time.perf_counter() - t0)
            elif method == "turn/completed":
                npc = msg["params"]["npcId"]
                done[npc] = time.perf_counter() - t0
                usage[npc] = msg["params"]["usage"]
            elif method == "turn/failed":
                raise RuntimeError(f"turn failed: {msg['params']}")
        wall = max(done.values())
        cores = (cpu_seconds(pids) - cpu0) / wall
        for npc in ids:
            self.call("npc/delete", {"npcId": npc})
        return Round(
            [first.get(x, done[x]) for x in ids],
            [done[x] for x in ids],
            [usage[x]["outputTokens"] for x in ids],
            [usage[x]["inputTokens"] for x in ids],
            wall,
            cores,
        )

    def warm(self, engine: str) -> None:
        """Loads the engine (its model, its connection) before anything is timed."""
        self.call(
            "npc/create",
            {
                "npcId": "warm",
                "engine": engine,
                "instructions": "You are a guard.",
                "options": {"temperature": 0, "maxTokens": 4},
            },
        )
        self.call("npc/respond", {"npcId": "warm", "prompt": "Hello!"})
        while self.line().get("method") not in ("turn/completed", "turn/failed"):
            pass
        self.call("npc/delete", {"npcId": "warm"})

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        try:
            self.p.wait(30)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()


async def server_round(server: LlamaServer, rnd: int, budgets: list[int]) -> Round:
    """N streamed chat completions sent together straight to llama-server."""
    n = len(budgets)
    first: list[float | None] = [None] * n
    done = [0.0] * n
    tokens = [0] * n
    prompt = [0] * n
    go = trio.Event()
    t0 = 0.0

    async def one(client: httpx.AsyncClient, i: int) -> None:
        instructions, question = npc_prompt(i, rnd)
        body = {
            "messages": [{"role": "system", "content": instructions}, {"role": "user", "content": question}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "temperature": 0,
            "seed": 1,
            "max_tokens": budgets[i],
            "ignore_eos": True,
        }
        await go.wait()
        async with client.stream("POST", f"{server.url}/v1/chat/completions", json=body) as resp:
            resp.raise_for_status()
            async for line in resp.aiter_lines():
                if not line.startswith("data:") or line[5:].strip() == "[DONE]":
                    continue
                obj = json.loads(line[5:])
                for choice in obj.get("choices") or []:
                    if (choice.get("delta") or {}).get("content") and first[i] is None:
                        first[i] = time.perf_counter() - t0
                if obj.get("usage"):
                    tokens[i] = obj["usage"]["completion_tokens"]
                    prompt[i] = obj["usage"]["prompt_tokens"]
        done[i] = time.perf_counter() - t0

    limits = httpx.Limits(max_connections=n + 4, max_keepalive_connections=n + 4)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, client, i)
            await trio.sleep(0.05)  # every task waits on go
            cpu0 = cpu_seconds([server.p.pid])
            t0 = time.perf_counter()
            go.set()
        wall = max(done)
        cores = (cpu_seconds([server.p.pid]) - cpu0) / wall
    return Round(
        [f if f is not None else d for f, d in zip(first, done, strict=True)], done, tokens, prompt, wall, cores
    )


async def server_warm(server: LlamaServer) -> None:
    async with httpx.AsyncClient(timeout=120) as client:
        r = await client.post(
            f"{server.url}/v1/chat/completions",
            json={"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 4, "temperature": 0},
        )
        r.raise_for_status()


# -- the report --------------------------------------------------------------------------------


@dataclass
class Side:
    label: str
    rounds: list[Round] = field(default_factory=list)

    def med(self, f: Any) -> float:
        return st.median(f(r) for r in self.rounds)

    def row(self) -> str:
        m = self.med
        return (
            f"{self.label:<30}{m(lambda r: r.tok_s):>7.1f}{m(lambda r: sum(r.tokens)):>7.0f}"
            f"{m(lambda r: st.median(r.prompt_tokens)):>6.0f}"
            f"{m(lambda r: st.median(r.ttft)):>8.2f}{m(lambda r: pct(r.ttft, 0.95)):>7.2f}"
            f"{m(lambda r: max(r.ttft)):>7.2f}"
            f"{m(lambda r: min(r.ttft)):>7.2f}{m(lambda r: st.median(r.done)):>8.2f}{m(lambda r: max(r.done)):>7.2f}"
            f"{m(lambda r: r.cores):>7.2f}"
        )


HEADER = (
    f"{'side':<30}{'tok/s':>7}{'out':>7}{'in':>6}{'TTFT50':>8}{'p95':>7}{'max':>7}{'first':>7}"
    f"{'done50':>8}{'max':>7}{'cores':>7}"
)


def ratio(a: float, b: float) -> str:
    return f"{a / b:.2f}" if b else "n/a"


def paired(a: Side, b: Side, f: Any) -> str:
    """Median and range of a's figure over b's, repeat by repeat: on a noisy machine the two
    sides of one repeat ran a few seconds apart, so the ratio of each pair moves less than a
    ratio of medians taken minutes apart. From 5 repeats on, also the 90% interval of that
    median (bootstrap over the repeats): a median above 1 whose interval holds 1 is not
    a measured loss, nor one below 1 a gain."""
    rs = sorted(f(x) / f(y) for x, y in zip(a.rounds, b.rounds, strict=True) if f(y))
    if not rs:
        return "n/a"
    interval = ""
    if len(rs) >= 5:
        draw = random.Random(len(rs))
        boot = sorted(st.median(draw.choices(rs, k=len(rs))) for _ in range(2000))
        interval = f", 90% {boot[100]:.2f}-{boot[1899]:.2f}"
    return f"{st.median(rs):.2f} [{rs[0]:.2f}-{rs[-1]:.2f}{interval}]"


def report(n: int, sides: dict[str, Side], goal_tok: bool) -> None:
    b, s, r, old = sides["bridge"], sides["server"], sides.get("remote"), sides.get("baseline")
    tok = lambda x: x.med(lambda q: q.tok_s)  # noqa: E731
    worst = lambda x: x.med(lambda q: max(q.ttft))  # noqa: E731
    first = lambda x: x.med(lambda q: min(q.ttft))  # noqa: E731
    p50 = lambda x: x.med(lambda q: st.median(q.ttft))  # noqa: E731
    print(
        f"  bridge / llama-server: tok/s {ratio(tok(b), tok(s))}{' (goal >= 1)' if goal_tok else ''}, "
        f"worst TTFT {ratio(worst(b), worst(s))} (goal <= 1), first NPC's TTFT {ratio(first(b), first(s))}"
    )
    if len(b.rounds) > 1:
        print(
            f"  the same, paired by repeat (each round against the llama-server round after it; median "
            f"[range, 90% interval of the median]): tok/s {paired(b, s, lambda q: q.tok_s)}, "
            f"worst TTFT {paired(b, s, lambda q: max(q.ttft))}"
        )
    if old is not None:
        print(
            f"  bridge / baseline: tok/s {ratio(tok(b), tok(old))}{' (goal >= 1)' if n == 1 else ''}, "
            f"first NPC's TTFT {ratio(first(b), first(old))} (goal <= 1), worst TTFT {ratio(worst(b), worst(old))}"
        )
        if len(b.rounds) > 1:
            print(
                f"  the same, paired by repeat: tok/s {paired(b, old, lambda q: q.tok_s)}, "
                f"first NPC's TTFT {paired(b, old, lambda q: min(q.ttft))}, "
                f"worst TTFT {paired(b, old, lambda q: max(q.ttft))}"
            )
    if r is not None:
        print(
            f"  remote engine's added TTFT over llama-server direct: p50 {1e3 * (p50(r) - p50(s)):+.0f} ms, "
            f"first {1e3 * (first(r) - first(s)):+.0f} ms, worst {1e3 * (worst(r) - worst(s)):+.0f} ms"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", default="1,4,8", help="NPC counts, comma-separated")
    ap.add_argument("--tokens", type=int, default=64, help="maxTokens per NPC")
    ap.add_argument("--repeat", type=int, default=3, help="rounds per side and N; medians are printed")
    ap.add_argument("--threads", type=int, default=0, help="decode threads, both sides (default cores - 1)")
    ap.add_argument(
        "--ctx", type=int, default=2048, help="context per NPC: the bridge's --llama-ctx, llama-server's -c / N"
    )
    ap.add_argument("--baseline", metavar="REV", help="also run the bridge side from this git revision")
    ap.add_argument(
        "--server-tokens",
        choices=["bridge", "full"],
        default="bridge",
        help="bridge: each NPC on llama-server asks for what it generated through the bridge; full: --tokens",
    )
    ap.add_argument(
        "--server-tb",
        type=int,
        default=0,
        help="threads for prompts and batches of several NPCs, both sides (-tb, --llama-batch-threads; "
        "default: every core)",
    )
    ap.add_argument(
        "--places",
        type=int,
        default=0,
        help="NPCs decoding together: the bridge's --llama-parallel, llama-server's -np (default N; more NPCs wait)",
    )
    ap.add_argument("--no-remote", action="store_true", help="leave out the openai engine's side")
    ap.add_argument("--quick", action="store_true", help="N = 1 and 4, one round each")
    ap.add_argument(
        "--lore",
        action="store_true",
        help="every NPC's instructions start with the same town lore (~250 tokens): the shared prefix",
    )
    args = ap.parse_args()
    global lore
    lore = args.lore
    if args.quick:
        args.n, args.repeat = "1,4", 1
    ns = [int(x) for x in args.n.split(",")]
    cores = os.cpu_count() or 1
    threads = args.threads or max(1, cores - 1)
    server_tb = args.server_tb or cores

    from bridge.engines.llama import default_model_path

    model = default_model_path()
    binary, version = llama_server_binary()
    print(
        f"model {os.path.basename(model)}; llama-server from llama-cpp-python {version}'s llama.cpp; "
        f"{cores} cores; decode threads {threads} (bridge --llama-threads {threads}, llama-server -t {threads}), "
        f"prompt and multi-NPC batch threads {server_tb} (bridge --llama-batch-threads, llama-server -tb); "
        f"context {args.ctx} per NPC; "
        f"greedy, maxTokens {args.tokens}; llama-server and remote asked for "
        f"{'the bridge NPC by NPC' if args.server_tokens == 'bridge' else 'maxTokens'} tokens (--ignore-eos); "
        f"medians of {args.repeat}{'; every NPC starts with the same town lore (--lore)' if lore else ''}",
        flush=True,
    )

    worktree = None
    llama = ["--engine", "llama", "--llama-ctx", str(args.ctx), "--llama-threads", str(threads)]
    llama += ["--llama-batch-threads", str(server_tb)]
    if args.places:
        llama += ["--llama-parallel", str(args.places)]
        print(f"{args.places} places: the bridge's --llama-parallel, llama-server's -np (at most N)", flush=True)
    bridges = {"bridge": Bridge(llama)}
    try:
        if args.baseline:
            worktree = add_worktree(args.baseline)
            bridges["baseline"] = Bridge(llama, root=worktree)
        for b in bridges.values():
            b.warm("llama")
        rnd = 0
        for n in ns:
            server = LlamaServer(binary, model, min(n, args.places or n), args.ctx, threads, server_tb)
            remote = None if args.no_remote else Bridge(["--engine", "openai", "--openai-url", f"{server.url}/v1"])
            try:
                trio.run(server_warm, server)
                if remote is not None:
                    remote.warm("openai")
                sides = {"bridge": Side("bridge (llama engine)")}
                if "baseline" in bridges:
                    sides["baseline"] = Side(f"bridge @{args.baseline[:12]} (llama)")
                sides["server"] = Side("llama-server direct")
                if remote is not None:
                    sides["remote"] = Side("bridge openai -> llama-server")
                for _ in range(args.repeat):
                    rnd += 1
                    a = bridges["bridge"].round("llama", rnd, [args.tokens] * n)
                    sides["bridge"].rounds.append(a)
                    if "baseline" in bridges:
                        sides["baseline"].rounds.append(bridges["baseline"].round("llama", rnd, [args.tokens] * n))
                    budgets = [max(1, t) for t in a.tokens] if args.server_tokens == "bridge" else [args.tokens] * n
                    # new round numbers: the remote side's prompts must not be in llama-server's slots already
                    sides["server"].rounds.append(trio.run(server_round, server, rnd + 1, budgets))
                    if remote is not None:
                        sides["remote"].rounds.append(remote.round("openai", rnd + 2, budgets, [server.p.pid]))
                    rnd += 2
            finally:
                if remote is not None:
                    remote.close()
                server.close()
            print(
                f"\nN = {n} NPCs at once (seconds; tok/s = all output tokens / wall; out = output tokens, "
                f"in = prompt tokens per NPC; cores = CPU time / wall)"
            )
            print(HEADER)
            for side in sides.values():
                print(side.row())
            report(n, sides, n > 1)
            sys.stdout.flush()
    finally:
        for b in bridges.values():
            b.close()
        if worktree is not None:
            remove_worktree(worktree)


if __name__ == "__main__":
    main()
