"""The in-process API: the service layer used directly from Python, with no JSON-RPC and no
pipes (the seeds' in-process host). Every other host is built on exactly these calls."""

from __future__ import annotations

import pytest
import trio

from bridge import EngineRegistry, ScriptedEngine, Service
from bridge.core import _messages as m
from bridge.engines.base import ToolSpec
from bridge.errors import BridgeError

INVENTORY = ToolSpec(
    name="check_inventory",
    parameters={"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
)


def registry() -> EngineRegistry:
    return EngineRegistry(default="scripted", scripted=ScriptedEngine())


async def test_a_turn_with_a_tool_round_trip_in_process() -> None:
    async with Service.running(registry()) as svc:
        script = [
            {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]},
            {"text": "Three barrels."},
        ]
        created = await svc.create(m.NpcConfig(npc_id="keeper", tools=[INVENTORY], script=script))
        assert created == m.CreateResult(npc_id="keeper", engine="scripted", context_size=4096)
        turn = svc.respond(m.RespondParams(npc_id="keeper", prompt="Any ale?"))
        seen = []
        async for ev in svc.events(turn.turn_id):
            seen.append(type(ev))
            if isinstance(ev, m.ToolCallRequested):
                assert ev.arguments == {"item": "ale"}
                assert svc.submit(m.SubmitParams(npc_id="keeper", call_id=ev.call_id, output={"count": 3})).accepted
            if isinstance(ev, m.TurnCompleted):
                assert ev.text == "Three barrels." and ev.tool_calls[0].output == {"count": 3}
        assert seen[0] is m.TurnStarted and seen[-1] is m.TurnCompleted and m.ToolCallCompleted in seen
        assert [len(t) for t in svc.transcript(m.NpcRef(npc_id="keeper")).turns] == [4]


async def test_leaving_the_service_ends_running_turns_with_a_terminal_event() -> None:
    async with Service.running(registry()) as svc:
        await svc.create(m.NpcConfig(npc_id="bard", script=[{"text": "la " * 1000, "chunkMs": 5}]))
        turn = svc.respond(m.RespondParams(npc_id="bard", prompt="sing"))
        events = svc.events(turn.turn_id)
        assert isinstance(await events.__anext__(), m.TurnStarted)
    last = None
    with trio.fail_after(5):
        async for ev in events:
            last = ev
    assert isinstance(last, m.TurnFailed) and last.error.code == "cancelled"


async def test_operations_raise_typed_errors_with_stable_codes() -> None:
    async with Service.running(registry(), m.Limits(max_npcs=1)) as svc:
        await svc.create(m.NpcConfig(npc_id="a"))
        with pytest.raises(BridgeError) as e:
            await svc.create(m.NpcConfig(npc_id="b"))
        assert e.value.code == "limit_reached" and not e.value.retryable and e.value.data["limit"] == "maxNpcs"
        with pytest.raises(BridgeError) as e:
            svc.respond(m.RespondParams(npc_id="ghost", prompt="hi"))
        assert e.value.code == "unknown_npc"


async def test_a_closing_service_accepts_no_new_npcs_or_turns_and_waits_for_deleted_npcs() -> None:
    async with Service.running(registry()) as svc:
        await svc.create(m.NpcConfig(npc_id="a", script=[{"text": "hi", "delayMs": 20}]))
        turn = svc.respond(m.RespondParams(npc_id="a", prompt="hi"))
        svc.delete(m.NpcRef(npc_id="a"))
        assert not svc.idle(), "a deleted NPC's turn has not ended yet: the service is not idle"
        with trio.fail_after(5):
            await svc.wait_idle()
        svc.close_all()
        with pytest.raises(BridgeError) as e:
            svc.respond(m.RespondParams(npc_id="a", prompt="again"))
        assert e.value.code == "shutting_down"
        with pytest.raises(BridgeError) as e:
            await svc.create(m.NpcConfig(npc_id="b"))
        assert e.value.code == "shutting_down"
        last = None
        async for ev in svc.events(turn.turn_id):
            last = ev
        assert isinstance(last, m.TurnFailed)
