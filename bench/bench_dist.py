"""The self-contained build (`make dist`) beside the venv bridge, same run:

1. the size of dist/oam-bridge/ (files, symlinks not counted twice), and the shares of the
   model, llama.cpp's libraries, libOamNative with the Swift runtime, Python and numpy;
2. start-up: spawn -> `initialize` answered, median of N (default 10) runs, of the built
   binary (clean environment: PATH=/usr/bin:/bin only) and of `.venv/bin/oam-bridge`, each
   with `--engine scripted` and `--engine llama`, interleaved, from a temporary directory. The
   llama engine starts loading its model at start-up, in a thread: the second column is
   spawn -> the first `npc/create` answered, which waits for that load.

Usage: python bench/bench_dist.py [--runs N]   (builds nothing: run `make dist` first)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "dist" / "oam-bridge"
FROZEN = DIST / "oam-bridge"
VENV = ROOT / ".venv" / "bin" / "oam-bridge"
CLEAN_ENV = {"PATH": "/usr/bin:/bin"}
SWIFT = ("libswift", "libFoundation", "lib_FoundationICU", "libdispatch", "libBlocksRuntime", "libOamNative")


def size(paths: list[Path]) -> int:
    return sum(p.stat().st_size for p in paths if p.is_file() and not p.is_symlink())


def sizes() -> list[tuple[str, int]]:
    internal = DIST / "_internal"
    every = [p for p in DIST.rglob("*") if p.is_file() and not p.is_symlink()]
    groups: dict[str, list[Path]] = {
        "model (models/)": [p for p in every if internal / "models" in p.parents],
        "llama.cpp libraries (llama_cpp/lib)": [p for p in every if internal / "llama_cpp" / "lib" in p.parents],
        "libOamNative + Swift runtime": [p for p in every if p.parent == internal and p.name.startswith(SWIFT)],
        "Python (libpython, stdlib, executable)": [
            p
            for p in every
            if p.name.startswith("libpython")
            or p == FROZEN
            or internal / "python3.11" in p.parents
            or p.name == "base_library.zip"
        ],
        "numpy (+ OpenBLAS), needed by llama_cpp": [
            p for p in every if internal / "numpy" in p.parents or internal / "numpy.libs" in p.parents
        ],
    }
    counted = {p for ps in groups.values() for p in ps}
    rows = [(k, size(v)) for k, v in groups.items()]
    rows.append(("everything else (trio, msgspec, jsonschema, ...)", size([p for p in every if p not in counted])))
    return [("total", size(every)), *rows]


def start_once(cmd: list[str], env: dict[str, str], cwd: str, create: bool) -> tuple[float, float | None]:
    """Seconds from spawn to `initialize` answered, and to the first `npc/create` answered."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, cwd=cwd
    )
    assert p.stdin and p.stdout

    def call(id_: int, method: str, params: dict[str, object]) -> dict[str, object]:
        assert p.stdin and p.stdout
        p.stdin.write(json.dumps({"jsonrpc": "2.0", "id": id_, "method": method, "params": params}).encode() + b"\n")
        p.stdin.flush()
        while True:
            line = p.stdout.readline()
            if not line:
                raise RuntimeError(f"{cmd[0]} closed stdout before answering {method}")
            msg = json.loads(line)
            if msg.get("id") == id_:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return dict(msg)

    try:
        call(1, "initialize", {"protocolVersion": 1})
        t_init = time.perf_counter() - t0
        t_create = None
        if create:
            call(2, "npc/create", {"npcId": "a"})
            t_create = time.perf_counter() - t0
        p.stdin.close()
        p.wait(timeout=30)
        return t_init, t_create
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    if not FROZEN.exists():
        print("dist/oam-bridge/oam-bridge is missing: run `make dist` first", file=sys.stderr)
        return 1

    print(
        f"## dist/oam-bridge/ "
        f"({', '.join(p.name for p in sorted((DIST / '_internal' / 'models').glob('*'))) or 'no model'})\n"
    )
    rows = sizes()
    total = rows[0][1]
    print("| part | MiB | share |\n|---|---:|---:|")
    for name, n in rows:
        print(f"| {name} | {n / 2**20:.1f} | {100 * n / total:.0f}% |")

    venv_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    targets = [
        ("dist, scripted", [str(FROZEN), "--engine", "scripted"], CLEAN_ENV, False),
        ("venv, scripted", [str(VENV), "--engine", "scripted"], venv_env, False),
        ("dist, llama", [str(FROZEN), "--engine", "llama"], CLEAN_ENV, True),
        ("venv, llama", [str(VENV), "--engine", "llama"], venv_env, True),
    ]
    times: dict[str, list[tuple[float, float | None]]] = {t[0]: [] for t in targets}
    with tempfile.TemporaryDirectory() as cwd:
        for _name, cmd, env, create in targets:  # one unmeasured run each: warm the page cache
            start_once(cmd, env, cwd, create)
        for _ in range(args.runs):  # interleaved, so drift on a shared machine hits all alike
            for name, cmd, env, create in targets:
                times[name].append(start_once(cmd, env, cwd, create))

    print(f"\n## start-up, median of {args.runs} (min-max), ms\n")
    print(
        "| bridge | spawn -> initialize answered | spawn -> first npc/create answered (model loaded) |\n|---|---:|---:|"
    )
    for name, _, _, create in targets:
        init = [t[0] * 1000 for t in times[name]]
        cell = f"{statistics.median(init):.0f} ({min(init):.0f}-{max(init):.0f})"
        if create:
            made = [t[1] * 1000 for t in times[name] if t[1] is not None]
            made_cell = f"{statistics.median(made):.0f} ({min(made):.0f}-{max(made):.0f})"
        else:
            made_cell = "-"
        print(f"| {name} | {cell} | {made_cell} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
