"""The terminal's side of ``oam`` (``main``): the NPC's words written to stdout off the trio
loop (``TextOut``), the person's lines read with prompt_toolkit in a worker thread
(``Prompter``), and the answers to the NPC's tool calls (``ToolAnswerer``: a tool command, the
person, or an error the model sees). Notes for the person go to stderr (``say``).
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any

import trio

from bridge.core import _messages as m

MAX_PENDING_OUTPUT = 1 << 20  # bytes of text queued for stdout before the turn waits
TOOL_ERROR_CHARS = 2000  # at most this much of a failing tool command's stderr reaches the model


def say(text: str) -> None:
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
        view = view[os.write(fd, view) :]


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
        say(f"oam: {call.name}: no --tool-command and no terminal to ask; the model is told the tool is unavailable")
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
            say(f"oam: tool {call.name}: the tool command exited with status {proc.returncode}")
            return None, message
        try:
            output = json.loads(out)
        except ValueError:
            say(f"oam: tool {call.name}: the tool command printed no JSON: {out.strip()[:200]!r}")
            return None, "the tool printed no JSON"
        if not self.quiet:
            await self._own_line()
            say(f"  [{call.name} {json.dumps(call.arguments)} -> {json.dumps(output)}]")
        return output, None

    async def _ask_person(self, call: m.ToolCallRequested) -> tuple[Any, str | None]:
        assert self.prompter is not None
        await self._own_line()
        say(f"{self.npc_label} calls {call.name} {json.dumps(call.arguments)}")
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
