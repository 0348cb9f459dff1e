"""The one harness the tests speak to a bridge through.

``Client`` is a JSON-RPC peer over a pair of byte streams: it writes lines, reads every line
the bridge writes (each must be JSON: stdout carries the protocol only), keeps them in order
and by id and turn, and waits for responses and events. ``serve_in_memory`` puts it in front
of an in-process ``Server``; ``Proc`` is a ``Client`` on a real subprocess's pipes, with its
stderr drained and the process's own controls (signals, stdin's end, exit status, kill).

A subprocess is started one way, by ``start_process``. Tests use it through two async context
managers that kill what is still running when the block ends: ``bridge_process`` (any command
that is, or execs, a bridge: the frozen build, qemu) and ``bridge`` (this checkout's
``python -m bridge``). ``open_bridge`` leaves the ending to a script that owns the nursery.
``OAM_BRIDGE_ROOT`` names another source tree whose bridge ``bridge`` starts (a checkout of
an older commit shows which tests fail there); default: this repository.
"""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, TypeVar

import trio

from bridge import EngineRegistry, Limits, ScriptedEngine, Server

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BRIDGE_ROOT = os.path.abspath(os.environ.get("OAM_BRIDGE_ROOT") or ROOT)
BRIDGE_CMD = [sys.executable, "-m", "bridge"]
DEADLINE = 20  # seconds: a hang guard, not a performance check

INVENTORY_TOOL = {
    "name": "check_inventory",
    "description": "Look up how many of an item the tavern has.",
    "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
}
DOOR_TOOL = {
    "name": "open_door",
    "description": "Open a door.",
    "parameters": {"type": "object", "properties": {"door": {"type": "string"}}, "required": ["door"]},
}

TERMINAL = ("turn/completed", "turn/failed")
T = TypeVar("T")


# ---- lines ----


def rpc(id_: Any, method: str, params: Any = None) -> dict[str, Any]:
    """A request (``params`` left out when None)."""
    msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
    if params is not None:
        msg["params"] = params
    return msg


def note(method: str, params: Any = None) -> dict[str, Any]:
    """A notification (``params`` left out when None)."""
    msg: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if params is not None:
        msg["params"] = params
    return msg


INIT = rpc("init", "initialize", {"protocolVersion": 1, "clientInfo": {"name": "tests", "version": "0"}})


def encode(*msgs: Any) -> bytes:
    """Messages (or raw bytes) as one chunk of lines, to be sent in one write."""
    return b"".join(m if isinstance(m, bytes) else json.dumps(m).encode() + b"\n" for m in msgs)


def error_code(resp: dict[str, Any]) -> str | None:
    """The stable error code of a response (``error.data.code``), None for a result."""
    return resp.get("error", {}).get("data", {}).get("code") if "error" in resp else None


def free_port() -> int:
    """A loopback TCP port nothing listens on (now)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def words(n: int) -> str:
    """``n`` distinct words: a scripted text of known length."""
    return " ".join(f"w{i}" for i in range(n))


# ---- the peer ----


class RpcError(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.error = error
        self.code = error.get("data", {}).get("code")
        self.data: dict[str, Any] = error.get("data", {})


class Client:
    """A JSON-RPC peer of a bridge. Everything read is kept: ``messages`` (every line,
    decoded, in order), ``events`` (the notifications), ``responses`` (the other lines; a
    batch's response is a list), and with ``keep_raw`` (a long test turns it off) ``raw``
    (the bytes) and ``lines`` (each line as written). A complete line that is not JSON fails
    the test; a last line cut off by the end of the stream lands in ``bad_lines``."""

    def __init__(self, send: trio.abc.SendStream, recv: trio.abc.ReceiveStream) -> None:
        self._send, self._recv = send, recv
        self._ids = itertools.count(1)
        self.keep_raw = True
        self.raw = bytearray()
        self.lines: list[bytes] = []
        self.messages: list[Any] = []
        self.events: list[dict[str, Any]] = []
        self.responses: list[Any] = []
        self.bad_lines: list[bytes] = []
        self.init_result: dict[str, Any] | None = None  # what ``initialize`` answered
        self._by_id: dict[str, list[dict[str, Any]]] = {}  # responses by json.dumps(id)
        self._by_turn: dict[str, list[dict[str, Any]]] = {}  # events by turnId
        self._changed = trio.Event()
        self.eof = trio.Event()

    # ---- reading ----

    async def run_reader(self) -> None:
        """Read the bridge's output until it ends."""
        buf = b""
        while data := await self._recv.receive_some(1 << 16):
            if self.keep_raw:
                self.raw += data
            buf += data
            *complete, buf = buf.split(b"\n")
            for line in complete:
                self._take(line)
            self._wake()
        if buf:
            self.bad_lines.append(buf)
        self.eof.set()
        self._wake()

    def _take(self, line: bytes) -> None:
        if self.keep_raw:
            self.lines.append(line)
        try:
            msg = json.loads(line)
        except ValueError:
            self.bad_lines.append(line)
            raise AssertionError(f"a line the bridge wrote is not JSON: {line[:300]!r}") from None
        self.messages.append(msg)
        if isinstance(msg, dict) and "method" in msg:
            self.events.append(msg)
            params = msg.get("params")
            turn_id = params.get("turnId") if isinstance(params, dict) else None
            if isinstance(turn_id, str):
                self._by_turn.setdefault(turn_id, []).append(msg)
            return
        self.responses.append(msg)
        for one in msg if isinstance(msg, list) else [msg]:
            if isinstance(one, dict) and "id" in one:
                self._by_id.setdefault(json.dumps(one["id"]), []).append(one)

    def _wake(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    def forget(self) -> None:
        """Drop what was read so far (a long test keeps its own memory flat)."""
        for kept in (self.lines, self.messages, self.events, self.responses):
            kept.clear()
        self.raw.clear()
        self._by_id.clear()
        self._by_turn.clear()

    def _last_words(self) -> str:
        return ""

    async def until(self, what: str, probe: Callable[[], T | None]) -> T:
        """``probe()``'s first answer that is not None, tried again whenever a line arrives;
        fails if the output ends first (``what``: what was waited for)."""
        while True:
            found = probe()
            if found is not None:
                return found
            if self.eof.is_set():
                raise AssertionError(f"the bridge's output ended before {what}{self._last_words()}")
            await self._changed.wait()

    # ---- writing ----

    async def send_raw(self, data: bytes) -> None:
        await self._send.send_all(data)

    async def send(self, *msgs: Any) -> None:
        """Messages (or raw bytes), in one write."""
        await self.send_raw(encode(*msgs))

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        await self.send(note(method, params or {}))

    # ---- requests ----

    def responses_to(self, id_: Any) -> list[dict[str, Any]]:
        """Every response (alone or in a batch) whose id is ``id_`` (the same JSON)."""
        return self._by_id.get(json.dumps(id_), [])

    async def response(self, id_: Any) -> dict[str, Any]:
        """The first response whose id is ``id_``, once it came."""
        return await self.until(f"the response to {id_!r}", lambda: next(iter(self.responses_to(id_)), None))

    async def result(self, id_: Any) -> Any:
        r = await self.response(id_)
        assert "result" in r, f"request {id_!r} failed: {r}"
        return r["result"]

    async def request(self, id_: Any, method: str, params: Any = None) -> Any:
        """A request with the id given; its result (an error fails the test)."""
        await self.send(rpc(id_, method, params))
        return await self.result(id_)

    async def call_raw(self, method: str, params: Any = None) -> dict[str, Any]:
        """A request with the next id of the client's own; its response."""
        id_ = next(self._ids)
        await self.send(rpc(id_, method, params))
        return await self.response(id_)

    async def call(self, method: str, params: Any = None) -> Any:
        """A request with the next id of the client's own; its result, or ``RpcError``."""
        resp = await self.call_raw(method, params)
        if "error" in resp:
            raise RpcError(resp["error"])
        return resp["result"]

    async def initialize(self) -> dict[str, Any]:
        self.init_result = await self.call("initialize", INIT["params"])
        return self.init_result

    # ---- turns ----

    def turn_events(self, turn_id: str) -> list[dict[str, Any]]:
        return self._by_turn.get(turn_id, [])

    async def wait_event(self, method: str, **match: Any) -> dict[str, Any]:
        """The first event ``method`` whose params have the values in ``match``."""

        def probe() -> dict[str, Any] | None:
            turn_id = match.get("turnId")
            source = self.turn_events(turn_id) if isinstance(turn_id, str) else self.events
            for e in source:
                if e["method"] == method and all(e["params"].get(k) == v for k, v in match.items()):
                    return e
            return None

        return await self.until(f"{method} {match}", probe)

    async def wait_terminal(self, turn_id: str) -> dict[str, Any]:
        """The turn's terminal event (``turn/completed`` or ``turn/failed``)."""

        def probe() -> dict[str, Any] | None:
            return next((e for e in self.turn_events(turn_id) if e["method"] in TERMINAL), None)

        return await self.until(f"the end of {turn_id}", probe)

    async def turn(self, npc_id: str, prompt: str, **kw: Any) -> tuple[str, dict[str, Any]]:
        """``npc/respond``; the turn's id and its terminal event."""
        r = await self.call("npc/respond", {"npcId": npc_id, "prompt": prompt, **kw})
        return r["turnId"], await self.wait_terminal(r["turnId"])

    async def turn_answering_calls(
        self, npc_id: str, prompt: str, output: Any = "done", **kw: Any
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A turn whose every game tool call is answered with ``output``, checked well formed;
        its terminal event and the params of the calls the game saw."""
        tid = (await self.call("npc/respond", {"npcId": npc_id, "prompt": prompt, **kw}))["turnId"]
        seen: list[dict[str, Any]] = []
        while True:
            n = len(self.turn_events(tid))  # taken before looking: nothing that arrives later is missed
            calls = [e for e in self.turn_events(tid) if e["method"] == "turn/toolCallRequested"]
            for e in calls[len(seen) :]:
                seen.append(e["params"])
                try:
                    await self.call("npc/submit", {"npcId": npc_id, "callId": e["params"]["callId"], "output": output})
                except RpcError as err:
                    raise AssertionError(f"submit refused: {err.error}; turn events: {self.turn_events(tid)}") from None
            done = [e for e in self.turn_events(tid) if e["method"] in TERMINAL]
            if done:
                self.assert_well_formed(tid)
                return done[0], seen
            await self.until(f"the next event of {tid}", lambda n=n: len(self.turn_events(tid)) > n or None)

    def assert_well_formed(self, turn_id: str) -> None:
        evs = self.turn_events(turn_id)
        seqs = [e["params"]["seq"] for e in evs]
        assert seqs == list(range(len(evs))), f"seq must be gap-free 0..n, got {seqs[:5]}...{seqs[-5:]}"
        terminal = [e for e in evs if e["method"] in TERMINAL]
        assert len(terminal) == 1 and evs[-1] is terminal[0], "exactly one terminal event, and it is the last"


@asynccontextmanager
async def serve_in_memory(engine: ScriptedEngine, limits: Limits | None = None) -> AsyncIterator[tuple[Server, Client]]:
    """An in-process server on ``engine`` and a client over memory streams."""
    import trio.testing

    server = Server(EngineRegistry(default="scripted", scripted=engine), limits or Limits())
    ours, theirs = trio.testing.memory_stream_pair()
    client = Client(ours, ours)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve, theirs, theirs)
        nursery.start_soon(client.run_reader)
        with trio.fail_after(DEADLINE):
            yield server, client
        server.stop()
        nursery.cancel_scope.cancel()


# ---- a subprocess ----


class Proc(Client):
    """A bridge subprocess, and the client on its pipes (``client`` is the process itself:
    one object reads, writes and controls)."""

    def __init__(self, process: trio.Process, nursery: trio.Nursery) -> None:
        assert process.stdin is not None and process.stdout is not None
        super().__init__(process.stdin, process.stdout)
        self.process = process
        self.stderr = bytearray()  # everything the bridge logged, drained so it never blocks
        self._nursery = nursery
        self._reading = False

    @property
    def client(self) -> Proc:
        return self

    @property
    def pid(self) -> int:
        return self.process.pid

    def start_reading(self) -> None:
        """Read stdout from now on (a test that lets the output back up starts late)."""
        if not self._reading:
            self._reading = True
            self._nursery.start_soon(self.run_reader)

    async def drain_stderr(self) -> None:
        assert self.process.stderr is not None
        async for chunk in self.process.stderr:
            self.stderr += chunk

    def _last_words(self) -> str:
        return f"; stderr: {bytes(self.stderr[-2000:])!r}"

    async def close_stdin(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.aclose()

    async def wait_exit(self, within: float) -> int:
        """The exit status; ``trio.TooSlowError`` if still running after ``within`` s."""
        with trio.fail_after(within):
            return await self.process.wait()

    async def finish(self, within: float = 10) -> None:
        """End it as a game does, by closing its stdin: it must exit 0 within ``within`` s;
        then everything it wrote has been read."""
        await self.close_stdin()
        status = await self.wait_exit(within)
        assert status == 0, f"exit status {status} after stdin's end{self._last_words()}"
        if self._reading:
            with trio.fail_after(within):
                await self.eof.wait()

    async def kill(self) -> None:
        """Kill it if still running, and reap it."""
        if self.process.returncode is None:
            self.process.kill()
        with trio.CancelScope(shield=True):
            await self.process.wait()


def bridge_command(*args: str) -> list[str]:
    """This checkout's bridge with ``args`` (on the scripted engine unless they name one)."""
    if "--engine" not in args:
        args = ("--engine", "scripted", *args)
    return [*BRIDGE_CMD, *args]


def bridge_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with ``extra``; with OAM_BRIDGE_ROOT, its tree first on the path."""
    env = {**os.environ, **(extra or {})}
    if BRIDGE_ROOT != ROOT:
        env["PYTHONPATH"] = BRIDGE_ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


async def start_process(
    nursery: trio.Nursery, argv: list[str], cwd: str | os.PathLike[str], env: dict[str, str], *, read: bool = True
) -> Proc:
    """Where every subprocess is started: ``argv`` from ``cwd`` with ``env`` exactly, on pipes;
    its stderr drained and (unless ``read`` is false) its stdout read in ``nursery``."""
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=str(cwd), env=env
    )
    p = Proc(process, nursery)
    nursery.start_soon(p.drain_stderr)
    if read:
        p.start_reading()
    return p


async def open_bridge(nursery: trio.Nursery, *args: str, env: dict[str, str] | None = None) -> Proc:
    """``bridge(*args)`` in a nursery the caller owns (a script that runs it beside its own
    tasks, e.g. bench/soak_llama.py); the caller ends it (``finish`` or ``kill``). Tests use
    ``bridge``, which ends it for them."""
    return await start_process(nursery, bridge_command(*args), BRIDGE_ROOT, bridge_env(env))


def _leaves(group: BaseExceptionGroup[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    for e in group.exceptions:
        if isinstance(e, BaseExceptionGroup):
            out += _leaves(e)
        elif not isinstance(e, trio.Cancelled):
            out.append(e)
    return out


@asynccontextmanager
async def bridge_process(
    argv: list[str],
    cwd: str | os.PathLike[str] = BRIDGE_ROOT,
    env: dict[str, str] | None = None,
    *,
    read: bool = True,
    guard: float | None = DEADLINE,
) -> AsyncIterator[Proc]:
    """``argv`` (a bridge, or a command that execs one) started from ``cwd`` with ``env``
    exactly (default: this process's); stderr drained, stdout read unless ``read`` is false
    (then ``start_reading``). ``guard``: the hang guard of the whole block, in seconds (None:
    none). Killed at the end if still running. A single failure inside is raised as itself,
    not wrapped in the nurseries' exception groups."""
    try:
        async with _running(argv, cwd, os.environ.copy() if env is None else env, read, guard) as p:
            yield p
    except BaseExceptionGroup as group:
        leaves = _leaves(group)
        if len(leaves) == 1:
            raise leaves[0] from None
        raise


@asynccontextmanager
async def _running(
    argv: list[str], cwd: str | os.PathLike[str], env: dict[str, str], read: bool, guard: float | None
) -> AsyncIterator[Proc]:
    async with trio.open_nursery() as nursery:
        p = await start_process(nursery, argv, cwd, env, read=read)
        try:
            with trio.fail_after(guard) if guard is not None else trio.CancelScope():
                yield p
        finally:
            await p.kill()
            nursery.cancel_scope.cancel()


def bridge(
    *args: str, env: dict[str, str] | None = None, read: bool = True, guard: float | None = DEADLINE
) -> AbstractAsyncContextManager[Proc]:
    """This checkout's bridge (``bridge_command(*args)``) started from the source tree, with
    ``env`` added to this process's environment; see ``bridge_process``."""
    return bridge_process(bridge_command(*args), BRIDGE_ROOT, bridge_env(env), read=read, guard=guard)


@asynccontextmanager
async def initialized_bridge(
    *args: str, env: dict[str, str] | None = None, guard: float | None = DEADLINE, end_by_eof: bool = True
) -> AsyncIterator[Proc]:
    """``bridge(*args)`` after ``initialize``. If it still runs when the block ends, stdin's end
    must exit it with status 0 (``end_by_eof``; otherwise it is killed)."""
    async with bridge(*args, env=env, guard=guard) as p:
        await p.initialize()
        yield p
        if end_by_eof and p.process.returncode is None:
            await p.finish()
