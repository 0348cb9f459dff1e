"""A recording cut short replays up to its end (issue 32, item 4), through real processes: the
main use of ``--record`` is a player's crash, and a bridge that is killed leaves a file without
a trailer, maybe with its last line cut in half. Every recorded line must come and match; a line
the recording does not have counts as written after its end, unless it cannot be (an event of
a turn whose end is recorded); the replay says ``MATCHED up to the recording's end, where the
recorded bridge stopped``."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import trio

from tests.support.harness import bridge

from .test_replay import replay

CUT_SHORT = "MATCHED up to the recording's end, where the recorded bridge stopped"


def outs(rec: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [x["msg"] for x in rec if x.get("dir") == "out"]


async def test_a_bridge_killed_while_five_npcs_stream_replays_up_to_the_recordings_end(tmp_path: Path) -> None:
    rec = tmp_path / "crash.jsonl"
    async with bridge("--record", str(rec), guard=60) as p:
        await p.initialize()
        turns = []
        for i in range(5):
            await p.call("npc/create", {"npcId": f"n{i}", "script": [{"text": f"la{i} " * 600, "chunkMs": 5}]})
        for i in range(5):  # one write each, while the others stream: the replay must wait as the game did
            turns.append((await p.call("npc/respond", {"npcId": f"n{i}", "prompt": "Sing"}))["turnId"])
            await p.wait_event("turn/textDelta", turnId=turns[-1], seq=3)
        await trio.sleep(0.5)
        p.process.send_signal(signal.SIGKILL)  # a crash: no trailer, nothing flushed at exit
        assert await p.process.wait() == -signal.SIGKILL
    got = [json.loads(x) for x in lines_of(rec)]
    assert not any(x.get("end") for x in got), "a killed bridge writes no trailer"
    ended = {m["params"]["turnId"] for m in outs(got) if m.get("method") in ("turn/completed", "turn/failed")}
    streamed = {m["params"]["turnId"] for m in outs(got) if m.get("method") == "turn/textDelta"}
    assert len(streamed - ended) == 5, "every NPC was still streaming when the bridge was killed"
    r = await replay(rec, "--timeout", "10")
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode()
    assert CUT_SHORT in out and "the recording has no trailer" in out, out


async def record_a_crash(tmp_path: Path) -> Path:
    """Three NPCs started by one write: ``short`` (10 words, 1 ms apart) finishes, ``fast`` and
    ``slow`` (100 words each, 20 ms apart) are halfway when the bridge is SIGKILLed."""
    rec = tmp_path / "crash.jsonl"
    async with bridge("--record", str(rec), guard=60) as p:
        await p.initialize()
        for npc, words, ms in (("short", 10, 1), ("fast", 100, 20), ("slow", 100, 20)):
            await p.call("npc/create", {"npcId": npc, "script": [{"text": f"{npc} " * words, "chunkMs": ms}]})
        await p.send(
            *(
                {"jsonrpc": "2.0", "id": npc, "method": "npc/respond", "params": {"npcId": npc, "prompt": "Go"}}
                for npc in ("short", "fast", "slow")
            )
        )
        await p.wait_event("turn/textDelta", npcId="slow", seq=40)
        p.process.send_signal(signal.SIGKILL)
        await p.process.wait()
    return rec


def lines_of(rec: Path) -> list[str]:
    """The recording's whole lines (a line the kill cut in half left out)."""
    data = rec.read_text()
    return data.splitlines() if data.endswith("\n") else data.splitlines()[:-1]


def delta_line(lines: list[str], npc: str, seq: int) -> int:
    """The recording's line number of ``npc``'s ``turn/textDelta`` with ``seq``."""
    return next(
        n
        for n, x in enumerate(lines, start=1)
        if '"turn/textDelta"' in x and f'"npcId":"{npc}"' in x and f'"seq":{seq}}}' in x
    )


async def test_a_crash_replays_on_a_machine_where_one_npc_runs_ahead_of_the_others(tmp_path: Path) -> None:
    """Deterministic: in the replay ``fast`` streams 20 times faster than it did (as a player's
    machine and a developer's differ), so it writes its deltas past the recording's end while
    ``slow``'s recorded ones are still coming. Before the fix: ``DIVERGED ...: the bridge wrote a
    line the recording does not have``, exit status 1."""
    rec = await record_a_crash(tmp_path)
    got = [json.loads(x) for x in lines_of(rec)]
    ended = {m["params"]["npcId"] for m in outs(got) if m.get("method") == "turn/completed"}
    assert ended == {"short"} and not any(x.get("end") for x in got)
    lines = rec.read_text().split("\n")
    n = next(n for n, x in enumerate(lines) if '"dir":"in"' in x and "npc/create" in x and "fast" in x)
    record = json.loads(lines[n])
    create = json.loads(record["line"])
    create["params"]["script"][0]["chunkMs"] = 1  # was 20
    lines[n] = json.dumps({**record, "line": json.dumps(create)})
    rec.write_text("\n".join(lines))
    r = await replay(rec, "--timeout", "10")
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode()
    assert CUT_SHORT in out, out


async def test_a_recording_cut_in_half_mid_line_replays_without_that_line(tmp_path: Path) -> None:
    rec = await record_a_crash(tmp_path)
    lines = lines_of(rec)
    rec.write_text("".join(x + "\n" for x in lines[:-1]) + lines[-1][: len(lines[-1]) // 2])
    r = await replay(rec, "--timeout", "10")
    out = r.stdout.decode()
    assert r.returncode == 0, out + r.stderr.decode()
    assert f"its last line (line {len(lines)}) was cut in half when the bridge stopped: left out" in out, out
    assert CUT_SHORT in out, out


async def test_a_recording_cut_short_still_reports_a_line_answered_differently(tmp_path: Path) -> None:
    rec = await record_a_crash(tmp_path)
    lines = lines_of(rec)
    changed = delta_line(lines, "slow", 9)
    lines[changed - 1] = lines[changed - 1].replace('"delta":"slow "', '"delta":"slower "')
    rec.write_text("".join(x + "\n" for x in lines))
    r = await replay(rec, "--timeout", "10")
    out = r.stdout.decode()
    assert r.returncode == 1, out
    assert f"DIVERGED at recording line {changed}: the bridge answered differently" in out, out
    assert 'params.delta: "slower " -> "slow "' in out


async def test_a_recording_cut_short_still_reports_an_extra_event_of_a_turn_whose_end_it_holds(
    tmp_path: Path,
) -> None:
    rec = await record_a_crash(tmp_path)
    lines = lines_of(rec)
    del lines[delta_line(lines, "short", 5) - 1]  # short's turn/completed is recorded: its seq 5 cannot be "later"
    rec.write_text("".join(x + "\n" for x in lines))
    r = await replay(rec, "--timeout", "10")
    out = r.stdout.decode()
    assert r.returncode == 1, out
    assert "the bridge wrote a line the recording does not have" in out and '"seq":5}' in out, out
