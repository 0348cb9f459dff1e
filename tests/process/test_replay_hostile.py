"""A recording is untrusted input (issue 32, items 3 and 12), through the real ``oam replay``
process: what a file claims is bounded by the recorded bridge's own limits before anything is
allocated or run, and a record of the wrong shape is no replay (exit status 2) with one line on
stderr naming the recording's line and what is wrong: never a traceback, never "diverged".
A short hypothesis run drives random records through the whole command
(``OAM_REPLAY_FUZZ_RUNS`` replays, default 30; the long run is ``tests/unit/test_replay_loader.py``
on the loader alone)."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.harness import BRIDGE_ROOT, DEADLINE, bridge_env

from .test_replay import replay

INIT = '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}'
# the replay, reporting its own peak RSS (not the bridge's: a child) on its last stderr line. On
# Linux VmHWM, the high-water mark of this process's own memory since exec: ru_maxrss keeps the
# forked parent's (pytest's, 900 MiB late in a full run) across exec
MEASURED = (
    "import resource, sys\n"
    "from bridge.hosts.replay import main\n"
    "code = main(sys.argv[1:])\n"
    "try:\n"
    "    hwm = next(int(x.split()[1]) * 1024 for x in open('/proc/self/status') if x.startswith('VmHWM:'))\n"
    "except OSError:\n"
    "    hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == 'darwin' else 1024)\n"
    "print('peak', hwm, file=sys.stderr)\n"
    "raise SystemExit(code)\n"
)
AS_LIMIT = 2 << 30  # the replay's address space in the bound tests: before the fix, MemoryError, not a full machine


def limited() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


async def record_a_dropped_line(tmp_path: Path) -> Path:
    """A real session on ``--max-line-bytes 1000``: initialize, a line of 2000 bytes (dropped,
    answered ``message_too_large``), stdin's end."""
    rec = tmp_path / "dropped.jsonl"
    with trio.fail_after(DEADLINE):
        await trio.run_process(
            [sys.executable, "-m", "bridge", "--engine", "scripted", "--max-line-bytes", "1000", "--record", str(rec)],
            cwd=BRIDGE_ROOT,
            env=bridge_env(),
            stdin=(INIT + "\n" + "x" * 2000 + "\n").encode(),
            capture_stdout=True,
        )
    assert any(x.get("tooLong") == 2000 for x in map(json.loads, rec.read_text().splitlines()))
    return rec


def resize_dropped_line(rec: Path, size: int) -> int:
    """The recording as if the dropped line had been ``size`` bytes (the record and the
    bridge's answer); the recording's line number of the record."""
    lines = rec.read_text().splitlines()
    at = 0
    for n, x in enumerate(lines):
        r = json.loads(x)
        if r.get("tooLong") == 2000:
            r["tooLong"], at = size, n + 1
        elif r.get("dir") == "out" and r["msg"].get("error", {}).get("data", {}).get("size") == 2000:
            r["msg"]["error"]["message"] = f"line of {size} bytes exceeds 1000"
            r["msg"]["error"]["data"]["size"] = size
        lines[n] = json.dumps(r, separators=(",", ":"))
    rec.write_text("\n".join(lines) + "\n")
    return at


def run_replay(path: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", MEASURED, str(path), "--timeout", "10", *args],
        cwd=BRIDGE_ROOT,
        env=bridge_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        preexec_fn=limited,
    )


def peak_of(r: subprocess.CompletedProcess[str]) -> int:
    return int(r.stderr.splitlines()[-1].split()[1])


# ---- item 3: what a recording says is bounded, and a too-long line is streamed ----


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_AS")
async def test_a_line_dropped_as_too_long_is_sent_again_streamed_not_held_in_memory(tmp_path: Path) -> None:
    rec = await record_a_dropped_line(tmp_path)
    resize_dropped_line(rec, 300_000_000)  # a game that wrote a 300 MB line; the bridge read and dropped it
    r = await trio.to_thread.run_sync(run_replay, rec)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "MATCHED: 2 lines sent, 2 lines of the bridge compared" in r.stdout, "the bridge was sent 300 MB again"
    # before: b"x" * 300_000_000, and its copy in the write: 600 MB and more
    assert peak_of(r) < 200 * 2**20, f"the replay peaked at {peak_of(r) / 2**20:.0f} MiB"


@pytest.mark.skipif(sys.platform == "win32", reason="RLIMIT_AS")
async def test_a_recording_that_claims_more_dropped_bytes_than_the_bound_is_no_replay(tmp_path: Path) -> None:
    rec = await record_a_dropped_line(tmp_path)
    at = resize_dropped_line(rec, 8_000_000_000)  # 14.7 GB of RSS before the fix, until it was killed
    r = await trio.to_thread.run_sync(run_replay, rec)
    assert r.returncode == 2, r.stdout + r.stderr
    said = r.stderr.splitlines()[:-1]
    assert said == [
        f"oam replay: {rec}: line {at}: a line dropped as too long, of 8000000000 bytes: a replay sends "
        f"1073741824 bytes of such lines at most, and the recording has 8000000000 up to here"
    ], r.stderr
    assert r.stdout == "" and peak_of(r) < 200 * 2**20


@pytest.mark.parametrize(
    ("size", "what"),
    [
        (900, "a line dropped as too long, of 900 bytes: not over the recorded maxLineBytes 1000"),
        (None, "a line of 1001 bytes, over the recorded maxLineBytes 1000: the bridge would have dropped it"),
    ],
)
async def test_a_line_the_recorded_limits_contradict_is_no_replay(tmp_path: Path, size: int | None, what: str) -> None:
    rec = await record_a_dropped_line(tmp_path)
    if size is not None:
        at = resize_dropped_line(rec, size)
    else:  # the game's line itself, longer than the bridge could have read
        lines = rec.read_text().splitlines()
        at = next(n for n, x in enumerate(lines, start=1) if '"tooLong"' in x)
        lines[at - 1] = json.dumps({"t": 0.1, "dir": "in", "read": 2, "line": "y" * 1001})
        rec.write_text("\n".join(lines) + "\n")
    r = await replay(rec)
    assert r.returncode == 2 and r.stdout == b""
    assert r.stderr.decode() == f"oam replay: {rec}: line {at}: {what}\n"


# ---- item 12: hostile record shapes ----

HOSTILE: list[tuple[str, str, str]] = [  # (a record at line 3, what the one line says after "line 3: ")
    ("5", "not a record this replayer reads: Expected `object`, got `int`", "int"),
    ("[1,2]", "not a record this replayer reads: Expected `object`, got `array`", "array"),
    ("null", "not a record this replayer reads: Expected `object`, got `null`", "null"),
    ('"in"', "not a record this replayer reads: Expected `object`, got `str`", "string"),
    ('{"dir":"out"}', 'a line of the bridge\'s ("dir":"out") without its "msg"', "out without msg"),
    ('{"dir":"out","msg":5}', '"msg" is int: the bridge writes JSON objects and batches (arrays)', "msg 5"),
    (
        '{"dir":"out","msg":{"id":1},"line":"x"}',
        'a line of the bridge\'s ("dir":"out") with \'line\'',
        "out with line",
    ),
    (
        '{"t":0,"dir":"in","read":2,"line":5}',
        "not a record this replayer reads: Expected `str`, got `int` - at `$.line`",
        "line 5",
    ),
    (
        '{"t":0,"dir":"in","read":2,"tooLong":"many"}',
        "not a record this replayer reads: Expected `int`, got `str` - at `$.tooLong`",
        "tooLong many",
    ),
    (
        '{"t":0,"dir":"in","signal":"TERM"}',
        "not a record this replayer reads: Expected `int`, got `str` - at `$.signal`",
        "signal TERM",
    ),
    ('{"t":0,"dir":"in","signal":-5}', "signal -5: the bridge records SIGTERM (15) and SIGINT (2) only", "signal -5"),
    (
        '{"t":0,"dir":"in","signal":99999}',
        "signal 99999: the bridge records SIGTERM (15) and SIGINT (2) only",
        "signal big",
    ),
    ('{"t":0,"dir":"in","signal":19}', "signal 19: the bridge records SIGTERM (15) and SIGINT (2) only", "SIGSTOP"),
    (
        '{"t":0,"dir":"in","eof":false}',
        "not a record this replayer reads: Invalid enum value False - at `$.eof`",
        "eof false",
    ),
    (
        '{"t":0,"dir":"in","read":2,"line":"a","tooLong":5000}',
        "a record of the game's side has one of line, tooLong, eof, signal, parentGone: line, tooLong",
        "line and tooLong",
    ),
    (
        '{"t":0,"dir":"in"}',
        "a record of the game's side has one of line, tooLong, eof, signal, parentGone: none of them",
        "bare in",
    ),
    ('{"t":0,"dir":"sideways"}', "not a record this replayer reads: Invalid enum value 'sideways' - at `$.dir`", "dir"),
    ('{"t":0}', 'no record this replayer knows (no "dir" and not the trailer)', "no dir"),
    ('{"t":0,"dir":"in","read":2,"line":"a\\nb"}', "a line with a newline in it: the bridge reads lines", "newline"),
    (
        '{"t":0,"dir":"in","read":2,"line":"\\ud800"}',
        "the line holds characters that are no bytes the game wrote",
        "lone surrogate",
    ),
    ('{"dir":"out","msg":' + "[" * 100_000 + "]" * 100_000 + "}", "JSON nested deeper than 200", "deep 100000"),
    ('{"dir":"out","msg":' + "[" * 300 + "]" * 300 + "}", "JSON nested deeper than 200", "deep 300"),
    (
        '{"end":true,"npcs":[1]}',
        "not a record this replayer reads: Expected `object | null`, got `array` - at `$.npcs`",
        "npcs list",
    ),
    (
        '{"end":true,"droppedLines":-1}',
        "not a record this replayer reads: Expected `int` >= 0 - at `$.droppedLines`",
        "dropped -1",
    ),
    ("{not json", "not JSON (", "garbage"),
]


@pytest.mark.parametrize(("record", "what"), [(r, w) for r, w, _ in HOSTILE], ids=[i for _, _, i in HOSTILE])
async def test_a_hostile_record_is_no_replay_with_one_line_naming_it(tmp_path: Path, record: str, what: str) -> None:
    rec = await record_a_dropped_line(tmp_path)
    lines = rec.read_text().splitlines()
    rec.write_text("\n".join([*lines[:2], record, *lines[2:]]) + "\n")
    r = await replay(rec)
    assert r.returncode == 2, r.stdout.decode() + r.stderr.decode()
    assert r.stdout == b""
    stderr = r.stderr.decode()
    assert stderr.startswith(f"oam replay: {rec}: line 3: ") and stderr.count("\n") == 1, stderr
    assert stderr == f"oam replay: {rec}: line 3: {what}\n" or what.endswith("(") and what in stderr, stderr


HOSTILE_HEADERS: list[tuple[dict[str, Any], str]] = [
    ({"options": [1, 2]}, "Expected `object | null`, got `array` - at `$.options`"),
    ({"options": {"max_line_bytes": "big"}}, "Expected `int | null`, got `str` - at `$.options.max_line_bytes`"),
    ({"options": {"max_line_bytes": 0}}, "Expected `int` >= 1 - at `$.options.max_line_bytes`"),
    (
        {"options": {"engine": "scripted\u0000--evil"}},
        "Expected `str` matching regex '^[^\\x00]*$' - at `$.options.engine`",
    ),
    ({"oamRecording": 2}, "Invalid enum value 2 - at `$.oamRecording`"),
]


@pytest.mark.parametrize(("change", "what"), HOSTILE_HEADERS)
async def test_a_hostile_header_is_no_replay_with_one_line(tmp_path: Path, change: dict[str, Any], what: str) -> None:
    rec = await record_a_dropped_line(tmp_path)
    lines = rec.read_text().splitlines()
    lines[0] = json.dumps({**json.loads(lines[0]), **change})
    rec.write_text("\n".join(lines) + "\n")
    r = await replay(rec)
    assert r.returncode == 2 and r.stdout == b""
    assert r.stderr.decode() == f"oam replay: {rec}: line 1 is not an oam-bridge recording header (format 1): {what}\n"


async def test_a_trailer_whose_npcs_hold_anything_still_replays(tmp_path: Path) -> None:
    """The trailer repeats what the game asked in ``npc/create`` before the bridge checked it:
    ``options`` may be a list there, an engine a number, in a recording the bridge did write."""
    rec = await record_a_dropped_line(tmp_path)
    lines = rec.read_text().splitlines()
    trailer = json.loads(lines[-1])
    trailer["npcs"] = {"a": {"engine": "llama", "options": [1]}, "b": 5, "c": {"engine": 7, "options": {"seed": []}}}
    lines[-1] = json.dumps(trailer)
    rec.write_text("\n".join(lines) + "\n")
    r = await replay(rec)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    assert "npc 'a' sampled on llama at temperature default without a seed" in r.stdout.decode()


async def test_a_game_line_with_bytes_that_are_not_utf8_still_replays(tmp_path: Path) -> None:
    """The recorder writes such a byte as ``\\udcXX``, a lone surrogate that msgspec refuses
    alone: the checked records must still read what the recorder wrote."""
    rec = tmp_path / "bytes.jsonl"
    with trio.fail_after(DEADLINE):
        await trio.run_process(
            [sys.executable, "-m", "bridge", "--engine", "scripted", "--record", str(rec)],
            cwd=BRIDGE_ROOT,
            env=bridge_env(),
            stdin=(INIT + "\n").encode() + b'{"jsonrpc":"2.0","id":2,"method":"npc/list"} \xff\xfe\n',
            capture_stdout=True,
        )
    assert b"\\udcff" in rec.read_bytes()
    r = await replay(rec)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
    assert "MATCHED: 2 lines sent, 2 lines of the bridge compared" in r.stdout.decode()


async def test_a_bridge_that_does_not_start_is_no_replay(tmp_path: Path) -> None:
    rec = await record_a_dropped_line(tmp_path)
    r = await replay(rec, "--", "--max-npcs", "many")  # the bridge refuses its options: exit 2 before any line
    assert r.returncode == 2, r.stdout.decode() + r.stderr.decode()
    stderr = r.stderr.decode()
    assert stderr.startswith("oam replay: the bridge did not start (exit status 2): ") and "many" in stderr, stderr


# ---- the attack pass, through the whole command ----

RUNS = int(os.environ.get("OAM_REPLAY_FUZZ_RUNS", "30"))  # each a replay process (and a bridge when it loads)

_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_keys = st.sampled_from(
    ["t", "dir", "read", "line", "tooLong", "eof", "signal", "parentGone", "msg", "end", "npcs", "droppedLines"]
)
_values = st.one_of(
    _json,
    st.sampled_from(["in", "out", True, 15, 2, 5000, 10**12, -1, INIT, "not json"]),
    st.builds(lambda d: {"jsonrpc": "2.0", "id": d, "result": {}}, _json),
)
_CREATE = '{"jsonrpc":"2.0","id":2,"method":"npc/create","params":{"npcId":"g","script":[{"text":"Halt! Who?"}]}}'
_RESPOND = '{"jsonrpc":"2.0","id":3,"method":"npc/respond","params":{"npcId":"g","prompt":"Hi"}}'
_VALID = [  # records a replay plays: the fuzz sends the bridge real requests, and expects answers
    {"t": 0.1, "dir": "in", "read": 2, "line": _CREATE},
    {"t": 0.1, "dir": "in", "read": 3, "line": _RESPOND},
    {"t": 0.1, "dir": "in", "read": 4, "line": "not json"},
    {"t": 0.1, "dir": "in", "read": 5, "tooLong": 5000},
    {"t": 0.2, "dir": "out", "msg": {"jsonrpc": "2.0", "id": 2, "result": {"npcId": "g"}}},
    {
        "t": 0.2,
        "dir": "out",
        "msg": {"jsonrpc": "2.0", "method": "turn/textDelta", "params": {"turnId": "t", "seq": 0}},
    },
    {"t": 0.3, "dir": "in", "eof": True},
    {"t": 0.3, "dir": "in", "signal": 15},
    {"t": 0.3, "dir": "in", "parentGone": True},
]
_records = st.one_of(
    st.sampled_from(_VALID).map(lambda d: json.dumps(d).encode()),
    st.builds(
        lambda d, extra: json.dumps({**d, **extra}).encode(),
        st.sampled_from(_VALID),
        st.dictionaries(_keys, _values, max_size=2),
    ),
    st.dictionaries(_keys, _values, max_size=5).map(lambda d: json.dumps(d).encode()),
    _json.map(lambda v: json.dumps(v).encode()),
    st.binary(max_size=60),
)


@settings(max_examples=RUNS, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(records=st.lists(_records, max_size=4))
def test_random_records_through_oam_replay_exit_0_1_or_2_without_a_traceback(
    tmp_path_factory: pytest.TempPathFactory, records: list[bytes]
) -> None:
    rec = tmp_path_factory.mktemp("fuzz") / "fuzz.jsonl"
    header = {"oamRecording": 1, "options": {"engine": "scripted", "max_line_bytes": 1000, "exit_grace_ms": 200}}
    first = json.dumps({"t": 0, "dir": "in", "read": 1, "line": INIT}).encode()  # the bridge's first line comes at once
    rec.write_bytes(
        b"\n".join([json.dumps(header).encode(), first, *(r.replace(b"\n", b" ") for r in records)]) + b"\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", MEASURED, str(rec), "--timeout", "2"],
        cwd=BRIDGE_ROOT,
        env=bridge_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode in (0, 1, 2), r.stdout + r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    if r.returncode == 2:
        assert len(r.stderr.splitlines()) == 2 and r.stderr.startswith("oam replay: "), r.stderr  # + the peak line
