"""``oam-bridge``: the process a game starts."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

import trio

from . import __version__
from ._framing import DEFAULT_MAX_LINE_BYTES
from ._server import Limits, Server
from ._stdio import ClaimedStdio, open_streams
from .engines import EngineRegistry
from .engines.scripted import ScriptedEngine


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="oam-bridge", description="NPC brains for any game engine: JSON-RPC 2.0 over stdio.")
    ap.add_argument("--engine", default=os.environ.get("OAM_ENGINE", "auto"), choices=["auto", "scripted", "llama", "native"], help="default engine for npc/create's 'auto' (env OAM_ENGINE)")
    ap.add_argument("--script", help="scripted engine: a JSON file of steps ({\"default\": [...], \"npcs\": {id: [...]}} or a list)")
    ap.add_argument("--model", default=os.environ.get("OAM_LLAMA_MODEL"), help="llama engine: a GGUF file (env OAM_LLAMA_MODEL; default: the bundled SmolLM2)")
    ap.add_argument("--llama-ctx", type=int, default=int(os.environ.get("OAM_LLAMA_CTX", "0")), help="llama engine: context window in tokens (env OAM_LLAMA_CTX; default: the model's, at most 8192)")
    ap.add_argument("--llama-threads", type=int, default=int(os.environ.get("OAM_LLAMA_THREADS", "0")), help="llama engine: threads for generating tokens (env OAM_LLAMA_THREADS; default: all cores but one)")
    ap.add_argument("--llama-verbose", action="store_true", default=os.environ.get("OAM_LLAMA_VERBOSE", "") not in ("", "0"), help="llama engine: let llama.cpp log to stderr (env OAM_LLAMA_VERBOSE=1)")
    ap.add_argument("--max-line-bytes", type=int, default=DEFAULT_MAX_LINE_BYTES)
    ap.add_argument("--stdio", choices=["fd", "threads"], default=os.environ.get("OAM_STDIO", "fd"), help="how stdio is read: non-blocking fds, or reader threads (the Windows path)")
    ap.add_argument("--poll-us", type=int, default=int(os.environ.get("OAM_POLL_US", "200")), help="after input, poll stdin this many microseconds before sleeping (lower latency for bursts of requests; 0 = never poll; env OAM_POLL_US)")
    ap.add_argument("--log-level", default=os.environ.get("OAM_LOG", "warning"))
    ap.add_argument("--version", action="version", version=f"oam-bridge {__version__}")
    return ap.parse_args(argv)


async def _serve(args: argparse.Namespace, stdio: ClaimedStdio) -> None:
    scripted = ScriptedEngine.from_file(args.script) if args.script else ScriptedEngine()
    llama_kwargs: dict[str, object] = {"verbose": args.llama_verbose}
    if args.model:
        llama_kwargs["model_path"] = args.model
    if args.llama_ctx:
        llama_kwargs["n_ctx"] = args.llama_ctx
    if args.llama_threads:
        llama_kwargs["n_threads"] = args.llama_threads
    registry = EngineRegistry(default=args.engine, scripted=scripted, llama=llama_kwargs)
    server = Server(registry, Limits(max_line_bytes=args.max_line_bytes))
    recv, send = open_streams(stdio, threads=args.stdio == "threads", poll_us=args.poll_us)

    async def on_signals() -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async for _ in signals:
                logging.getLogger("oam_bridge").info("signal: exiting")
                server.stop()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(on_signals)
        await server.serve(recv, send, out_fd=getattr(send, "fileno", lambda: None)(), preload=True)
        nursery.cancel_scope.cancel()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(), format="oam-bridge %(levelname)s %(name)s: %(message)s")
    stdio = ClaimedStdio()
    trio.run(_serve, args, stdio)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
