"""``bridge.aio.AsyncService``: the in-process service for asyncio programs, the same
scenarios under ``asyncio.run`` and under ``trio.run`` (each test runs its scenario in a fresh
event loop of each kind). Before it, ``Service`` under ``asyncio.run`` died at its first line
(``AttributeError: 'RunContext' object has no attribute 'runner'``)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import trio

from bridge import BridgeError, EngineRegistry, ScriptedEngine
from bridge.aio import AsyncService, ServiceStopped
from bridge.messages import (
    DecideParams,
    DecisionOption,
    NpcConfig,
    NpcRef,
    RespondParams,
    SubmitParams,
    TextDelta,
    ToolCallRequested,
    ToolSpec,
    TurnCompleted,
    TurnFailed,
    TurnStarted,
    WorldGetParams,
    WorldSetParams,
)

INVENTORY = ToolSpec(
    name="check_inventory",
    parameters={"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
)
LOOPS = ["asyncio", "trio"]


def run(loop: str, scenario: Callable[[], Awaitable[Any]]) -> Any:
    """``scenario`` in a new event loop of the kind named."""
    if loop == "asyncio":
        return asyncio.run(scenario())  # type: ignore[arg-type]
    return trio.run(scenario)


async def sleep(seconds: float) -> None:
    """A sleep in whichever loop runs."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        await trio.sleep(seconds)
    else:
        await asyncio.sleep(seconds)


def registry() -> EngineRegistry:
    return EngineRegistry(default="scripted", scripted=ScriptedEngine())


@pytest.mark.parametrize("loop", LOOPS)
def test_a_turn_with_a_tool_round_trip_a_fact_and_a_decision(loop: str) -> None:
    async def scenario() -> None:
        async with AsyncService.running(registry()) as svc:
            script = [
                {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]},
                {"echo": "instructions"},
                {"json": {"reasoning": "It is late.", "choice": "question"}},
            ]
            await svc.create(NpcConfig(npc_id="keeper", tools=[INVENTORY], tags=("tavern",), script=script))
            assert (await svc.world_set(WorldSetParams(key="ale", value="three barrels", tags=["tavern"]))).revision
            turn = await svc.respond(RespondParams(npc_id="keeper", prompt="Any ale?"))
            seen: list[type] = []
            text = ""
            async for event in svc.events(turn.turn_id):
                seen.append(type(event))
                if isinstance(event, ToolCallRequested):
                    submit = SubmitParams(npc_id="keeper", call_id=event.call_id, output={"count": 3})
                    assert (await svc.submit(submit)).accepted
                elif isinstance(event, TextDelta):
                    text += event.delta
                elif isinstance(event, TurnCompleted):
                    assert event.tool_calls[0].output == {"count": 3}
            assert seen[0] is TurnStarted and seen[-1] is TurnCompleted
            assert "- ale: three barrels" in text, "the step saw the fact"
            options = [DecisionOption(name="let_in"), DecisionOption(name="question")]
            decision = await svc.decide(DecideParams(npc_id="keeper", situation="A knock.", options=options))
            async for event in svc.events(decision.turn_id):
                last = event
            assert isinstance(last, TurnCompleted) and last.json == {"reasoning": "It is late.", "choice": "question"}
            assert [len(t) for t in (await svc.transcript(NpcRef(npc_id="keeper"))).turns] == [4]
            assert [f.key for f in (await svc.world_get(WorldGetParams(npc_id="keeper"))).facts] == ["ale"]
            with pytest.raises(BridgeError) as e:
                await svc.respond(RespondParams(npc_id="ghost", prompt="Boo"))
            assert e.value.code == "unknown_npc"
            assert [n.npc_id for n in (await svc.list()).npcs] == ["keeper"]

    run(loop, scenario)


@pytest.mark.parametrize("loop", LOOPS)
def test_a_caller_that_stops_waiting_or_reading_leaves_the_service_working(loop: str) -> None:
    async def scenario() -> None:
        async with AsyncService.running(registry()) as svc:
            slow = [{"text": " ".join(f"w{i}" for i in range(400)), "chunkMs": 5}] * 3
            await svc.create(NpcConfig(npc_id="bard", script=slow))
            first = await svc.respond(RespondParams(npc_id="bard", prompt="Sing."))
            # a wait the caller gives up on is cancelled in the service: wait_idle returns no more
            if loop == "asyncio":
                with pytest.raises(asyncio.TimeoutError):
                    await asyncio.wait_for(svc.wait_idle(), 0.1)
            else:
                with trio.move_on_after(0.1) as scope:
                    await svc.wait_idle()
                assert scope.cancelled_caught
            # a reader that leaves early (break): the service stops keeping the turn's events
            async for event in svc.events(first.turn_id):
                if isinstance(event, TextDelta):
                    break
            assert (await svc.cancel(NpcRef(npc_id="bard"))).cancelled == [first.turn_id]
            second = await svc.respond(RespondParams(npc_id="bard", prompt="Again."))
            async for event in svc.events(second.turn_id):
                if isinstance(event, TextDelta) and event.delta.strip() == "w3":
                    await svc.cancel(NpcRef(npc_id="bard"))
                last = event
            assert isinstance(last, TurnFailed) and last.error.code == "cancelled"
            # leaving ends the turn still running, at once
            await svc.respond(RespondParams(npc_id="bard", prompt="Once more."))
            await sleep(0.05)
            t0 = time.perf_counter()
        assert time.perf_counter() - t0 < 2.0
        with pytest.raises(ServiceStopped):
            await svc.list()

    run(loop, scenario)


def test_calls_from_many_asyncio_tasks_at_once() -> None:
    async def scenario() -> None:
        async with AsyncService.running(registry()) as svc:

            async def talk(i: int) -> str:
                await svc.create(NpcConfig(npc_id=f"n{i}", script=[{"text": f"I am {i}."}]))
                turn = await svc.respond(RespondParams(npc_id=f"n{i}", prompt="Who are you?"))
                async for event in svc.events(turn.turn_id):
                    if isinstance(event, TurnCompleted):
                        return event.text
                raise AssertionError("no turn/completed")

            said = await asyncio.gather(*(talk(i) for i in range(20)))
            assert said == [f"I am {i}." for i in range(20)]

    asyncio.run(scenario())
