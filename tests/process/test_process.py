"""The real ``oam-bridge`` subprocess over real pipes: lifecycle, stdout purity, faults."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import trio
import trio.testing

from bridge import EngineRegistry, Limits, ScriptedEngine, Server
from tests.support.harness import DEADLINE, INVENTORY_TOOL, ROOT, Client, RpcError, bridge


async def test_stdin_eof_ends_running_turns_and_exits_zero() -> None:
    async with bridge() as c:
        await c.initialize()
        await c.call(
            "npc/create",
            {
                "npcId": "k",
                "tools": [INVENTORY_TOOL],
                "script": [{"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]}],
            },
        )
        r = await c.call("npc/respond", {"npcId": "k", "prompt": "Ale?"})
        await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
        await c.finish(within=5)
        with trio.fail_after(5):
            await c.eof.wait()
        done = await c.wait_terminal(r["turnId"])
        assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "cancelled"
        withdrawn = await c.wait_event("turn/toolCallWithdrawn", turnId=r["turnId"])
        assert withdrawn["params"]["reason"] == "turn_ended"
        c.assert_well_formed(r["turnId"])


async def test_after_shutdown_requests_get_shutting_down_and_exit_ends_the_process() -> None:
    async with bridge() as p:
        await p.initialize()
        assert await p.call("shutdown", {}) is None
        with pytest.raises(RpcError) as e:
            await p.call("npc/list", {})
        assert e.value.code == "shutting_down"
        await p.notify("exit")
        assert await p.wait_exit(5) == 0


async def test_sigterm_exits_zero() -> None:
    async with bridge() as p:
        await p.initialize()
        p.process.send_signal(signal.SIGTERM)
        assert await p.wait_exit(5) == 0


async def test_stdout_carries_only_protocol_even_when_code_prints() -> None:
    # Everything that writes to fd 1 or sys.stdout after start-up must land on stderr.
    noisy = (
        "import os, sys, bridge.engines.scripted as s\n"
        "orig = s._count\n"
        "def loud(t):\n"
        "    print('PRINTED', flush=True); os.write(1, b'RAW-FD1\\n'); return orig(t)\n"
        "s._count = loud\n"
        "from bridge.jsonrpc.main import main; raise SystemExit(main(['--engine', 'scripted']))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", noisy],
        input=b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\n'
        b'{"jsonrpc":"2.0","id":2,"method":"npc/create","params":{"npcId":"k","instructions":"hi"}}\n'
        b'{"jsonrpc":"2.0","id":3,"method":"tokens/count","params":{"npcId":"k","text":"a b c"}}\n',
        capture_output=True,
        cwd=ROOT,
        timeout=20,
    )
    assert proc.returncode == 0
    lines = proc.stdout.splitlines()
    assert [json.loads(x)["id"] for x in lines] == [1, 2, 3]
    assert b"PRINTED" in proc.stderr and b"RAW-FD1" in proc.stderr


async def test_reader_thread_path_serves_the_same_protocol() -> None:
    async with bridge("--stdio", "threads") as c:
        await c.initialize()
        await c.call("npc/create", {"npcId": "k", "script": [{"text": "Hello traveller."}]})
        _, done = await c.turn("k", "Hi")
        assert done["params"]["text"] == "Hello traveller."
        await c.finish(within=5)


async def test_oversize_and_garbage_lines_get_errors_and_the_bridge_keeps_serving() -> None:
    async with bridge("--max-line-bytes", "1000") as c:
        await c.initialize()
        await c.send_raw(b"x" * 5000 + b"\n")
        await c.send_raw(b"\xff\xfe garbage\n")
        await c.send_raw(
            b'{"jsonrpc":"2.0","id":"big","method":"tokens/count","params":{"text":"' + b"a " * 2000 + b'"}}\n'
        )
        assert (await c.call("npc/list", {})) == {"npcs": []}
        errors = [r["error"]["data"]["code"] for r in c.responses if "error" in r]
        assert errors == ["message_too_large", "parse_error", "message_too_large"]


async def test_script_file_from_the_command_line(tmp_path: Path) -> None:
    script = tmp_path / "scene.json"
    script.write_text(json.dumps({"npcs": {"guard": [{"text": "Halt!"}]}, "default": [{"text": "Hm?"}]}))
    async with bridge("--script", str(script)) as c:
        await c.initialize()
        await c.call("npc/create", {"npcId": "guard"})
        await c.call("npc/create", {"npcId": "cat"})
        assert (await c.turn("guard", "Hello"))[1]["params"]["text"] == "Halt!"
        assert (await c.turn("cat", "Hello"))[1]["params"]["text"] == "Hm?"


async def test_past_the_pending_bound_requests_get_overloaded_and_none_is_lost() -> None:
    server = Server(
        EngineRegistry(default="scripted", scripted=ScriptedEngine()),
        Limits(max_pending_lines=2, max_outbound_bytes=256),
    )
    ours, theirs = trio.testing.lockstep_stream_pair()
    c = Client(ours, ours)
    with trio.fail_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, theirs, theirs)
            await c.send_raw(b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}\n')
            n = 300
            burst = b"".join(b'{"jsonrpc":"2.0","id":%d,"method":"npc/list"}\n' % i for i in range(1, n + 1))
            nursery.start_soon(c.send_raw, burst)  # nobody reads yet: the queues fill up
            await trio.testing.wait_all_tasks_blocked()
            nursery.start_soon(c.run_reader)
            with trio.fail_after(10):
                while len(c.responses) < n + 1:
                    await trio.sleep(0.01)
            ids = sorted(r["id"] for r in c.responses)
            assert ids == list(range(n + 1)), "every request gets exactly one response"
            codes = {r["error"]["data"]["code"] for r in c.responses if "error" in r}
            assert codes == {"overloaded"}
            assert all(r["error"]["data"]["retryable"] for r in c.responses if "error" in r)
            server.stop()
            nursery.cancel_scope.cancel()


@pytest.mark.parametrize("content", [None, "{not json", '[{"text": 5}]'])
def test_a_bad_script_file_ends_with_one_clear_line_and_no_traceback(tmp_path: Path, content: str | None) -> None:
    path = tmp_path / "scene.json"
    if content is not None:
        path.write_text(content)
    r = subprocess.run(
        [sys.executable, "-m", "bridge", "--engine", "scripted", "--script", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2 and r.stdout == ""
    assert r.stderr.startswith(f"oam-bridge: --script {path}: ") and r.stderr.count("\n") == 1
    assert "Traceback" not in r.stderr
