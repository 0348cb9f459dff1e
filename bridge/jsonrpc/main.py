"""``oam-bridge``: the process a game starts."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys

import trio

from bridge._version import __version__
from bridge.core._messages import Limits
from bridge.hosts._common import add_engine_arguments, build_registry, leave, lower_priority
from bridge.hosts._log import configure as configure_log
from bridge.hosts._stdio import ClaimedStdio, open_streams
from bridge.jsonrpc._framing import DEFAULT_MAX_LINE_BYTES
from bridge.jsonrpc._record import Recorder, recording_header
from bridge.jsonrpc._server import Server

log = logging.getLogger("oam_bridge")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="oam-bridge", description="NPC brains for any game engine: JSON-RPC 2.0 over stdio."
    )
    add_engine_arguments(ap)
    ap.add_argument("--max-line-bytes", type=int, default=DEFAULT_MAX_LINE_BYTES, help="longest input line accepted")
    ap.add_argument(
        "--max-npcs", type=int, default=Limits().max_npcs, help="NPCs at most (then npc/create gets limit_reached)"
    )
    ap.add_argument(
        "--max-pending-lines",
        type=int,
        default=Limits().max_pending_lines,
        help="lines read but not processed before requests get overloaded",
    )
    ap.add_argument(
        "--max-outbound-bytes",
        type=int,
        default=Limits().max_outbound_bytes,
        help="output bytes the game has not read before turns wait",
    )
    ap.add_argument(
        "--exit-grace-ms",
        type=int,
        default=Limits().exit_grace_ms,
        help="on stdin EOF, exit or a signal, the process is gone within this",
    )
    ap.add_argument(
        "--stdio",
        choices=["fd", "threads"],
        default=os.environ.get("OAM_STDIO", "fd"),
        help="how stdio is read: non-blocking fds, or reader threads (the Windows path)",
    )
    ap.add_argument(
        "--poll-us",
        type=int,
        default=int(os.environ.get("OAM_POLL_US", "200")),
        help=(
            "after input, poll stdin this many microseconds before sleeping (lower latency for bursts of requests; 0 "
            "= never poll; env OAM_POLL_US)"
        ),
    )
    ap.add_argument(
        "--parent-watch-ms",
        type=int,
        default=int(os.environ.get("OAM_PARENT_WATCH_MS", "200")),
        help=(
            "check this often that the process that started the bridge (the game) is alive, and exit when it is gone "
            "(0 = never; env OAM_PARENT_WATCH_MS)"
        ),
    )
    ap.add_argument("--log-level", default=os.environ.get("OAM_LOG", "warning"))
    ap.add_argument(
        "--record",
        metavar="FILE",
        default=os.environ.get("OAM_RECORD") or None,
        help=(
            "record the session (every line in and out, the engine options) to FILE, a JSONL file python -m "
            "bridge.hosts.replay plays back (env OAM_RECORD)"
        ),
    )
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
                    leave(0)
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
    """``--record``'s recorder. A file that cannot be written never ends the process: the
    recorder says so in one line on stderr and the bridge serves without recording
    (``bridge/jsonrpc/_record.py``); only a ``--script`` that cannot be re-read for the
    header ends it here (exit status 2)."""
    if not args.record:
        return None
    try:
        return Recorder(args.record, recording_header(args.argv, vars(args)))
    except OSError as e:
        print(f"oam-bridge: --record {args.record}: cannot write it: {e.strerror or e}", file=sys.stderr)
        leave(2)
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


def main(argv: list[str] | None = None) -> int:
    parent = os.getppid()  # before anything else: see _watch_parent
    args = parse_args(argv)
    lower_priority(args.priority)  # before any thread starts: they inherit it
    args.parent = parent
    args.argv = sys.argv[1:] if argv is None else argv
    configure_log(args.log_level)  # one line per record: what a message carries is escaped
    stdio = ClaimedStdio()
    trio.run(_serve, args, stdio)
    leave(0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
