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
from ._messages import Limits
from ._record import Recorder, recording_header
from ._server import Server
from ._stdio import ClaimedStdio, open_streams
from .engines import EngineRegistry
from .engines.scripted import ScriptedEngine
from .errors import BridgeError

log = logging.getLogger("oam_bridge")


def add_engine_arguments(ap: argparse.ArgumentParser) -> None:
    """The engine options (``--engine``, ``--script``, ``--model``, ``--llama-*``,
    ``--openai-*``), shared by every host: the bridge, ``oam`` and its server."""
    ap.add_argument("--engine", default=os.environ.get("OAM_ENGINE", "auto"), choices=["auto", "scripted", "llama", "native", "openai"], help="default engine for npc/create's 'auto' (env OAM_ENGINE)")
    ap.add_argument("--script", help="scripted engine: a JSON file of steps ({\"default\": [...], \"npcs\": {id: [...]}} or a list)")
    ap.add_argument("--model", default=os.environ.get("OAM_LLAMA_MODEL"), help="llama engine: a GGUF file (env OAM_LLAMA_MODEL; default: the bundled SmolLM2)")
    ap.add_argument("--llama-ctx", type=int, default=int(os.environ.get("OAM_LLAMA_CTX", "0")), help="llama engine: context window in tokens (env OAM_LLAMA_CTX; default: the model's, at most 8192)")
    ap.add_argument("--llama-threads", type=int, default=int(os.environ.get("OAM_LLAMA_THREADS", "0")), help="llama engine: threads for generating tokens (env OAM_LLAMA_THREADS; default: all cores but one)")
    ap.add_argument("--llama-parallel", type=int, default=int(os.environ.get("OAM_LLAMA_PARALLEL", "0")), help="llama engine: NPCs whose steps decode together in one batch; more wait for a place (env OAM_LLAMA_PARALLEL; default 8)")
    ap.add_argument("--llama-verbose", action="store_true", default=os.environ.get("OAM_LLAMA_VERBOSE", "") not in ("", "0"), help="llama engine: let llama.cpp log to stderr (env OAM_LLAMA_VERBOSE=1)")
    ap.add_argument("--openai-url", default=os.environ.get("OAM_OPENAI_URL"), help="openai engine: an OpenAI-compatible server, e.g. http://127.0.0.1:8080/v1 (env OAM_OPENAI_URL; without it the engine is unavailable)")
    ap.add_argument("--openai-model", default=os.environ.get("OAM_OPENAI_MODEL"), help="openai engine: the model name to ask for (env OAM_OPENAI_MODEL; default: the first the server lists)")
    ap.add_argument("--openai-api-key", default=os.environ.get("OAM_OPENAI_API_KEY"), help="openai engine: sent as a bearer token (env OAM_OPENAI_API_KEY, which keeps it out of the process list)")
    ap.add_argument("--openai-timeout", type=float, default=float(os.environ.get("OAM_OPENAI_TIMEOUT", "60")), help="openai engine: seconds without a byte from the server before a step fails generation_failed (env OAM_OPENAI_TIMEOUT; default 60)")
    ap.add_argument("--openai-connect-timeout", type=float, default=float(os.environ.get("OAM_OPENAI_CONNECT_TIMEOUT", "5")), help="openai engine: seconds to connect before a step fails model_unavailable (env OAM_OPENAI_CONNECT_TIMEOUT; default 5)")
    ap.add_argument("--openai-ctx", type=int, default=int(os.environ.get("OAM_OPENAI_CTX", "4096")), help="openai engine: the server's context window in tokens, for trimming (env OAM_OPENAI_CTX; default 4096)")
    ap.add_argument("--openai-grammar", action="store_true", default=os.environ.get("OAM_OPENAI_GRAMMAR", "") not in ("", "0"), help="openai engine: constrain each step with the llama engine's GBNF in the request's 'grammar' field (llama-server, llama_cpp.server) instead of sending 'tools' and 'response_format': tool calls among several tools, free text and schema answers on servers that do not constrain a choice of tools (env OAM_OPENAI_GRAMMAR=1)")


def build_registry(args: argparse.Namespace) -> EngineRegistry:
    """The engines ``add_engine_arguments``' options describe. A bad ``--script`` ends the
    process with one clear line on stderr (exit status 2)."""
    scripted = _scripted_engine(args.script)
    llama_kwargs: dict[str, object] = {"verbose": args.llama_verbose}
    if args.model:
        llama_kwargs["model_path"] = args.model
    if args.llama_ctx:
        llama_kwargs["n_ctx"] = args.llama_ctx
    if args.llama_threads:
        llama_kwargs["n_threads"] = args.llama_threads
    if args.llama_parallel:
        llama_kwargs["n_parallel"] = args.llama_parallel
    openai_kwargs: dict[str, object] = {
        "url": args.openai_url, "model": args.openai_model, "api_key": args.openai_api_key,
        "timeout_s": args.openai_timeout, "connect_timeout_s": args.openai_connect_timeout, "n_ctx": args.openai_ctx,
        "grammar": args.openai_grammar,
    }
    registry = EngineRegistry(default=args.engine, scripted=scripted, llama=llama_kwargs, openai=openai_kwargs)
    if args.model:  # a file the operator chose: a wrong one is said now, not at the first create
        llama = next(e for e in registry.infos() if e.name == "llama")
        if not llama.available:
            log.warning("the llama engine is unavailable: %s", llama.reason)
    return registry


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="oam-bridge", description="NPC brains for any game engine: JSON-RPC 2.0 over stdio.")
    add_engine_arguments(ap)
    ap.add_argument("--max-line-bytes", type=int, default=DEFAULT_MAX_LINE_BYTES, help="longest input line accepted")
    ap.add_argument("--max-npcs", type=int, default=Limits().max_npcs, help="NPCs at most (then npc/create gets limit_reached)")
    ap.add_argument("--max-pending-lines", type=int, default=Limits().max_pending_lines, help="lines read but not processed before requests get overloaded")
    ap.add_argument("--max-outbound-bytes", type=int, default=Limits().max_outbound_bytes, help="output bytes the game has not read before turns wait")
    ap.add_argument("--exit-grace-ms", type=int, default=Limits().exit_grace_ms, help="on stdin EOF, exit or a signal, the process is gone within this")
    ap.add_argument("--stdio", choices=["fd", "threads"], default=os.environ.get("OAM_STDIO", "fd"), help="how stdio is read: non-blocking fds, or reader threads (the Windows path)")
    ap.add_argument("--poll-us", type=int, default=int(os.environ.get("OAM_POLL_US", "200")), help="after input, poll stdin this many microseconds before sleeping (lower latency for bursts of requests; 0 = never poll; env OAM_POLL_US)")
    ap.add_argument("--parent-watch-ms", type=int, default=int(os.environ.get("OAM_PARENT_WATCH_MS", "200")), help="check this often that the process that started the bridge (the game) is alive, and exit when it is gone (0 = never; env OAM_PARENT_WATCH_MS)")
    ap.add_argument("--log-level", default=os.environ.get("OAM_LOG", "warning"))
    ap.add_argument("--record", metavar="FILE", default=os.environ.get("OAM_RECORD") or None, help="record the session (every line in and out, the engine options) to FILE, a JSONL file python -m bridge._replay plays back (env OAM_RECORD)")
    ap.add_argument("--version", action="version", version=f"oam-bridge {__version__}")
    return ap.parse_args(argv)


async def _serve(args: argparse.Namespace, stdio: ClaimedStdio) -> None:
    limits = Limits(
        max_line_bytes=args.max_line_bytes,
        max_npcs=args.max_npcs,
        max_pending_lines=args.max_pending_lines,
        max_outbound_bytes=args.max_outbound_bytes,
        exit_grace_ms=args.exit_grace_ms,
    )
    registry = build_registry(args)
    recorder = _open_recorder(args)
    server = Server(registry, limits, recorder=recorder)
    recv, send = open_streams(stdio, threads=args.stdio == "threads", poll_us=args.poll_us)

    async def on_signals(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            task_status.started()
            async for signum in signals:
                if server.state == "closed":  # a second signal: leave at once
                    log.warning("second signal: exiting now")
                    if recorder is not None:
                        recorder.close()
                    _leave(0)
                log.info("signal: exiting")
                if recorder is not None:
                    recorder.note(signal=int(signum))
                server.stop()

    async with trio.open_nursery() as nursery:
        # The handler is in place before the first line is read, so a signal sent after the
        # game saw any answer is never lost to the default action.
        await nursery.start(on_signals)
        if args.parent_watch_ms > 0:
            nursery.start_soon(_watch_parent, server, args.parent, args.parent_watch_ms / 1000)
        try:
            await server.serve(recv, send, out_fd=getattr(send, "fileno", lambda: None)(), preload=True)
        finally:
            if recorder is not None:  # every line written, then the trailer, before the exit
                recorder.close()
        nursery.cancel_scope.cancel()


def _open_recorder(args: argparse.Namespace) -> Recorder | None:
    """``--record``'s recorder; a file that cannot be written ends the process with one line
    on stderr (exit status 2)."""
    if not args.record:
        return None
    try:
        return Recorder(args.record, recording_header(args.argv, vars(args)))
    except OSError as e:
        print(f"oam-bridge: --record {args.record}: cannot write it: {e.strerror or e}", file=sys.stderr)
        _leave(2)
        raise AssertionError("unreachable") from None


async def _watch_parent(server: Server, parent: int, every_s: float) -> None:
    """Exit when the game is gone, even if its end did not close our stdin (a child of the
    game that inherited the pipe keeps it open): the parent process id changes when the
    parent dies (the bridge is re-parented to init or a subreaper). Linux's parent-death
    signal is not used: it fires when the *thread* that started the bridge ends, and engines
    start processes from worker threads that come and go. ``parent`` is the parent's id as
    ``main`` found it first thing: a game may well write ``initialize``, read the answer and
    die before this task first runs."""
    if parent <= 1:
        return  # started by init (a container's entry point): nothing to watch
    # (On Windows a dead parent's id stays: there the game's end closes stdin, which ends us.)
    while True:
        await trio.sleep(every_s)
        if os.getppid() != parent:
            log.warning("the process that started the bridge (pid %d) is gone: exiting", parent)
            if server.recorder is not None:
                server.recorder.note(parentGone=True)
            server.stop()
            return


def _scripted_engine(path: str | None) -> ScriptedEngine:
    """The scripted engine, with ``--script``'s steps; a bad file ends the process with one
    clear line on stderr (exit status 2), not a traceback."""
    if path is None:
        return ScriptedEngine()
    try:
        return ScriptedEngine.from_file(path)
    except OSError as e:
        problem = f"cannot read it: {e.strerror or e}"
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        problem = f"not valid JSON: {e}"
    except RecursionError:
        problem = "not valid JSON: nested too deeply"
    except BridgeError as e:
        problem = e.message
    print(f"oam-bridge: --script {path}: {problem}", file=sys.stderr)
    _leave(2)
    raise AssertionError("unreachable")


def _leave(status: int) -> None:
    """Exit now: a model thread still generating must not hold the process past the grace
    period (serve() already wrote what could be written)."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(status)


def main(argv: list[str] | None = None) -> int:
    parent = os.getppid()  # before anything else: see _watch_parent
    args = parse_args(argv)
    args.parent = parent
    args.argv = sys.argv[1:] if argv is None else argv
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(), format="oam-bridge %(levelname)s %(name)s: %(message)s")
    stdio = ClaimedStdio()
    trio.run(_serve, args, stdio)
    _leave(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
