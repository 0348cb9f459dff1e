"""One NPC of ``oam`` (``main``) on an in-process ``Service`` (``Session``: its turns streamed
to the terminal, its tool calls answered, Ctrl-C cancelling), and what the command line names
to build it: the persona, tools and saved transcript files, the options and the turn's
parameters. A file that cannot be used raises ``UsageError`` (exit status 2).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import msgspec
import trio

from bridge.core import _messages as m
from bridge.core._service import Service
from bridge.engines.base import GenerationOptions, ToolSpec
from bridge.errors import BridgeError
from bridge.hosts._common import build_registry
from bridge.hosts.oam._io import PromptAborted, Prompter, TextOut, ToolAnswerer, say

log = logging.getLogger("oam_bridge.oam")


class UsageError(Exception):
    """A file or value on the command line that cannot be used: exit status 2."""


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
                                say(note)
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
                    say(note)
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


def read_json_file(path: str, what: str) -> Any:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except OSError as e:
        raise UsageError(f"{what} {path}: cannot read it: {e.strerror or e}") from None
    except (ValueError, RecursionError) as e:
        raise UsageError(f"{what} {path}: not valid JSON: {e}") from None


def _read_tools(path: str) -> list[ToolSpec]:
    data = read_json_file(path, "--tools")
    if isinstance(data, dict) and "tools" in data:
        data = data["tools"]
    if not isinstance(data, list):
        raise UsageError(f'--tools {path}: a JSON list of tools ({{"name", "description", "parameters"}}) is expected')
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
    data = read_json_file(path, "--persona")
    if isinstance(data, dict) and isinstance(data.get("persona"), dict):
        data = data["persona"]
    try:
        return msgspec.convert(data, m.Persona)
    except msgspec.ValidationError as e:
        raise UsageError(f'--persona {path}: {e} (a persona is {{"name", "role", "traits", "speechStyle"}})') from None


def read_save(path: str) -> m.Save:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        raise UsageError(f"{path}: cannot read it: {e.strerror or e}") from None
    try:
        return msgspec.json.decode(data, type=m.Save)
    except msgspec.DecodeError as e:
        raise BridgeError("invalid_params", f"{path}: not a saved transcript (npc/transcript's format): {e}") from None


def write_save(path: str, save: m.Save) -> None:
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
        options = GenerationOptions(
            max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed, top_p=args.top_p
        )
        options = msgspec.convert(msgspec.to_builtins(options), GenerationOptions)  # checks the bounds
    except msgspec.ValidationError as e:
        raise BridgeError("invalid_params", f"options: {e}") from None
    return m.NpcConfig(
        npc_id=args.npc_id, instructions=args.instructions, persona=persona, tools=tools, options=options
    )


def respond_params(
    args: argparse.Namespace, npc_id: str, prompt: str, schema: dict[str, Any] | None = None
) -> m.RespondParams:
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
async def open_npc(args: argparse.Namespace, out: TextOut, prompter: Prompter | None) -> AsyncIterator[Session]:
    """The service with the NPC the options describe (or ``--load``'s save), its text writer
    and the Ctrl-C watch: Ctrl-C cancels a running turn; with none running it ends the
    program (status 130)."""
    config = _npc_config(args)
    save = read_save(args.load) if getattr(args, "load", None) else None
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
