"""``--record`` where the file cannot be written (issue 32, item 11), through the real
``oam-bridge`` process: a recording never stops the bridge. A path that cannot be opened (a
missing folder, a folder, a FIFO that no process reads) and the first failed write (``/dev/full``,
a full disk: here the file size limit ``RLIMIT_FSIZE``) each say so in one line on stderr, no
traceback, and the bridge serves on; after a failed write the recorder queues nothing more.
A FIFO with a reader still records."""

from __future__ import annotations

import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.harness import BRIDGE_ROOT, DEADLINE, bridge_command, bridge_env, bridge_process

from .test_replay import replay

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="FIFOs, /dev/full and RLIMIT_FSIZE are POSIX")

INIT = b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
SESSION = INIT + (
    b'{"jsonrpc":"2.0","id":2,"method":"npc/create",'
    b'"params":{"npcId":"g","script":[{"text":"Halt! Who goes there?"}]}}\n'
    b'{"jsonrpc":"2.0","id":3,"method":"npc/respond","params":{"npcId":"g","prompt":"Hello!"}}\n'
)


async def serve(*args: str, stdin: bytes = SESSION, within: float = DEADLINE) -> tuple[int, list[dict[str, Any]], str]:
    """The bridge with ``args`` on the scripted engine, fed ``stdin`` then its end: exit
    status, the lines it wrote (each JSON), its stderr."""
    with trio.fail_after(within):  # the FIFO's hang, before the fix: forever
        r = await trio.run_process(
            bridge_command(*args),
            cwd=BRIDGE_ROOT,
            env=bridge_env(),
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    return r.returncode, [json.loads(x) for x in r.stdout.splitlines()], r.stderr.decode()


def served_the_session(lines: list[dict[str, Any]]) -> bool:
    done = [x for x in lines if x.get("method") == "turn/completed"]
    return len(done) == 1 and done[0]["params"]["text"] == "Halt! Who goes there?"


def one_line(stderr: str, path: Path | str, what: str) -> None:
    assert stderr.count("\n") == 1 and "Traceback" not in stderr, stderr
    assert stderr.startswith(f"oam-bridge: --record {path}: {what}"), stderr


@pytest.mark.parametrize("where", ["missing folder", "a folder"])
async def test_a_path_that_cannot_be_opened_leaves_the_bridge_serving_with_one_line(tmp_path: Path, where: str) -> None:
    path = tmp_path / "no" / "such" / "dir.jsonl" if where == "missing folder" else tmp_path
    status, lines, stderr = await serve("--record", str(path))
    assert status == 0 and served_the_session(lines)
    one_line(stderr, path, "cannot write it (")
    assert stderr.rstrip().endswith("the bridge goes on without recording")


async def test_the_environment_variable_on_an_unwritable_path_does_not_cost_the_game_its_npcs(tmp_path: Path) -> None:
    path = tmp_path / "read-only" / "bug.jsonl"  # a game that ships OAM_RECORD, on a machine without that folder
    with trio.fail_after(DEADLINE):
        r = await trio.run_process(
            bridge_command(),
            cwd=BRIDGE_ROOT,
            env=bridge_env({"OAM_RECORD": str(path)}),
            stdin=SESSION,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert r.returncode == 0 and served_the_session([json.loads(x) for x in r.stdout.splitlines()])
    one_line(r.stderr.decode(), path, "cannot write it (No such file or directory)")


async def test_a_fifo_that_no_process_reads_does_not_block_start_up(tmp_path: Path) -> None:
    fifo = tmp_path / "rec.fifo"
    os.mkfifo(fifo)
    status, lines, stderr = await serve("--record", str(fifo), within=DEADLINE)  # before: blocked in open()
    assert status == 0 and served_the_session(lines)
    one_line(stderr, fifo, "cannot write it (a FIFO that no process reads)")


async def test_a_fifo_with_a_reader_records_and_the_recording_replays(tmp_path: Path) -> None:
    fifo, copy = tmp_path / "rec.fifo", tmp_path / "copy.jsonl"
    os.mkfifo(fifo)
    ready = threading.Event()

    def cat() -> None:
        with open(fifo, "rb") as src:  # blocks until the bridge opens it for writing
            ready.set()
            copy.write_bytes(src.read())

    reader = threading.Thread(target=cat, daemon=True)
    reader.start()
    try:
        await trio.sleep(0.2)  # the reader is in open(): the bridge's open finds it
        status, lines, stderr = await serve("--record", str(fifo))
        assert status == 0 and served_the_session(lines) and stderr == "", stderr
    finally:
        if not ready.is_set():  # the bridge never opened it: free the reader
            os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        await trio.to_thread.run_sync(reader.join, DEADLINE)
    assert json.loads(copy.read_bytes().splitlines()[-1])["end"] is True
    r = await replay(copy)
    assert r.returncode == 0 and "MATCHED: 3 lines sent" in r.stdout.decode(), r.stdout.decode() + r.stderr.decode()


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="no /dev/full")
async def test_dev_full_says_so_in_one_line_without_a_traceback() -> None:
    status, lines, stderr = await serve("--record", "/dev/full")
    assert status == 0 and served_the_session(lines)
    one_line(stderr, "/dev/full", "stopped recording (No space left on device)")


# ---- a full disk: the file size limit makes every write past it fail (EFBIG) ----

LIMITED = (  # the bridge, with its file size limit set first (the test runner's own stays)
    "import os, resource, sys; resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[1]),) * 2); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])"
)


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(x.split()[1]) * 1024 for x in f if x.startswith("VmRSS:"))


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/status")
async def test_a_full_disk_stops_the_recording_once_and_drops_what_it_queued(tmp_path: Path) -> None:
    rec = tmp_path / "full.jsonl"
    argv = [sys.executable, "-c", LIMITED, "2048", *bridge_command("--record", str(rec))[1:]]
    words = 10_000  # about 150 MB of turn/textDelta lines (each carries the text so far)
    async with bridge_process(argv, env=bridge_env(), guard=60) as p:
        await p.initialize()  # the header and this answer pass 2048 bytes: the write fails
        with trio.fail_after(DEADLINE):
            while b"record" not in p.stderr:
                await trio.sleep(0.05)
        await p.call("npc/create", {"npcId": "k", "script": [{"text": "la " * words}]})
        before = rss_bytes(p.pid)
        _, done = await p.turn("k", "Sing")
        assert done["method"] == "turn/completed" and len(done["params"]["text"]) == 3 * words
        grown = rss_bytes(p.pid) - before
        p.forget()
        await p.finish()
    # before: the recorder queued the turn's lines for a file it would never write, up to 64 MiB
    assert grown < 40 * 1024 * 1024, f"the bridge grew {grown / 2**20:.0f} MiB after the recording stopped"
    stderr = p.stderr.decode()
    one_line(stderr, rec, "stopped recording (File too large); the file ends here, the bridge goes on without it")
    assert rec.stat().st_size <= 2048


async def test_a_create_line_nested_too_deeply_does_not_end_the_recording(tmp_path: Path) -> None:
    """Found by the attack pass: the recorder reads ``npc/create`` lines for its trailer, and
    one nested deeper than Python's recursion limit raised in its thread (not a ValueError), so
    the rest of the session was never written: a game's garbage cost the bug report."""
    rec = tmp_path / "deep.jsonl"
    deep = b'{"jsonrpc":"2.0","id":2,"method":"npc/create","params":{"npcId":"g","x":' + b"[" * 5000 + b"]" * 5000
    stdin = INIT + deep + b"}}\n" + b'{"jsonrpc":"2.0","id":3,"method":"npc/list"}\n'
    status, lines, stderr = await serve("--record", str(rec), stdin=stdin)
    assert status == 0 and [x.get("id") for x in lines] == [1, None, 3] and stderr == "", stderr  # too deep: no id
    records = [json.loads(x) for x in rec.read_bytes().splitlines()]
    assert records[-1]["end"] is True and sum(x.get("dir") == "out" for x in records) == 3
    r = await replay(rec)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
