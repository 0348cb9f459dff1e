"""Recording a session (``oam-bridge --record``) and replaying it against a fresh bridge
(``bridge/hosts/replay.py``), through real ``oam-bridge`` subprocesses and pipes: the recording
holds every line in and out, in order, and nothing else reaches stdout; a scripted session
with tool calls, a cancel and errors replays exactly; a changed script or a changed tool output
is reported at the recording's line where the bridge first answered differently; a llama
session at temperature 0 with a seed replays with the same texts."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.harness import BRIDGE_ROOT, DEADLINE, INVENTORY_TOOL, ROOT, bridge, bridge_env

REPLAY = [
    sys.executable,
    "-c",
    "import sys; from bridge.hosts.replay import main; raise SystemExit(main(sys.argv[1:]))",
]
OUT_RECORD = re.compile(rb'^\{"t":[0-9.]+,"dir":"out","msg":(.*)\}$')

SCENE = {  # the --script of the recorded sessions: in the recording's header
    "npcs": {
        "keeper": [
            {
                "toolCalls": [{"name": "check_inventory", "arguments": {"item": "ale"}}]
            },  # the bridge makes up the call id
            {"text": "We have 3 barrels of ale."},
            {"toolCalls": [{"name": "check_inventory", "arguments": {"item": "mead"}}]},  # cancelled while it waits
            {"error": "guardrail_violation", "message": "blocked"},
            {"text": "Back to work."},
        ],
    },
}


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in path.read_bytes().splitlines()]


async def replay(path: Path, *args: str, within: float = 60) -> subprocess.CompletedProcess[bytes]:
    """``oam replay PATH --timeout 5 ARGS`` of the tree under test (``OAM_BRIDGE_ROOT``)."""
    with trio.fail_after(within):
        return await trio.run_process(
            [*REPLAY, str(path), "--timeout", "5", *args],
            cwd=BRIDGE_ROOT,
            env=bridge_env(),
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


async def record_tavern_session(tmp_path: Path) -> Path:
    """A scripted session: a tool call answered, a turn cancelled while its call waits, a
    guardrail failure, an unknown NPC, a garbage line, a stale submit, a transcript; ended
    by stdin EOF."""
    script, rec = tmp_path / "scene.json", tmp_path / "session.jsonl"
    script.write_text(json.dumps(SCENE))
    async with bridge("--script", str(script), "--record", str(rec)) as c:
        await c.initialize()
        await c.call("npc/create", {"npcId": "keeper", "tools": [INVENTORY_TOOL]})
        r = await c.call("npc/respond", {"npcId": "keeper", "prompt": "Any ale?"})
        asked = await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
        await c.call("npc/submit", {"npcId": "keeper", "callId": asked["params"]["callId"], "output": {"count": 3}})
        assert (await c.wait_terminal(r["turnId"]))["params"]["text"] == "We have 3 barrels of ale."
        r2 = await c.call("npc/respond", {"npcId": "keeper", "prompt": "And mead?"})
        asked2 = await c.wait_event("turn/toolCallRequested", turnId=r2["turnId"])
        assert (await c.call("npc/cancel", {"npcId": "keeper"}))["cancelled"] == [r2["turnId"]]
        assert (await c.wait_terminal(r2["turnId"]))["params"]["error"]["code"] == "cancelled"
        stale = await c.call_raw(
            "npc/submit", {"npcId": "keeper", "callId": asked2["params"]["callId"], "output": {"count": 0}}
        )
        assert stale["error"]["data"]["code"] == "unknown_tool_call"
        _, failed = await c.turn("keeper", "Say something rude.")
        assert failed["params"]["error"]["code"] == "guardrail_violation"
        assert (await c.call_raw("npc/respond", {"npcId": "ghost", "prompt": "Boo"}))["error"]["data"][
            "code"
        ] == "unknown_npc"
        await c.send_raw(b"this is not json\n")
        _, done = await c.turn("keeper", "Thanks.")
        assert done["params"]["text"] == "Back to work."
        await c.call("npc/transcript", {"npcId": "keeper"})
        await c.finish(within=5)
    return rec


# ---- the recording ----


async def test_the_recording_holds_every_line_in_and_out_in_order_and_stdout_only_the_protocol(tmp_path: Path) -> None:
    rec = tmp_path / "r.jsonl"
    sent = [
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}',
        (
            b'{"jsonrpc":"2.0","id":2,"method":"npc/create","params":{"npcId":"g",'
            b'"script":[{"text":"Halt! Who goes there?"}],"options":{"temperature":0.5,"seed":9}}}'
        ),
        b'{"jsonrpc":"2.0","id":3,"method":"npc/respond","params":{"npcId":"g","prompt":"Hi"}}',
        b'[{"jsonrpc":"2.0","id":4,"method":"npc/create","params":{"npcId":"h"}},{"jsonrpc":"2.0","id":5,"method":"npc/list"}]',
        b"not json \xff",
    ]
    with trio.fail_after(DEADLINE):
        r = await trio.run_process(
            [sys.executable, "-m", "bridge", "--engine", "scripted", "--record", str(rec)],
            cwd=ROOT,
            stdin=b"\n".join(sent) + b"\n",
            capture_stdout=True,
            capture_stderr=True,
        )
    stdout = r.stdout.splitlines()
    assert all(json.loads(x) for x in stdout), "stdout carries protocol lines only"
    lines = rec.read_bytes().splitlines()
    header, trailer = json.loads(lines[0]), json.loads(lines[-1])
    assert (
        header["oamRecording"] == 1
        and header["options"]["engine"] == "scripted"
        and header["argv"] == ["--engine", "scripted"]
    )
    assert [m.group(1) for x in lines if (m := OUT_RECORD.match(x))] == stdout, "every line written, verbatim, in order"
    ins = [json.loads(x) for x in lines[1:-1] if b'"dir":"in"' in x]
    assert [x["line"].encode("utf-8", "surrogateescape") for x in ins if "line" in x] == sent, (
        "every line read, byte for byte"
    )
    assert ins[-1] == {"t": ins[-1]["t"], "dir": "in", "eof": True}
    times = [json.loads(x)["t"] for x in lines[1:-1]]
    assert times == sorted(times), "monotonic time stamps"
    assert trailer["end"] is True and trailer["droppedLines"] == 0
    assert trailer["npcs"] == {
        "g": {"engine": "scripted", "model": None, "options": {"temperature": 0.5, "seed": 9}},
        "h": {"engine": "scripted", "model": None, "options": {}},  # created in a batch; the engine auto chose
    }


async def test_a_signal_still_leaves_every_line_and_the_trailer_in_the_file(tmp_path: Path) -> None:
    rec = tmp_path / "r.jsonl"
    async with bridge("--record", str(rec)) as p:
        await p.initialize()
        await p.call("npc/create", {"npcId": "k", "script": [{"text": "la " * 2000}]})
        await p.call("npc/respond", {"npcId": "k", "prompt": "Sing", "fullText": False})
        await p.wait_event("turn/completed")
        p.process.send_signal(signal.SIGTERM)
        assert await p.process.wait() == 0
        await p.eof.wait()
    got = records(rec)
    assert got[-1]["end"] is True and {"t": got[-2]["t"], "dir": "in", "signal": signal.SIGTERM} == got[-2]
    assert (
        sum(1 for x in got if x.get("dir") == "out") == len(p.events) + len(p.responses) == 3 + 2002
    )  # 3 responses; started, 2000 deltas, completed


def test_a_record_file_that_cannot_be_written_leaves_the_bridge_serving_with_one_line(tmp_path: Path) -> None:
    # before issue 32: exit status 2 at start-up, every NPC of the game lost for a bug-report file
    path = tmp_path / "no" / "such" / "dir.jsonl"
    r = subprocess.run(
        [sys.executable, "-m", "bridge", "--engine", "scripted", "--record", str(path)],
        cwd=BRIDGE_ROOT,
        env=bridge_env(),
        input=b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n',
        capture_output=True,
        timeout=DEADLINE,
    )
    assert r.returncode == 0 and json.loads(r.stdout)["id"] == 1
    assert r.stderr.decode() == (
        f"oam-bridge: --record {path}: cannot write it (No such file or directory); "
        "the bridge goes on without recording\n"
    )


# ---- the replay ----


async def test_a_scripted_session_with_tool_calls_a_cancel_and_errors_replays_exactly(tmp_path: Path) -> None:
    rec = await record_tavern_session(tmp_path)
    (tmp_path / "scene.json").unlink()  # the replay takes the script from the recording
    got = records(rec)
    call_ids = {
        x["msg"]["params"]["callId"]
        for x in got
        if x.get("dir") == "out" and x["msg"].get("method") == "turn/toolCallRequested"
    }
    assert len(call_ids) == 2 and all(re.fullmatch(r"call_[0-9a-f]{12}", c) for c in call_ids), (
        "ids the bridge made up: the replay must map them"
    )
    r = await replay(rec)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    outs = sum(1 for x in got if x.get("dir") == "out")
    assert f"lines sent, {outs} lines of the bridge compared" in r.stdout.decode()


async def test_a_changed_script_is_reported_at_the_first_line_the_bridge_answers_differently(tmp_path: Path) -> None:
    rec = await record_tavern_session(tmp_path)
    lines = rec.read_text().splitlines()
    header = json.loads(lines[0])
    header["script"]["npcs"]["keeper"][1] = {"text": "We have 3 barrels of mead."}  # a new build says otherwise
    rec.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    first = next(n for n, x in enumerate(lines, start=1) if '"delta":"ale."' in x)
    r = await replay(rec)
    out = r.stdout.decode()
    assert r.returncode == 1, out
    assert f"DIVERGED at recording line {first}: the bridge answered differently" in out
    assert 'params.delta: "ale." -> "mead."' in out


async def test_a_changed_tool_output_is_reported_at_the_tool_call_completed_it_changes(tmp_path: Path) -> None:
    rec = await record_tavern_session(tmp_path)
    lines = rec.read_text().splitlines()
    submit = next(n for n, x in enumerate(lines) if "npc/submit" in x)
    record = json.loads(lines[submit])
    msg = json.loads(record["line"])
    assert msg["params"]["output"] == {"count": 3}
    msg["params"]["output"] = {"count": 4}  # the game answered 4 this time
    lines[submit] = json.dumps({**record, "line": json.dumps(msg)})
    rec.write_text("\n".join(lines) + "\n")
    first = next(n for n, x in enumerate(lines, start=1) if '"method":"turn/toolCallCompleted"' in x)
    r = await replay(rec)
    out = r.stdout.decode()
    assert r.returncode == 1, out
    assert f"DIVERGED at recording line {first}: the bridge answered differently" in out
    assert "params.output.count: 3 -> 4" in out


async def test_a_recorded_line_that_never_comes_is_reported_missing(tmp_path: Path) -> None:
    rec = await record_tavern_session(tmp_path)
    lines = rec.read_text().splitlines()
    header = json.loads(lines[0])
    header["script"]["npcs"]["keeper"][0]["delayMs"] = 5000  # the first step now takes longer than the timeout
    rec.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    first = next(n for n, x in enumerate(lines, start=1) if '"method":"turn/toolCallRequested"' in x)
    r = await replay(rec, "--timeout", "1")
    out = r.stdout.decode()
    assert r.returncode == 1, out
    assert f"DIVERGED at recording line {first}: a recorded line did not come" in out
    assert "actual: nothing within the timeout" in out


async def test_bridge_options_after_the_double_dash_override_the_recorded_ones(tmp_path: Path) -> None:
    rec = await record_tavern_session(tmp_path)
    r = await replay(rec, "--", "--max-npcs", "5")
    out = r.stdout.decode()
    assert r.returncode == 1, out
    assert "DIVERGED at recording line 3: the bridge answered differently" in out, (
        "initialize's answer: header, one line in, then it"
    )
    assert "result.limits.maxNpcs: 10000 -> 5" in out


async def test_two_npcs_streaming_at_once_replay_though_their_lines_interleave_otherwise(tmp_path: Path) -> None:
    rec = tmp_path / "two.jsonl"
    async with bridge(env={"OAM_RECORD": str(rec)}) as c:  # the environment variable records as --record does
        await c.initialize()
        for npc in ("a", "b"):
            await c.call("npc/create", {"npcId": npc, "script": [{"text": f"{npc} " * 40, "chunkMs": 1}]})
        ta = (await c.call("npc/respond", {"npcId": "a", "prompt": "Go"}))["turnId"]
        tb = (await c.call("npc/respond", {"npcId": "b", "prompt": "Go"}))["turnId"]
        await c.wait_terminal(ta)
        await c.wait_terminal(tb)
        await c.finish(within=5)
    turns = [
        x["msg"]["params"]["turnId"]
        for x in records(rec)
        if x.get("dir") == "out" and x["msg"].get("method") == "turn/textDelta"
    ]
    assert len(set(turns)) == 2 and turns != sorted(turns, key=turns.index), (
        "the two turns' deltas interleave in the recording"
    )
    r = await replay(rec)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()


def test_an_unreadable_recording_is_no_replay(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"jsonrpc":"2.0"}\n')
    r = subprocess.run([*REPLAY, str(bad)], cwd=ROOT, capture_output=True, timeout=DEADLINE)
    assert r.returncode == 2 and b"not an oam-bridge recording" in r.stderr


# ---- the llama engine: temperature 0 and a seed replay the same texts ----


@pytest.mark.model
async def test_a_llama_session_at_temperature_0_with_a_seed_replays_with_the_same_texts(tmp_path: Path) -> None:
    rec = tmp_path / "llama.jsonl"
    texts = []
    async with bridge("--engine", "llama", "--record", str(rec), guard=120) as c:
        await c.initialize()
        await c.call(
            "npc/create",
            {
                "npcId": "greta",
                "persona": {"name": "Greta", "role": "the keeper of the Rusty Flagon"},
                "options": {"temperature": 0, "seed": 7, "maxTokens": 24},
            },
        )
        for prompt in ("Hello! What's your name?", "What do you serve here?"):
            _, done = await c.turn("greta", prompt)
            assert done["method"] == "turn/completed", done
            texts.append(done["params"]["text"])
        await c.finish(within=5)
    assert all(texts)
    header = records(rec)[0]
    assert header["llamaModel"]["bytes"] > 0, "the recording names the model"
    with trio.fail_after(180):
        r = await trio.run_process(
            [*REPLAY, str(rec), "--timeout", "60"], cwd=ROOT, capture_stdout=True, capture_stderr=True, check=False
        )
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()


# ---- the README's section, as printed ----


def test_the_readme_recording_example_runs_as_printed(tmp_path: Path) -> None:
    readme = Path(ROOT, "docs", "recording.md").read_text()
    section = readme.split("## Recording and replaying a session", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```sh\n(.*?)^```$", section, re.S | re.M)
    assert block, "no ```sh block in the README's section"
    script = (
        block.group(1)
        .replace(".venv/bin/python", sys.executable)
        .replace(".venv/bin/oam-bridge", f"{sys.executable} -m bridge")
    )
    r = subprocess.run(
        ["bash", "-c", script],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": ROOT},
    )
    assert "MATCHED: 3 lines sent, 9 lines of the bridge compared" in r.stdout, r.stdout + r.stderr
    said = re.search(r"DIVERGED at recording line \d+: the bridge answered differently", r.stdout)
    assert said, r.stdout
    assert f"`{said.group(0)}`" in section, f"the section says another line than every run prints: {said.group(0)}"
    lines = (tmp_path / "session.jsonl").read_text().splitlines()
    n = int(said.group(0).split()[4].rstrip(":"))
    assert json.loads(lines[n - 1])["msg"]["params"]["delta"] == "there?", "the line of the last turn/textDelta"
    assert 'params.delta: "here?" -> "there?"' in r.stdout, r.stdout
    assert r.stdout.rstrip().endswith("exit status 1"), r.stdout
