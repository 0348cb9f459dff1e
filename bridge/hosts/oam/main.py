"""``oam``: NPC brains from the command line, on the in-process service (``bridge.Service``).

Subcommands: ``respond`` (one turn, streamed to stdout), ``chat`` (an interactive session
with one NPC), ``count-tokens``, ``schema`` (check a JSON Schema the way the bridge does),
``models`` (the model catalog: list, pull, rm, path; ``_models``), and
``serve`` / ``replay``, which hand the rest of the command line to the OpenAI-compatible server
(``bridge.hosts.http.app``) and to session record/replay (``bridge.hosts.replay``).

stdout carries the NPC's words only (or a schema turn's JSON answer): fd 1 is claimed at
start-up as the bridge claims it (``ClaimedStdio``), so anything else that prints, llama.cpp
included, lands on stderr, and ``oam respond ... | other`` pipes clean text. Tool prompts,
notes and errors go to stderr. An error is one line, ``oam: <code>: <message>``, and the exit
status is ``EXIT_CODES[code]`` (``bridge/errors.py``; the table is in README.md).

Nothing slow runs on the trio loop: text is written to stdout by a worker thread (so a slow
reader of the pipe slows the turn down, bounded, instead of stalling the loop), the person is
prompted in a worker thread (prompt_toolkit runs its own event loop there), tool commands
run as subprocesses, and engines start in worker threads (``Service``).

Layout: ``_io`` is the terminal's side (``TextOut``, ``Prompter``, ``ToolAnswerer``),
``_session`` one NPC on the service (``Session``) and the files and options the command line
names; here, the subcommands, the parser and ``main``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import sys
import textwrap
from collections.abc import Callable
from typing import Any

import msgspec
import trio

from bridge._version import __version__
from bridge.core import _messages as m
from bridge.core._service import Service
from bridge.core.agent import check_schema
from bridge.errors import EXIT_CODES, BridgeError
from bridge.hosts._common import add_engine_arguments, build_registry, lower_priority
from bridge.hosts._log import configure as configure_log
from bridge.hosts._stdio import ClaimedStdio
from bridge.hosts.oam._io import Prompter, TextOut, say
from bridge.hosts.oam._models import add_parser as add_models_parser
from bridge.hosts.oam._models import run as run_models
from bridge.hosts.oam._session import (
    Interrupted,
    Session,
    UsageError,
    open_npc,
    read_json_file,
    read_save,
    respond_params,
    write_save,
)

# The hosts other modules provide: ``oam NAME ARGS...`` calls ``module.main(ARGS)``.
DELEGATED: dict[str, tuple[str, str]] = {
    "serve": ("bridge.hosts.http.app", "an OpenAI-compatible HTTP server on the same NPC brains"),
    "replay": ("bridge.hosts.replay", "record and replay sessions"),
}

EXIT_USAGE = 2  # argparse's own, and a file named on the command line that cannot be used
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away, as shells report it


def _error_line(code: str, message: str) -> str:
    return f"oam: {code}: {message}"


def _read_prompt(given: str | None) -> str:
    if given is not None and given != "-":
        return given
    if sys.stdin.isatty():
        raise UsageError('no prompt: give one (oam respond "Hello") or pipe it on stdin')
    return sys.stdin.read().strip()


# ---- subcommands ----


async def cmd_respond(args: argparse.Namespace, stdio: ClaimedStdio) -> int:
    prompt = _read_prompt(args.prompt)
    schema = read_json_file(args.schema, "--schema") if args.schema else None
    if schema is not None and not isinstance(schema, dict):
        raise BridgeError("invalid_schema", f"--schema {args.schema}: a JSON Schema object is expected")
    ask = args.tools and args.tool_command is None and sys.stdin.isatty() and not args.no_prompt
    prompter = Prompter() if ask else None
    out = TextOut(stdio.out_fd)
    async with open_npc(args, out, prompter) as session:
        session.tools.quiet = not args.verbose
        try:
            done = await session.turn(respond_params(args, args.npc_id, prompt, schema), show_text=schema is None)
        except BridgeError:
            await out.end_line()  # the words shown before the failure end their line
            await out.flush()
            raise
        if schema is not None:
            await out.write(json.dumps(done.json, ensure_ascii=False) + "\n")
        else:
            await out.end_line()
        await out.flush()
        for w in done.warnings:
            say(f"oam: warning: {w}")
        if args.save:
            write_save(args.save, session.svc.transcript(m.NpcRef(npc_id=args.npc_id)))
    return 0


CHAT_HELP = """\
Commands:
  /save FILE   save the transcript (npc/transcript's format)
  /load FILE   load a saved transcript (it replaces this one)
  /reset       forget the conversation
  /history     show the conversation
  /help        this list
  /quit        leave (or Ctrl-D)
Ctrl-C cancels the NPC's turn; at the prompt it clears the line."""


async def cmd_chat(args: argparse.Namespace, stdio: ClaimedStdio) -> int:
    if not sys.stdin.isatty():
        raise UsageError("chat needs a terminal; use oam respond in pipelines")
    prompter = Prompter(args.history)
    out = TextOut(stdio.out_fd)
    async with open_npc(args, out, prompter) as session:
        engine = session.svc.npc(args.npc_id).engine_name
        say(f"Talking to {session.label} (engine {engine}). /help for commands, Ctrl-D to leave.")
        while True:
            try:
                line = await prompter.ask("you> ")
            except KeyboardInterrupt:
                continue
            except EOFError:
                return 0
            line = line.strip()
            if not line:
                continue
            if line.startswith("/"):
                if not await _chat_command(session, line):
                    return 0
                continue
            try:
                done = await session.turn(respond_params(args, args.npc_id, line), label=f"{session.label}: ")
            except BridgeError as e:
                if e.code == "cancelled" and out.at_line_start:
                    say("")  # the terminal echoed ^C where the words would have begun
                await out.end_line()
                await out.flush()
                say(_error_line(e.code, e.message))
                continue
            await out.end_line()
            await out.flush()
            for w in done.warnings:
                say(f"oam: warning: {w}")


async def _chat_command(session: Session, line: str) -> bool:
    """Run a /command; False to leave."""
    name, _, rest = line.partition(" ")
    rest = rest.strip()
    ref = m.NpcRef(npc_id=session.npc_id)
    try:
        if name in ("/quit", "/exit"):
            return False
        if name == "/help":
            say(CHAT_HELP)
        elif name == "/reset":
            session.svc.reset(ref)
            say("(the conversation is forgotten)")
        elif name == "/save" and rest:
            save = session.svc.transcript(ref)
            write_save(rest, save)
            say(f"(saved {len(save.turns)} turns to {rest})")
        elif name == "/load" and rest:
            restored = await session.svc.restore(m.RestoreParams(save=read_save(rest), npc_id=session.npc_id))
            say(f"(loaded {restored.turns} turns from {rest})")
        elif name == "/history":
            await session.out.write(_history_text(session.svc.transcript(ref), session.label))
            await session.out.flush()
        else:
            say(f"oam: unknown command {line!r}; /help lists them")
    except BridgeError as e:
        say(_error_line(e.code, e.message))
    except UsageError as e:
        say(f"oam: {e}")
    return True


def _history_text(save: m.Save, label: str) -> str:
    lines = []
    for turn in save.turns:
        for msg in turn:
            if msg.role == "user":
                lines.append(f"{msg.name or 'you'}: {msg.content}")
            elif msg.role == "assistant":
                for c in msg.tool_calls:
                    lines.append(f"  [{label} calls {c.name} {json.dumps(c.arguments)}]")
                if msg.content:
                    lines.append(f"{label}: {msg.content}")
            else:
                lines.append(f"  [{msg.name} -> {msg.content}]")
    return "".join(line + "\n" for line in lines) if lines else "(no turns yet)\n"


async def cmd_count_tokens(args: argparse.Namespace, stdio: ClaimedStdio) -> int:
    text = _read_prompt(args.text)
    registry = build_registry(args)
    async with Service.running(registry) as svc:
        result = await svc.count_tokens(m.CountTokensParams(text=text))
    line = msgspec.json.encode(result).decode() if args.json else str(result.tokens)
    os.write(stdio.out_fd, (line + "\n").encode())
    return 0


async def cmd_schema(args: argparse.Namespace, stdio: ClaimedStdio) -> int:
    schema = read_json_file(args.file, "schema")
    check_schema(schema, f"{args.file}", tool=args.tool)
    say(f"{args.file}: a valid {'tool parameters' if args.tool else 'answer'} schema")
    os.write(stdio.out_fd, (json.dumps(schema, ensure_ascii=False) + "\n").encode())
    return 0


COMMANDS: dict[str, Callable[[argparse.Namespace, ClaimedStdio], Any]] = {
    "respond": cmd_respond,
    "chat": cmd_chat,
    "count-tokens": cmd_count_tokens,
    "schema": cmd_schema,
}


# ---- the command line ----


def _add_npc_arguments(ap: argparse.ArgumentParser) -> None:
    add_engine_arguments(ap)
    g = ap.add_argument_group("the NPC")
    g.add_argument("-i", "--instructions", help="what the NPC is told (npc/create's instructions)")
    g.add_argument("--persona", metavar="FILE", help='a JSON persona: {"name", "role", "traits", "speechStyle"}')
    g.add_argument(
        "--tools",
        metavar="FILE",
        help='a JSON list of tools: [{"name", "description", "parameters"}]'
        ' (the OpenAI {"type": "function"} shape too)',
    )
    g.add_argument(
        "--tool-choice",
        default="auto",
        metavar="auto|required|none|tool_or_answer|NAME",
        help="on the first step (default auto); a tool's name forces that tool",
    )
    g.add_argument(
        "--tool-command",
        metavar="CMD",
        help="answers tool calls: run with /bin/sh, the call's arguments as JSON on stdin, the output JSON"
        " on stdout (env OAM_TOOL_NAME, OAM_TOOL_CALL_ID); a non-zero exit is an error the model sees."
        " Without it, on a terminal, you are asked",
    )
    g.add_argument("--npc-id", default="npc", help="the NPC's id (default npc; a --script file's npcs are keyed by it)")
    g.add_argument("--max-tokens", type=int, help="tokens per model step at most")
    g.add_argument("--temperature", type=float)
    g.add_argument("--seed", type=int)
    g.add_argument("--top-p", type=float)
    g.add_argument("--max-tool-rounds", type=int, default=4)
    g.add_argument("--max-tool-calls", type=int, default=8)
    g.add_argument(
        "--tool-timeout-ms",
        type=int,
        default=0,
        help="per tool call (default 0: no timeout, a person may take their time)",
    )
    g.add_argument(
        "--load",
        metavar="FILE",
        help="start from a saved transcript (npc/transcript's format; its NPC, persona and tools included)",
    )
    ap.add_argument("--log-level", default=os.environ.get("OAM_LOG", "warning"))


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="oam",
        description="NPC brains from the command line.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=textwrap.dedent(
            """\
            exit status: 0 done, 1 an error with no code, 2 a usage error, 130 cancelled
            (Ctrl-C); an error with a stable code exits with that code's status (README.md,
            "The oam command line")."""
        ),
    )
    ap.add_argument("--version", action="version", version=f"oam {__version__}")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("respond", help="one turn, its text streamed to stdout")
    r.add_argument("prompt", nargs="?", help="what the player says (absent or -: read from stdin)")
    _add_npc_arguments(r)
    r.add_argument("--schema", metavar="FILE", help="a JSON Schema: the answer is JSON, printed on one line")
    r.add_argument("--save", metavar="FILE", help="save the transcript after the turn (continue with --load)")
    r.add_argument(
        "--no-prompt",
        action="store_true",
        help="never ask at the terminal for a tool's output"
        " (without --tool-command the model is told the tool is unavailable)",
    )
    r.add_argument("-v", "--verbose", action="store_true", help="say each tool call and its output on stderr")

    c = sub.add_parser("chat", help="talk with one NPC at the terminal")
    _add_npc_arguments(c)
    c.add_argument("--history", metavar="FILE", help="keep the lines you type in FILE (up arrow recalls them)")

    t = sub.add_parser("count-tokens", help="tokens of a text on an engine")
    t.add_argument("text", nargs="?", help="the text (absent or -: read from stdin)")
    add_engine_arguments(t)
    t.add_argument("--json", action="store_true", help='print {"tokens", "promptTokens", "contextSize"}')
    t.add_argument("--log-level", default=os.environ.get("OAM_LOG", "warning"))

    s = sub.add_parser("schema", help="check a JSON Schema as --schema and tool parameters are checked")
    s.add_argument("file")
    s.add_argument("--tool", action="store_true", help="as a tool's parameters (the top level must be an object)")
    s.add_argument("--log-level", default=os.environ.get("OAM_LOG", "warning"))

    add_models_parser(sub)

    for name, (_, what) in DELEGATED.items():
        sub.add_parser(name, help=f"{what} (oam {name} --help)", add_help=False)
    return ap


def delegate(name: str, argv: list[str]) -> int:
    """``oam serve`` / ``oam replay``: the rest of the command line to that module's main."""
    module_name, _ = DELEGATED[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        if e.name != module_name:
            raise
        print(f"oam {name}: not available: this installation has no {module_name} module", file=sys.stderr)
        return 1
    run: Callable[[list[str]], int] = module.main
    return int(run(argv))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DELEGATED:
        return delegate(argv[0], argv[1:])
    args = parser().parse_args(argv)
    lower_priority(getattr(args, "priority", "normal"))  # the commands that run a model: before any thread
    configure_log(args.log_level, "oam")
    if args.command == "models":  # no engine, no trio: stdout is plain fd 1
        _leave(_run_models(args))
    stdio = ClaimedStdio()  # fd 1 is ours alone from here: llama.cpp's prints go to stderr
    _leave(_run(args, stdio))
    return 0


def _run(args: argparse.Namespace, stdio: ClaimedStdio) -> int:
    try:
        return int(trio.run(COMMANDS[args.command], args, stdio))
    except BaseException as exc:
        status = _report(args.command, exc)
        if status is None:
            raise
        return status


def _run_models(args: argparse.Namespace) -> int:
    try:
        return run_models(args, out_fd=1)
    except BaseException as exc:
        status = _report(f"models {args.models_command}", exc)
        if status is None:
            raise
        return status


def _report(command: str, exc: BaseException) -> int | None:
    """Say ``exc`` in one line on stderr and return its exit status; None for a bug (the
    traceback then shows). trio wraps an error raised in a nursery in a group: its first
    leaf that is ours is reported as if alone."""
    if isinstance(exc, BaseExceptionGroup):
        for leaf in exc.exceptions:
            status = _report(command, leaf)
            if status is not None:
                return status
        return None
    if isinstance(exc, BridgeError):
        say(_error_line(exc.code, exc.message))
        return exc.exit_code
    if isinstance(exc, UsageError):
        say(f"oam {command}: {exc}")
        return EXIT_USAGE
    if isinstance(exc, BrokenPipeError):
        return EXIT_BROKEN_PIPE
    if isinstance(exc, (KeyboardInterrupt, Interrupted)):
        say(_error_line("cancelled", "interrupted"))
        return EXIT_CODES["cancelled"]
    return None


def _leave(status: int) -> None:
    """Exit now: a model thread still generating (a cancelled turn) must not hold the process."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    raise SystemExit(main())
