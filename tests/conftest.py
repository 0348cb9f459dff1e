"""Test clients: the same ``Client`` speaks to an in-process server over memory streams or
to the real ``oam-bridge`` subprocess over pipes, so contract tests run against both."""

from __future__ import annotations

import itertools
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import pytest
import trio
import trio.testing

from bridge import EngineRegistry, Limits, ScriptedEngine, Server

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BRIDGE_CMD = [sys.executable, "-m", "bridge"]
DEADLINE = 20  # seconds: a hang guard, not a performance check


class RpcError(Exception):
    def __init__(self, error: dict[str, Any]) -> None:
        super().__init__(error.get("message"))
        self.error = error
        self.code = error.get("data", {}).get("code")
        self.data: dict[str, Any] = error.get("data", {})


class Client:
    """A minimal JSON-RPC peer: correlates responses by id and collects notifications."""

    def __init__(self, send: trio.abc.SendStream, recv: trio.abc.ReceiveStream) -> None:
        self._send, self._recv = send, recv
        self._ids = itertools.count(1)
        self._waiting: dict[Any, trio.MemorySendChannel[dict[str, Any]]] = {}
        self.events: list[dict[str, Any]] = []
        self.responses: list[Any] = []  # every decoded non-notification line, in order
        self._changed = trio.Event()
        self.eof = trio.Event()

    async def run_reader(self) -> None:
        buf = b""
        while True:
            data = await self._recv.receive_some(1 << 16)
            if not data:
                break
            buf += data
            *lines, buf = buf.split(b"\n")
            for line in lines:
                msg = json.loads(line)  # stdout purity: every line must be JSON
                if isinstance(msg, dict) and "method" in msg:
                    self.events.append(msg)
                else:
                    self.responses.append(msg)
                    if isinstance(msg, dict) and msg.get("id") in self._waiting:
                        self._waiting.pop(msg["id"]).send_nowait(msg)
                self._changed.set()
                self._changed = trio.Event()
        self.eof.set()
        self._changed.set()
        for id_, waiter in list(self._waiting.items()):  # a call the bridge never answered fails, not hangs
            waiter.send_nowait({"jsonrpc": "2.0", "id": id_, "error": {"code": 0, "message": "bridge closed its stdout before answering", "data": {"code": "transport"}}})
        self._waiting.clear()

    async def send_raw(self, data: bytes) -> None:
        await self._send.send_all(data)

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        await self.send_raw(json.dumps({"jsonrpc": "2.0", "method": method, "params": params or {}}).encode() + b"\n")

    async def call_raw(self, method: str, params: Any = None) -> dict[str, Any]:
        id_ = next(self._ids)
        s, r = trio.open_memory_channel[dict[str, Any]](1)
        self._waiting[id_] = s
        msg: dict[str, Any] = {"jsonrpc": "2.0", "id": id_, "method": method}
        if params is not None:
            msg["params"] = params
        await self.send_raw(json.dumps(msg).encode() + b"\n")
        return await r.receive()

    async def call(self, method: str, params: Any = None) -> Any:
        resp = await self.call_raw(method, params)
        if "error" in resp:
            raise RpcError(resp["error"])
        return resp["result"]

    async def initialize(self) -> dict[str, Any]:
        return await self.call("initialize", {"protocolVersion": 1, "clientInfo": {"name": "tests", "version": "0"}})

    def turn_events(self, turn_id: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["params"].get("turnId") == turn_id]

    async def wait_event(self, method: str, **match: Any) -> dict[str, Any]:
        while True:
            for e in self.events:
                if e["method"] == method and all(e["params"].get(k) == v for k, v in match.items()):
                    return e
            if self.eof.is_set():
                raise AssertionError(f"EOF before {method} {match}")
            await self._changed.wait()

    async def wait_terminal(self, turn_id: str) -> dict[str, Any]:
        while True:
            for e in self.turn_events(turn_id):
                if e["method"] in ("turn/completed", "turn/failed"):
                    return e
            if self.eof.is_set():
                raise AssertionError(f"EOF before the end of {turn_id}")
            await self._changed.wait()

    async def turn(self, npc_id: str, prompt: str, **kw: Any) -> tuple[str, dict[str, Any]]:
        r = await self.call("npc/respond", {"npcId": npc_id, "prompt": prompt, **kw})
        return r["turnId"], await self.wait_terminal(r["turnId"])

    def assert_well_formed(self, turn_id: str) -> None:
        evs = self.turn_events(turn_id)
        assert [e["params"]["seq"] for e in evs] == list(range(len(evs))), "seq must be gap-free"
        terminal = [e for e in evs if e["method"] in ("turn/completed", "turn/failed")]
        assert len(terminal) == 1 and evs[-1] is terminal[0], "exactly one terminal event, last"


@pytest.fixture
def engine() -> ScriptedEngine:
    return ScriptedEngine()


@asynccontextmanager
async def serve_in_memory(engine: ScriptedEngine) -> AsyncIterator[tuple[Server, Client]]:
    """An in-process server on ``engine`` and a client over memory streams."""
    server = Server(EngineRegistry(default="scripted", scripted=engine), Limits())
    ours, theirs = trio.testing.memory_stream_pair()
    client = Client(ours, ours)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(server.serve, theirs, theirs)
        nursery.start_soon(client.run_reader)
        with trio.fail_after(DEADLINE):
            yield server, client
        server.stop()
        nursery.cancel_scope.cancel()


@pytest.fixture
async def server_client(engine: ScriptedEngine) -> AsyncIterator[tuple[Server, Client]]:
    async with serve_in_memory(engine) as pair:
        yield pair


@pytest.fixture
async def client(server_client: tuple[Server, Client]) -> Client:
    c = server_client[1]
    await c.initialize()
    return c


class Proc:
    def __init__(self, process: trio.Process, client: Client) -> None:
        self.process = process
        self.client = client
        self.stderr = bytearray()  # everything the bridge logged, drained so it never blocks

    async def drain_stderr(self) -> None:
        assert self.process.stderr is not None
        async for chunk in self.process.stderr:
            self.stderr += chunk


async def open_bridge(nursery: trio.Nursery, *args: str, env: dict[str, str] | None = None) -> Proc:
    import subprocess

    if "--engine" not in args:
        args = ("--engine", "scripted", *args)
    process = await trio.lowlevel.open_process(
        [*BRIDGE_CMD, *args],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, **(env or {})},
    )
    assert process.stdin and process.stdout
    c = Client(process.stdin, process.stdout)
    nursery.start_soon(c.run_reader)
    p = Proc(process, c)
    nursery.start_soon(p.drain_stderr)
    return p


@asynccontextmanager
async def bridge_process(argv: list[str], cwd: str | os.PathLike[str], env: dict[str, str]) -> AsyncIterator[Proc]:
    """``argv`` (a bridge, or a command that execs one) started from ``cwd`` with ``env``
    exactly; killed on the way out if still running."""
    import subprocess

    process = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                               stderr=subprocess.PIPE, cwd=str(cwd), env=env)
    assert process.stdin and process.stdout
    p = Proc(process, Client(process.stdin, process.stdout))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(p.client.run_reader)
        nursery.start_soon(p.drain_stderr)
        try:
            yield p
        finally:
            if process.returncode is None:
                process.kill()
            await process.wait()
            nursery.cancel_scope.cancel()


@pytest.fixture
async def proc() -> AsyncIterator[Proc]:
    async with trio.open_nursery() as nursery:
        p = await open_bridge(nursery)
        with trio.fail_after(DEADLINE):
            yield p
        if p.process.returncode is None:
            p.process.kill()
        await p.process.wait()
        nursery.cancel_scope.cancel()


def _contract_targets() -> list[str]:
    targets = ["memory", "subprocess"]
    try:
        from bridge.engines import native
    except ImportError:
        return targets
    if native.availability()[0] or os.environ.get("CI") == "true":
        targets.append("native-subprocess")  # under CI a missing library fails, not skips
    return targets


@pytest.fixture(params=_contract_targets())
async def any_client(request: pytest.FixtureRequest) -> AsyncIterator[Client]:
    """The same contract, in-process, through the real subprocess on the scripted engine,
    and through the real subprocess on the native engine (the Swift library's scripted
    model behind the C ABI)."""
    if request.param == "memory":
        async with serve_in_memory(ScriptedEngine()) as (_, c):
            await c.initialize()
            yield c
    else:
        engine = ["--engine", "native"] if request.param == "native-subprocess" else []
        async with trio.open_nursery() as nursery:
            p = await open_bridge(nursery, *engine)
            await p.client.initialize()
            with trio.fail_after(DEADLINE):
                yield p.client
            p.process.kill()
            await p.process.wait()
            nursery.cancel_scope.cancel()


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
