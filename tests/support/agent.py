"""The agent without a server: an ``Npc`` on a fake event sink (``Sink``), its worker running,
and the history of a long conversation."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import trio

from bridge.core import _messages as m
from bridge.core.agent import Npc
from bridge.engines.base import Message, ToolSpec


class Sink:
    """An EventSink with an optional bound: past ``room`` events not yet ``taken``,
    ``wait_room`` blocks, like a game that stopped reading."""

    def __init__(self, room: int | None = None, checkpoint: bool = True) -> None:
        self.events: list[m.Event] = []
        self.room = room
        self.checkpoint = checkpoint  # False: like a sink with room to spare, no schedule point
        self.taken = 0
        self._changed = trio.Event()

    async def wait_room(self) -> None:
        if self.checkpoint:
            await trio.lowlevel.checkpoint()
        while self.room is not None and len(self.events) - self.taken >= self.room:
            await self._wait()

    def put(self, event: m.Event) -> None:
        self.events.append(event)
        self._poke()

    def take_all(self) -> None:
        self.taken = len(self.events)
        self._poke()

    def _poke(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def _wait(self) -> None:
        await self._changed.wait()

    def of(self, turn_id: str) -> list[m.Event]:
        return [e for e in self.events if e.turn_id == turn_id]

    async def wait_for(self, pred: Callable[[], bool]) -> None:
        with trio.fail_after(10):
            while not pred():
                await self._wait()

    async def terminal(self, turn_id: str) -> m.Event:
        await self.wait_for(lambda: any(isinstance(e, (m.TurnCompleted, m.TurnFailed)) for e in self.of(turn_id)))
        return self.of(turn_id)[-1]

    async def first(self, turn_id: str, kind: type[Any]) -> Any:
        await self.wait_for(lambda: any(isinstance(e, kind) for e in self.of(turn_id)))
        return next(e for e in self.of(turn_id) if isinstance(e, kind))

    def assert_well_formed(self, turn_id: str) -> None:
        evs = self.of(turn_id)
        assert [e.seq for e in evs] == list(range(len(evs))), "seq must be gap-free from 0"
        ends = [e for e in evs if isinstance(e, (m.TurnCompleted, m.TurnFailed))]
        assert len(ends) == 1 and evs[-1] is ends[0], "exactly one terminal event, last"
        ok = (["completed"], ["withdrawn:cancelled"], ["withdrawn:turn_ended"], ["withdrawn:timeout"])
        for req in [e for e in evs if isinstance(e, m.ToolCallRequested)]:
            ends = [
                "completed" if isinstance(e, m.ToolCallCompleted) else f"withdrawn:{e.reason}"
                for e in evs
                if isinstance(e, (m.ToolCallCompleted, m.ToolCallWithdrawn)) and e.call_id == req.call_id
            ]
            assert ends in ok, f"call {req.call_id} ended {ends}: each requested call ends exactly once"


def make_npc(
    engine: Any, sink: Sink, tools: list[ToolSpec] | None = None, npc_id: str = "n", max_queued: int = 8, **config: Any
) -> Npc:
    cfg = m.NpcConfig(npc_id=npc_id, instructions=config.pop("instructions", "Be brief."), tools=tools or [], **config)
    return Npc(cfg, engine, "scripted", sink, max_queued)


@asynccontextmanager
async def running(npc: Npc) -> AsyncIterator[Npc]:
    async with trio.open_nursery() as nursery:
        nursery.start_soon(npc.worker)
        with trio.fail_after(10):
            yield npc
        npc.close()


def respond(npc: Npc, prompt: str = "?", **kw: Any) -> str:
    return npc.enqueue(m.RespondParams(npc_id=npc.npc_id, prompt=prompt, **kw)).id


def history(n: int) -> list[list[Message]]:
    """``n`` turns of a conversation, each a user line and an answer."""
    return [
        [Message(role="user", content=f"hello {i} there"), Message(role="assistant", content="welcome traveller")]
        for i in range(n)
    ]
