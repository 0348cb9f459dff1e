"""The openai engine's added time to first token over calling the server directly.

One OpenAI-compatible server (by default ``llama_cpp.server`` on the bundled SmolLM2, started
here on a free loopback port with ``--n_threads 1``; or ``--url`` for one already running),
the same request each time (system line + player line, greedy, 16 tokens), median of
``--runs`` (10), the three ways interleaved so the server's prompt cache treats them alike:

- direct: an HTTP client POSTs the request (``stream: true``) and reads the SSE stream:
  time from sending to the first non-empty ``content`` delta;
- engine: ``OpenAIEngine.stream_step`` in this process, the same request built by the
  engine: time to its first ``TextChunk``;
- bridge: the real ``oam-bridge --engine openai`` subprocess: time from writing
  ``npc/respond`` to reading its first ``turn/textDelta`` (the NPC is reset before each turn,
  so the prompt is the same every time).

Usage: python bench/bench_remote.py [--runs 10] [--url http://127.0.0.1:8080/v1]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics as st
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import httpx  # noqa: E402
import trio  # noqa: E402

from bridge.engines.base import GenerationOptions, Message, StepRequest, TextChunk  # noqa: E402
from bridge.engines.llama._cpu import llama_cpp_server_command  # noqa: E402
from bridge.engines.openai import OpenAIEngine  # noqa: E402

INSTRUCTIONS = "You are Brann, the gate guard of Eldmoor. You are gruff but fair. Answer in one sentence."
PROMPT = "Good evening, guard. May I enter the town?"
OPTIONS = {"temperature": 0, "maxTokens": 16, "seed": 1}


def start_server() -> tuple[subprocess.Popen[bytes], str]:
    from bridge.engines.llama import default_model_path

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [
            *llama_cpp_server_command(),
            "--model",
            default_model_path(),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_threads",
            "1",
            "--interrupt_requests",
            "False",
            "--verbose",
            "False",
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2):
                return proc, url
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit("llama_cpp.server did not start")


class Bridge:
    def __init__(self, url: str) -> None:
        self.p = subprocess.Popen(
            [sys.executable, "-m", "bridge", "--engine", "openai", "--openai-url", url],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=ROOT,
            bufsize=0,
        )
        self.ids = 0
        self.call("initialize", {"protocolVersion": 1})
        self.call(
            "npc/create", {"npcId": "guard", "engine": "openai", "instructions": INSTRUCTIONS, "options": OPTIONS}
        )

    def send(self, method: str, params: dict[str, object]) -> int:
        assert self.p.stdin is not None
        self.ids += 1
        self.p.stdin.write(
            json.dumps({"jsonrpc": "2.0", "id": self.ids, "method": method, "params": params}).encode() + b"\n"
        )
        return self.ids

    def line(self) -> dict[str, object]:
        assert self.p.stdout is not None
        return json.loads(self.p.stdout.readline())  # type: ignore[no-any-return]

    def call(self, method: str, params: dict[str, object]) -> object:
        i = self.send(method, params)
        while True:
            msg = self.line()
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                return msg["result"]

    def ttft(self) -> float:
        self.call("npc/reset", {"npcId": "guard"})
        t0 = time.perf_counter()
        self.send("npc/respond", {"npcId": "guard", "prompt": PROMPT})
        first = None
        while True:
            msg = self.line()
            if msg.get("method") == "turn/textDelta" and first is None:
                first = time.perf_counter() - t0
            if msg.get("method") in ("turn/completed", "turn/failed"):
                if msg["method"] == "turn/failed" or first is None:
                    raise RuntimeError(msg)
                return first

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(10)


def step_request() -> StepRequest:
    return StepRequest(
        npc_id="guard",
        instructions=INSTRUCTIONS,
        messages=[Message(role="user", content=PROMPT)],
        tools=[],
        tool_mode="disallowed",
        schema=None,
        options=GenerationOptions(temperature=0, max_tokens=16, seed=1),
        step_index=0,
    )


async def direct_ttft(client: httpx.AsyncClient, url: str, body: dict[str, object]) -> float:
    """Read to the end, as the engine does: a stream left early keeps the server generating
    into the next measurement."""
    t0 = time.perf_counter()
    first = None
    async with client.stream("POST", f"{url}/chat/completions", json=body) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data:") and line[5:].strip() != "[DONE]":
                for choice in json.loads(line[5:]).get("choices") or []:
                    if (choice.get("delta") or {}).get("content") and first is None:
                        first = time.perf_counter() - t0
    if first is None:
        raise RuntimeError("no content")
    return first


async def engine_ttft(engine: OpenAIEngine, request: StepRequest) -> float:
    t0 = time.perf_counter()
    first = None
    async for chunk in engine.stream_step(request):  # read to the end: the step's whole cost
        if isinstance(chunk, TextChunk) and first is None:
            first = time.perf_counter() - t0
    assert first is not None
    return first


async def main(args: argparse.Namespace) -> None:
    server = None
    url = args.url
    if url is None:
        server, url = start_server()
    try:
        engine = OpenAIEngine(url=url)
        request = step_request()
        model = await engine._model()
        body = engine.body(request, model)  # the very request the engine sends
        bridge = await trio.to_thread.run_sync(Bridge, url)
        direct: list[float] = []
        via_engine: list[float] = []
        via_bridge: list[float] = []
        async with httpx.AsyncClient(timeout=60) as client:
            for _ in range(2):  # warm-up: the server's first request loads its caches
                await direct_ttft(client, url, body)
            for _ in range(args.runs):
                direct.append(await direct_ttft(client, url, body))
                via_engine.append(await engine_ttft(engine, request))
                via_bridge.append(await trio.to_thread.run_sync(bridge.ttft))
        await trio.to_thread.run_sync(bridge.close)
        await engine.aclose()
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
    d, e, b = (st.median(x) * 1000 for x in (direct, via_engine, via_bridge))
    print(
        f"server: {url if args.url else 'llama_cpp.server, bundled SmolLM2, --n_threads 1'}; median of {args.runs}; "
        f"same request (system + player line, greedy, 16 tokens)"
    )
    print(f"{'path':<34}{'TTFT ms':>10}{'added ms':>10}")
    print(f"{'direct HTTP (httpx, SSE)':<34}{d:>10.1f}{'':>10}")
    print(f"{'openai engine (stream_step)':<34}{e:>10.1f}{e - d:>+10.1f}")
    print(f"{'oam-bridge subprocess (JSON-RPC)':<34}{b:>10.1f}{b - d:>+10.1f}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--url")
    trio.run(main, ap.parse_args())
