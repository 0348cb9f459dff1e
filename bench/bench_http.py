"""``oam serve`` beside ``llama_cpp.server`` (llama-cpp-python's own OpenAI-compatible
server): the same bundled SmolLM2 model, one generating thread each, the same streamed chat
completion (a system line and a player line, temperature 0, seed 1, ``max_tokens`` 48),
requests to the two servers interleaved, median of ``--runs`` (default 7) after a warm-up
request each.

- time to first token: from sending the request to the first non-empty ``content`` delta;
- decode tokens per second: tokens after the first / (last delta - first delta). Each
  server's own count: ``oam serve``'s ``usage`` (``stream_options.include_usage``: the tokens
  the engine generated), llama_cpp.server's streamed text tokenized with the model's
  vocabulary (it sends no usage when streaming; its text is every token it generated).

Both servers run at once on loopback ports; only one request is in flight at a time.

Usage: python bench/bench_http.py [--runs 7]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics as st
import subprocess
import sys
import time
import urllib.request
from typing import Any

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import httpx  # noqa: E402

from bridge.engines.llama._cpu import llama_cpp_server_command  # noqa: E402

SYSTEM = "You are Brann, the gate guard of Eldmoor. You are gruff but fair. Answer in one sentence."
PROMPT = "Good evening, guard. May I enter the town?"
MAX_TOKENS = 48


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{url}: the server exited ({proc.returncode})")
        try:
            with urllib.request.urlopen(f"{url}/models", timeout=2):
                return
        except OSError:
            time.sleep(0.2)
    proc.kill()
    raise SystemExit(f"{url}: the server did not start")


def start_llama_cpp_server(model: str) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        [
            *llama_cpp_server_command(),
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--n_threads",
            "1",
            "--n_ctx",
            "8192",
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
    wait_ready(url, proc)
    return proc, url


def start_oam_serve() -> tuple[subprocess.Popen[bytes], str]:
    code = "import sys; from bridge.hosts.http.app import main; sys.exit(main(sys.argv[1:]))"
    proc = subprocess.Popen(
        [sys.executable, "-c", code, "--engine", "llama", "--llama-threads", "1", "--port", "0"],
        cwd=ROOT,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert proc.stderr is not None
    seen = ""
    found = None
    while found is None:
        line = proc.stderr.readline().decode()
        if not line:
            proc.kill()
            raise SystemExit(f"oam serve did not start: {seen}")
        seen += line
        found = re.search(r"listening on (http://\S+)", line)
    url = found.group(1) + "/v1"
    wait_ready(url, proc)
    return proc, url


def one(client: httpx.Client, url: str, model: str, count: Any) -> tuple[float, float, int]:
    """(time to first token, decode tokens/s, tokens) of one streamed completion."""
    body = {
        "model": model,
        "stream": True,
        "temperature": 0,
        "seed": 1,
        "max_tokens": MAX_TOKENS,
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": PROMPT}],
    }
    if model == "llama":
        body["stream_options"] = {"include_usage": True}
    text, first, last, usage = "", 0.0, 0.0, None
    t0 = time.perf_counter()
    with client.stream("POST", f"{url}/chat/completions", json=body) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            delta = chunk["choices"][0]["delta"].get("content") if chunk.get("choices") else None
            if delta:
                now = time.perf_counter()
                first = first or now
                last = now
                text += delta
    tokens = usage if usage is not None else count(text)
    rate = (tokens - 1) / (last - first) if last > first and tokens > 1 else float("nan")
    return first - t0, rate, tokens


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=7)
    args = ap.parse_args()
    from llama_cpp import Llama

    from bridge.engines.llama import default_model_path
    from bridge.engines.llama._cpu import load_backends

    model = default_model_path()
    load_backends()  # the portable build's CPU backend: llama.cpp loads no model without one
    vocab = Llama(model_path=model, vocab_only=True, verbose=False)

    def count(text: str) -> int:
        return len(vocab.tokenize(text.encode(), add_bos=False, special=False))

    servers = {}
    procs = []
    try:
        p, u = start_llama_cpp_server(model)
        procs.append(p)
        servers["llama_cpp.server"] = (u, "smollm2")
        p, u = start_oam_serve()
        procs.append(p)
        servers["oam serve"] = (u, "llama")
        results: dict[str, list[tuple[float, float, int]]] = {k: [] for k in servers}
        with httpx.Client(timeout=120) as client:
            for _name, (url, model_name) in servers.items():
                one(client, url, model_name, count)  # warm-up: the model loaded, caches filled
            for _ in range(args.runs):
                for name, (url, model_name) in servers.items():
                    results[name].append(one(client, url, model_name, count))
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
    print(f"streamed chat completion, bundled SmolLM2, 1 thread, max_tokens {MAX_TOKENS}, median of {args.runs}")
    print(f"{'server':<18} {'first token ms':>15} {'decode tok/s':>13} {'tokens':>7}")
    med = {}
    for name, rows in results.items():
        ttft = st.median(r[0] for r in rows) * 1000
        rate = st.median(r[1] for r in rows)
        toks = st.median(r[2] for r in rows)
        med[name] = (ttft, rate)
        print(f"{name:<18} {ttft:>15.1f} {rate:>13.1f} {toks:>7.0f}")
    base, ours = med["llama_cpp.server"], med["oam serve"]
    print(
        f"oam serve / llama_cpp.server: first token {ours[0] / base[0]:.2f}x ({ours[0] - base[0]:+.1f} ms), "
        f"decode {ours[1] / base[1]:.2f}x"
    )


if __name__ == "__main__":
    main()
