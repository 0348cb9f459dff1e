"""How a session ends, at its edges: the game closing the bridge's stdout, a forced exit while
the game reads nothing, and ``npc/cancel`` racing a turn's next event; through the real
``oam-bridge`` subprocess over real pipes.

On commit a76effb, before the fixes: an idle bridge whose stdout was closed ran on until stdin
ended (it noticed only at its next write), and after ``npc/cancel``'s response one more
``turn/textDelta`` could come before ``turn/failed`` (31 of 60 cancels of a fast stream, and
the first delta of the step after a tool round when the submit and the cancel came together).
``OAM_BRIDGE_ROOT=<a checkout of it>`` runs this file's bridges from that tree
(tests/support/harness.py).
"""

from __future__ import annotations

import json
import os

import pytest
import trio

from tests.support.harness import INIT, ROOT, bridge, initialized_bridge, note, rpc, words

TOOL = {"name": "open_door", "description": "Open a door.", "parameters": {"type": "object", "properties": {}}}
LATE = ("turn/textDelta", "turn/partialJson", "turn/toolCallRequested", "turn/contextTrimmed", "turn/started")


# ---- a closed stdout ----


@pytest.mark.parametrize("npcs", [0, 3])
async def test_an_idle_bridge_exits_at_once_when_the_game_closes_its_stdout(npcs: int) -> None:
    async with bridge(read=False) as b:
        assert b.process.stdout is not None
        await b.send(INIT, *[rpc(i, "npc/create", {"npcId": f"n{i}"}) for i in range(npcs)])
        seen = b""
        while seen.count(b"\n") < 1 + npcs:  # every request answered: the bridge is idle
            seen += await b.process.stdout.receive_some(65536)
        await trio.sleep(0.3)
        await b.process.stdout.aclose()
        try:
            status = await b.wait_exit(2.0)  # decided: about 100 ms; the rest is slack for a busy machine
        except trio.TooSlowError:
            raise AssertionError("an idle bridge still runs 2 s after the game closed its stdout") from None
        assert status == 0
        assert b"protocol output closed by the peer" in b.stderr


# ---- a forced exit while the game reads nothing ----


async def test_a_forced_exit_leaves_whole_lines_up_to_the_last_newline_as_documented() -> None:
    with open(os.path.join(ROOT, "protocol.md"), encoding="utf-8") as f:
        doc = " ".join(f.read().split())
    assert "a line is whole only with its `\\n`, so a reader drops whatever follows the last `\\n`" in doc
    async with bridge("--exit-grace-ms", "600", read=False) as b:
        # fullText: each delta carries the text so far, so lines outgrow what the pipe holds
        await b.send(
            INIT,
            rpc(2, "npc/create", {"npcId": "bard", "script": [{"text": words(20_000)}]}),
            rpc(3, "npc/respond", {"npcId": "bard", "prompt": "Sing."}),
        )
        await trio.sleep(1.0)  # the pipe is full: nothing reads it
        await b.close_stdin()
        assert await b.wait_exit(3.0) == 0
        b.start_reading()
        await b.eof.wait()
    whole, _, rest = bytes(b.raw).rpartition(b"\n")
    assert whole and all(json.loads(line) for line in whole.split(b"\n"))
    assert b"\n" not in rest and b.bad_lines in ([], [rest]), "at most the last line is cut short"


# ---- npc/cancel ----


def _events_after(b: object, response: dict[str, object], turn_id: str) -> list[str]:
    """The methods of ``turn_id``'s events written after ``response``."""
    messages: list[object] = b.messages  # type: ignore[attr-defined]
    at = next(i for i, msg in enumerate(messages) if msg is response)
    return [
        msg["method"]
        for msg in messages[at + 1 :]
        if isinstance(msg, dict) and msg.get("method") and msg["params"].get("turnId") == turn_id
    ]


async def test_after_cancels_response_a_fast_stream_sends_only_its_end() -> None:
    async with initialized_bridge() as b:
        b.keep_raw = False
        late: list[list[str]] = []
        for i in range(40):
            npc = f"bard{i}"
            await b.call("npc/create", {"npcId": npc, "script": [{"text": words(5000), "chunkMs": 0.2}]})
            turn_id = (await b.call("npc/respond", {"npcId": npc, "prompt": "Sing.", "fullText": False}))["turnId"]
            await b.until("the song's first words", lambda turn_id=turn_id: len(b.turn_events(turn_id)) > 3 or None)
            response = await b.call_raw("npc/cancel", {"npcId": npc})
            assert response["result"] == {"cancelled": [turn_id]}
            done = await b.wait_terminal(turn_id)
            assert done["params"]["error"]["code"] == "cancelled"
            after = _events_after(b, response, turn_id)
            assert after[-1] == "turn/failed"
            if any(method in LATE for method in after):
                late.append(after)
            b.forget()
        assert not late, f"{len(late)} of 40 cancelled turns went on after the response: {late[0]}"


async def test_a_cancel_sent_with_the_submit_stops_the_next_step_before_its_first_word() -> None:
    async with initialized_bridge() as b:
        late: list[list[str]] = []
        for i in range(20):
            npc = f"keeper{i}"
            script = [{"toolCalls": [{"name": "open_door"}]}, {"text": words(50)}]
            await b.call("npc/create", {"npcId": npc, "tools": [TOOL], "script": script})
            turn_id = (await b.call("npc/respond", {"npcId": npc, "prompt": "Open it."}))["turnId"]
            call = await b.wait_event("turn/toolCallRequested", turnId=turn_id)
            submit = {"npcId": npc, "callId": call["params"]["callId"], "output": "open"}
            await b.send(rpc(f"s{i}", "npc/submit", submit), rpc(f"c{i}", "npc/cancel", {"npcId": npc}))
            response = await b.response(f"c{i}")
            assert (await b.result(f"s{i}")) == {"accepted": True}
            await b.wait_terminal(turn_id)
            after = _events_after(b, response, turn_id)
            # the submit was accepted before the cancel: its completion may follow, then the end
            assert after[-1] == "turn/failed"
            if any(method in LATE for method in after):
                late.append(after)
            b.assert_well_formed(turn_id)
        assert not late, f"{len(late)} of 20 turns went on after the cancel's response: {late[0]}"
        await b.send(note("exit"))
        assert await b.wait_exit(5) == 0
