"""``oam``: NPC brains from the command line, on the in-process service (``bridge.Service``).

Subcommands: ``respond`` (one turn, streamed to stdout), ``chat`` (an interactive session
with one NPC), ``count-tokens``, ``schema`` (check a JSON Schema the way the bridge does), and
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
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from bridge import __version__
from bridge.core import _messages as m
from bridge.core.agent._npc import check_schema
from bridge.core._service import Service
from bridge.hosts._stdio import ClaimedStdio
from bridge.hosts._common import add_engine_arguments, build_registry
from bridge.engines.base import GenerationOptions, ToolSpec
from bridge.errors import EXIT_CODES, BridgeError

log = logging.getLogger("oam_bridge.oam")

# The hosts other modules provide: ``oam NAME ARGS...`` calls ``module.main(ARGS)``.
DELEGATED: dict[str, tuple[str, str]] = {
    "serve": ("bridge.hosts.http.app", "an OpenAI-compatible HTTP server on the same NPC brains"),
    "replay": ("bridge.hosts.replay", "record and replay sessions"),
}

EXIT_USAGE = 2  # argparse's own, and a file named on the command line that cannot be used
EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: the reader of stdout went away, as shells report it
MAX_PENDING_OUTPUT = 1 << 20  # bytes of text queued for stdout before the turn waits
TOOL_ERROR_CHARS = 2000  # at most this much of a failing tool command's stderr reaches the model


class UsageError(Exception):
    """A file or value on the command line that cannot be used: exit status 2."""


def _error_line(code: str, message: str) -> str:
    return f"oam: {code}: {message}"


def _say(text: str) -> None:
    """A note for the person (stderr: never mixed into the piped text)."""
    print(text, file=sys.stderr, flush=True)


# ---- stdout: the NPC's words, written off the loop ----


class TextOut:
    """Streamed text to the claimed stdout fd. ``write`` queues, a writer task writes in a
    worker thread, coalescing what queued meanwhile; past ``MAX_PENDING_OUTPUT`` bytes queued
    ``write`` waits (a slow reader slows the turn, memory stays bounded). A reader that went
    away (EPIPE) makes ``write`` and ``flush`` raise ``BrokenPipeError``."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._parts: list[bytes] = []
        self._pending = 0  # queued or being written
        self._changed = trio.Event()
        self.broken = False
        self.at_line_start = True

    async def run(self) -> None:
        while True:
            while not self._parts:
                await self._wait_change()
            data = b"".join(self._parts)
            self._parts.clear()
            try:
                await trio.to_thread.run_sync(_write_all, self._fd, data)
            except BrokenPipeError:
                self.broken = True
            self._pending -= len(data)
            self._notify()

    async def _wait_change(self) -> None:
        await self._changed.wait()

    def _notify(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def write(self, text: str) -> None:
        if not text:
            return
        while self._pending >= MAX_PENDING_OUTPUT and not self.broken:
            await self._wait_change()
        if self.broken:
            raise BrokenPipeError
        data = text.encode()
        self._parts.append(data)
        self._pending += len(data)
        self.at_line_start = text.endswith("\n")
        self._notify()

    async def end_line(self) -> None:
        """Make what was written end with a line break."""
        if not self.at_line_start:
            await self.write("\n")

    async def flush(self) -> None:
        while self._pending and not self.broken:
            await self._wait_change()
        if self.broken:
            raise BrokenPipeError


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


# ---- the person at the terminal ----


class PromptAborted(Exception):
    """A prompt ended by the program (its tool call was withdrawn, the turn ended)."""


class Prompter:
    """prompt_toolkit line editing, run in a worker thread (it runs its own asyncio loop
    there; the trio loop goes on). One prompt at a time. Ctrl-C at a prompt raises
    ``KeyboardInterrupt``, Ctrl-D on an empty line ``EOFError``; ``interrupt`` ends a running
    prompt from the trio side with ``PromptAborted``."""

    def __init__(self, history_file: str | None = None) -> None:
        from prompt_toolkit import PromptSession
        from prompt_toolkit.history import FileHistory, InMemoryHistory
        from prompt_toolkit.output import create_output

        history = FileHistory(history_file) if history_file else InMemoryHistory()
        # fd 1 is stderr after ClaimedStdio: prompts and echo go there, never into the text.
        self._session: Any = PromptSession(history=history, output=create_output(stdout=sys.stderr))
        self._tool_session: Any = PromptSession(history=InMemoryHistory(), output=create_output(stdout=sys.stderr))
        self._lock = trio.Lock()
        self._abort = False
        self._running: Any = None

    async def ask(self, message: str, *, tool: bool = False) -> str:
        session = self._tool_session if tool else self._session
        async with self._lock:
            self._abort = False
            self._running = session
            try:
                return await trio.to_thread.run_sync(self._prompt, session, message)
            finally:
                self._running = None

    @property
    def busy(self) -> bool:
        return self._lock.locked()

    async def idle(self) -> None:
        """Wait for the running prompt to end (the terminal is then the text's again)."""
        async with self._lock:
            pass

    def _prompt(self, session: Any, message: str) -> str:
        def pre_run() -> None:
            if self._abort:
                session.app.exit(exception=PromptAborted())

        return str(session.prompt(message, pre_run=pre_run))

    def interrupt(self) -> None:
        """End the running prompt, if any (called on the trio thread)."""
        self._abort = True
        session = self._running
        if session is None:
            return
        app = session.app
        loop = getattr(app, "loop", None)
        if loop is None:
            return  # not started yet: its pre_run sees the flag

        def stop() -> None:
            if app.is_running and app.future is not None and not app.future.done():
                app.exit(exception=PromptAborted())

        try:
            loop.call_soon_threadsafe(stop)
        except RuntimeError:  # its loop closed: the prompt already returned
            pass


# ---- tool calls ----


@dataclass
class ToolAnswerer:
    """Answers the NPC's tool calls: with ``command`` (a shell command; the call's arguments
    as JSON on its stdin, its stdout the output JSON), else the person at ``prompter``, else
    an error output the model sees."""

    command: str | None
    prompter: Prompter | None
    npc_label: str
    out: TextOut | None = None
    quiet: bool = False

    async def _own_line(self) -> None:
        """Text shown so far ends its line before a note or prompt on the same terminal."""
        if self.out is not None:
            await self.out.end_line()
            await self.out.flush()

    async def answer(self, call: m.ToolCallRequested) -> tuple[Any, str | None]:
        """(output, error) for ``call``; ``KeyboardInterrupt`` if the person pressed Ctrl-C."""
        if self.command is not None:
            return await self._run_command(call)
        if self.prompter is not None:
            return await self._ask_person(call)
        _say(f"oam: {call.name}: no --tool-command and no terminal to ask; the model is told the tool is unavailable")
        return None, "this tool cannot be run here (no tool command and no one to ask)"

    async def _run_command(self, call: m.ToolCallRequested) -> tuple[Any, str | None]:
        assert self.command is not None
        env = {**os.environ, "OAM_TOOL_NAME": call.name, "OAM_TOOL_CALL_ID": call.call_id, "OAM_NPC_ID": call.npc_id}
        proc = await trio.run_process(
            ["/bin/sh", "-c", self.command],
            stdin=json.dumps(call.arguments).encode(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            env=env,
        )
        out = proc.stdout.decode(errors="replace")
        err = proc.stderr.decode(errors="replace").strip()
        if proc.returncode != 0:
            message = err[-TOOL_ERROR_CHARS:] or f"the tool command exited with status {proc.returncode}"
            _say(f"oam: tool {call.name}: the tool command exited with status {proc.returncode}")
            return None, message
        try:
            output = json.loads(out)
        except ValueError:
            _say(f"oam: tool {call.name}: the tool command printed no JSON: {out.strip()[:200]!r}")
            return None, "the tool printed no JSON"
        if not self.quiet:
            await self._own_line()
            _say(f"  [{call.name} {json.dumps(call.arguments)} -> {json.dumps(output)}]")
        return output, None

    async def _ask_person(self, call: m.ToolCallRequested) -> tuple[Any, str | None]:
        assert self.prompter is not None
        await self._own_line()
        _say(f"{self.npc_label} calls {call.name} {json.dumps(call.arguments)}")
        while True:
            line = (await self.prompter.ask(f"{call.name} output (JSON, or !error)> ", tool=True)).strip()
            if line.startswith("!"):
                return None, line[1:].strip() or "failed"
            if not line:
                continue
            try:
                return json.loads(line), None
            except ValueError:
                return line, None  # words are an output too (a JSON string)


# ---- one NPC on the service ----


@dataclass
class Session:
    """One NPC on an in-process ``Service``, and how its turns reach the person."""

    svc: Service
    npc_id: str
    out: TextOut
    tools: ToolAnswerer
    label: str
    running_turn: str | None = None
    _prompting: set[str] = field(default_factory=set)  # calls whose output the person is asked for
    _notes: dict[str, str] = field(default_factory=dict)  # to say when that prompt has ended

    async def turn(self, params: m.RespondParams, *, show_text: bool = True, label: str = "") -> m.TurnCompleted:
        """Run one turn: text streamed to stdout as it comes (after ``label``, written before
        the first words), tool calls answered. Raises ``BridgeError`` with the turn's code
        when it fails (``cancelled`` after Ctrl-C)."""
        result = self.svc.respond(params)
        self.running_turn = result.turn_id
        calls: dict[str, trio.CancelScope] = {}
        end: m.TurnCompleted | m.TurnFailed | None = None
        try:
            async with trio.open_nursery() as nursery:
                async for ev in self.svc.events(result.turn_id):
                    if isinstance(ev, m.TextDelta) and show_text:
                        prompter = self.tools.prompter
                        if prompter is not None and prompter.busy:  # a withdrawn call's prompt is ending
                            await prompter.idle()
                        if label:
                            await self.out.write(label)
                            label = ""
                        elif ev.is_reset:  # a later step's text: what was shown stays, on its own line
                            await self.out.end_line()
                        await self.out.write(ev.delta)
                    elif isinstance(ev, m.ToolCallRequested):
                        scope = trio.CancelScope()
                        calls[ev.call_id] = scope
                        nursery.start_soon(self._answer, ev, scope)
                    elif isinstance(ev, m.ToolCallWithdrawn):
                        if ev.reason == "timeout":
                            note = f"oam: tool {ev.name}: not answered in time; the model is told so"
                            if ev.call_id in self._prompting:  # said once its prompt has ended
                                self._notes[ev.call_id] = note
                            else:
                                _say(note)
                        self._end_call(calls, ev.call_id)
                    elif isinstance(ev, (m.TurnCompleted, m.TurnFailed)):
                        end = ev
                        break
                nursery.cancel_scope.cancel()
        finally:
            for call_id in list(calls):
                self._end_call(calls, call_id)
            self.running_turn = None
        if isinstance(end, m.TurnFailed):
            raise BridgeError(end.error.code, end.error.message)
        if end is None:
            raise BridgeError("internal_error", "the turn's events ended without a terminal event")
        return end

    def _end_call(self, calls: dict[str, trio.CancelScope], call_id: str) -> None:
        scope = calls.pop(call_id, None)
        if scope is not None:
            scope.cancel()
        if call_id in self._prompting and self.tools.prompter is not None:
            self.tools.prompter.interrupt()

    async def _answer(self, call: m.ToolCallRequested, scope: trio.CancelScope) -> None:
        with scope:
            self._prompting.add(call.call_id)
            try:
                output, error = await self.tools.answer(call)
            except PromptAborted:
                note = self._notes.pop(call.call_id, None)
                if note is not None:
                    _say(note)
                return
            except KeyboardInterrupt:  # Ctrl-C at the tool prompt: cancel the turn
                self.cancel()
                return
            except EOFError:  # Ctrl-D at the tool prompt: the person has no answer
                output, error = None, "no answer"
            finally:
                self._prompting.discard(call.call_id)
            try:
                self.svc.submit(m.SubmitParams(npc_id=self.npc_id, call_id=call.call_id, output=output, error=error))
            except BridgeError as e:  # withdrawn meanwhile (timeout, cancel)
                log.debug("submit %s: %s", call.call_id, e.message)

    def cancel(self) -> bool:
        """Cancel the running turn (Ctrl-C); False when there is none."""
        if self.running_turn is None:
            return False
        self.svc.cancel(m.NpcRef(npc_id=self.npc_id))
        return True


# ---- reading what the command line names ----


def _read_json_file(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot read it: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:
        raise UsageError(f"{what} {path}: not valid JSON: {e}") from None


def _read_tools(path: str) -> list[ToolSpec]:
    data = _read_json_file(path, "--tools")
    if isinstance(data, dict) and "tools" in data:
        data = data["tools"]
    if not isinstance(data, list):
        raise UsageError(f"--tools {path}: a JSON list of tools ({{\"name\", \"description\", \"parameters\"}}) is expected")
    specs = []
    for i, t in enumerate(data):
        if isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("function"), dict):
            t = t["function"]  # the OpenAI shape, as the server takes it
        try:
            specs.append(msgspec.convert(t, ToolSpec))
        except msgspec.ValidationError as e:
            raise UsageError(f"--tools {path}: tool {i}: {e}") from None
    return specs


def _read_persona(path: str) -> m.Persona:
    data = _read_json_file(path, "--persona")
    if isinstance(data, dict) and isinstance(data.get("persona"), dict):
        data = data["persona"]
    try:
        return msgspec.convert(data, m.Persona)
    except msgspec.ValidationError as e:
        raise UsageError(f"--persona {path}: {e} (a persona is {{\"name\", \"role\", \"traits\", \"speechStyle\"}})") from None


def _read_save(path: str) -> m.Save:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UsageError(f"{path}: cannot read it: {e.strerror or e}") from None
    try:
        return msgspec.json.decode(data, type=m.Save)
    except msgspec.DecodeError as e:
        raise BridgeError("invalid_params", f"{path}: not a saved transcript (npc/transcript's format): {e}") from None


def _write_save(path: str, save: m.Save) -> None:
    try:
        with open(path, "wb") as f:
            f.write(msgspec.json.encode(save) + b"\n")
    except OSError as e:
        raise UsageError(f"{path}: cannot write it: {e.strerror or e}") from None


def _tool_choice(value: str) -> m.ToolChoice:
    if value in ("auto", "required", "none", "tool_or_answer"):
        return value  # type: ignore[return-value]
    return m.NamedTool(tool=value)


def _npc_config(args: argparse.Namespace) -> m.NpcConfig:
    persona = _read_persona(args.persona) if args.persona else None
    tools = _read_tools(args.tools) if args.tools else []
    try:
        options = GenerationOptions(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed, top_p=args.top_p)
        options = msgspec.convert(msgspec.to_builtins(options), GenerationOptions)  # checks the bounds
    except msgspec.ValidationError as e:
        raise BridgeError("invalid_params", f"options: {e}") from None
    return m.NpcConfig(npc_id=args.npc_id, instructions=args.instructions, persona=persona, tools=tools, options=options)


def _respond_params(args: argparse.Namespace, npc_id: str, prompt: str, schema: dict[str, Any] | None = None) -> m.RespondParams:
    try:
        return msgspec.convert(
            {
                "npcId": npc_id,
                "prompt": prompt,
                "toolChoice": msgspec.to_builtins(_tool_choice(args.tool_choice)),
                "maxToolRounds": args.max_tool_rounds,
                "maxToolCalls": args.max_tool_calls,
                "toolTimeoutMs": args.tool_timeout_ms,
                "schema": schema,
                "fullText": False,  # deltas only: the CLI prints each as it comes
            },
            m.RespondParams,
        )
    except msgspec.ValidationError as e:
        raise BridgeError("invalid_params", str(e)) from None


@asynccontextmanager
async def _open_npc(args: argparse.Namespace, out: TextOut, prompter: Prompter | None) -> AsyncIterator[Session]:
    """The service with the NPC the options describe (or ``--load``'s save), its text writer
    and the Ctrl-C watch: Ctrl-C cancels a running turn; with none running it ends the
    program (status 130)."""
    config = _npc_config(args)
    save = _read_save(args.load) if getattr(args, "load", None) else None
    registry = build_registry(args)
    async with Service.running(registry) as svc:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(out.run)
            label = config.persona.name if config.persona else args.npc_id
            session = Session(svc, args.npc_id, out, ToolAnswerer(args.tool_command, prompter, label, out), label)
            await nursery.start(_watch_interrupts, session)
            if save is not None:
                await svc.restore(m.RestoreParams(save=save, npc_id=args.npc_id))
                if save.config.persona is not None:
                    session.label = session.tools.npc_label = save.config.persona.name
            else:
                await svc.create(config)
            try:
                yield session
            finally:
                nursery.cancel_scope.cancel()


class Interrupted(Exception):
    """Ctrl-C with no turn to cancel: the program ends (status 130)."""


async def _watch_interrupts(session: Session, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        task_status.started()
        async for _ in signals:
            if not session.cancel():
                raise Interrupted


def _read_prompt(given: str | None) -> str:
    if given is not None and given != "-":
        return given
    if sys.stdin.isatty():
        raise UsageError("no prompt: give one (oam respond \"Hello\") or pipe it on stdin")
    return sys.stdin.read().strip()


# ---- subcommands ----


async def cmd_respond(args: argparse.Namespace, stdio: ClaimedStdio) -> int:
    prompt = _read_prompt(args.prompt)
    schema = _read_json_file(args.schema, "--schema") if args.schema else None
    if schema is not None and not isinstance(schema, dict):
        raise BridgeError("invalid_schema", f"--schema {args.schema}: a JSON Schema object is expected")
    prompter = Prompter() if args.tools and args.tool_command is None and sys.stdin.isatty() and not args.no_prompt else None
    out = TextOut(stdio.out_fd)
    async with _open_npc(args, out, prompter) as session:
        session.tools.quiet = not args.verbose
        try:
            done = await session.turn(_respond_params(args, args.npc_id, prompt, schema), show_text=schema is None)
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
            _say(f"oam: warning: {w}")
        if args.save:
            _write_save(args.save, session.svc.transcript(m.NpcRef(npc_id=args.npc_id)))
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
    async with _open_npc(args, out, prompter) as session:
        _say(f"Talking to {session.label} (engine {session.svc.npc(args.npc_id).engine_name}). /help for commands, Ctrl-D to leave.")
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
                done = await session.turn(_respond_params(args, args.npc_id, line), label=f"{session.label}: ")
            except BridgeError as e:
                if e.code == "cancelled" and out.at_line_start:
                    _say("")  # the terminal echoed ^C where the words would have begun
                await out.end_line()
                await out.flush()
                _say(_error_line(e.code, e.message))
                continue
            await out.end_line()
            await out.flush()
            for w in done.warnings:
                _say(f"oam: warning: {w}")


async def _chat_command(session: Session, line: str) -> bool:
    """Run a /command; False to leave."""
    name, _, rest = line.partition(" ")
    rest = rest.strip()
    ref = m.NpcRef(npc_id=session.npc_id)
    try:
        if name in ("/quit", "/exit"):
            return False
        if name == "/help":
            _say(CHAT_HELP)
        elif name == "/reset":
            session.svc.reset(ref)
            _say("(the conversation is forgotten)")
        elif name == "/save" and rest:
            save = session.svc.transcript(ref)
            _write_save(rest, save)
            _say(f"(saved {len(save.turns)} turns to {rest})")
        elif name == "/load" and rest:
            restored = await session.svc.restore(m.RestoreParams(save=_read_save(rest), npc_id=session.npc_id))
            _say(f"(loaded {restored.turns} turns from {rest})")
        elif name == "/history":
            await session.out.write(_history_text(session.svc.transcript(ref), session.label))
            await session.out.flush()
        else:
            _say(f"oam: unknown command {line!r}; /help lists them")
    except BridgeError as e:
        _say(_error_line(e.code, e.message))
    except UsageError as e:
        _say(f"oam: {e}")
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
    schema = _read_json_file(args.file, "schema")
    check_schema(schema, f"{args.file}", tool=args.tool)
    _say(f"{args.file}: a valid {'tool parameters' if args.tool else 'answer'} schema")
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
    g.add_argument("--tools", metavar="FILE", help='a JSON list of tools: [{"name", "description", "parameters"}] (the OpenAI {"type": "function"} shape too)')
    g.add_argument("--tool-choice", default="auto", metavar="auto|required|none|tool_or_answer|NAME", help="on the first step (default auto); a tool's name forces that tool")
    g.add_argument("--tool-command", metavar="CMD", help="answers tool calls: run with /bin/sh, the call's arguments as JSON on stdin, the output JSON on stdout (env OAM_TOOL_NAME, OAM_TOOL_CALL_ID); a non-zero exit is an error the model sees. Without it, on a terminal, you are asked")
    g.add_argument("--npc-id", default="npc", help="the NPC's id (default npc; a --script file's npcs are keyed by it)")
    g.add_argument("--max-tokens", type=int, help="tokens per model step at most")
    g.add_argument("--temperature", type=float)
    g.add_argument("--seed", type=int)
    g.add_argument("--top-p", type=float)
    g.add_argument("--max-tool-rounds", type=int, default=4)
    g.add_argument("--max-tool-calls", type=int, default=8)
    g.add_argument("--tool-timeout-ms", type=int, default=0, help="per tool call (default 0: no timeout, a person may take their time)")
    g.add_argument("--load", metavar="FILE", help="start from a saved transcript (npc/transcript's format; its NPC, persona and tools included)")
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
    r.add_argument("--no-prompt", action="store_true", help="never ask at the terminal for a tool's output (without --tool-command the model is told the tool is unavailable)")
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
    run: Callable[[list[str]], int] = getattr(module, "main")
    return int(run(argv))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in DELEGATED:
        return delegate(argv[0], argv[1:])
    args = parser().parse_args(argv)
    logging.basicConfig(stream=sys.stderr, level=args.log_level.upper(), format="oam %(levelname)s %(name)s: %(message)s")
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
        _say(_error_line(exc.code, exc.message))
        return exc.exit_code
    if isinstance(exc, UsageError):
        _say(f"oam {command}: {exc}")
        return EXIT_USAGE
    if isinstance(exc, BrokenPipeError):
        return EXIT_BROKEN_PIPE
    if isinstance(exc, (KeyboardInterrupt, Interrupted)):
        _say(_error_line("cancelled", "interrupted"))
        return EXIT_CODES["cancelled"]
    return None


def _leave(status: int) -> None:
    """Exit now: a model thread still generating (a cancelled turn) must not hold the process."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(status)


if __name__ == "__main__":
    raise SystemExit(main())
