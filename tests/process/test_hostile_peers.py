"""A game that misbehaves, through the real ``oam-bridge`` subprocess over real pipes: it
stops reading, floods, sends a batch of thousands, signals at start-up, closes stdin at once.
Whatever it does, every line the bridge writes is one whole line of JSON, each turn's seq stays
gap-free, every request gets its one answer, and the bridge exits 0 in bounded time.

Each test failed on commit d14face, before the fixes; ``OAM_BRIDGE_ROOT=<a checkout of it>``
runs this file's bridges from that tree (tests/support/harness.py). Time limits here are hang
guards, not performance checks.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest
import trio

from tests.support.harness import INIT, INVENTORY_TOOL, bridge, error_code, note, rpc, words
from tests.support.procfs import rss_kib, wait_idle

# ---- one writer: lines are never spliced ----


async def test_no_response_is_ever_written_inside_another_line() -> None:
    # The recipe that found it (initialize; a batch of 2,000 npc/list; then "after"), repeated, plus
    # the other shapes that spliced: a large transcript and errors echoing large ids.
    big_save = {
        "version": 1,
        "config": {"npcId": "big"},
        "turns": [
            [{"role": "user", "content": "x" * 2000}, {"role": "assistant", "content": "y" * 2000}] for _ in range(100)
        ],
    }
    big_ids = [rpc("i" * 20_000 + str(k), "no/such/method") for k in range(10)]
    chunk: list[Any] = [INIT, rpc("restore", "npc/restore", {"save": big_save})]
    rounds = 6
    for r in range(rounds):
        chunk.append([rpc(r * 10_000 + i, "npc/list") for i in range(2000)])
        chunk.append(rpc(f"after{r}", "npc/list"))
        chunk.append(rpc(f"transcript{r}", "npc/transcript", {"npcId": "big"}))
        chunk.append(rpc(f"after-transcript{r}", "npc/list"))
        chunk.append(big_ids)
        chunk.append(rpc(f"after-ids{r}", "npc/list"))
    async with bridge() as b:
        await b.send(*chunk)
        await b.response(f"after-ids{rounds - 1}")
        await b.request("last", "npc/list")
        assert b.bad_lines == [], f"{len(b.bad_lines)} stdout lines are not JSON, e.g. {b.bad_lines[0][:200]!r}"
        singles = {m["id"]: m for m in b.messages if isinstance(m, dict)}
        batches = [m for m in b.messages if isinstance(m, list)]
        for r in range(rounds):
            for name in ("after", "after-transcript", "after-ids"):
                assert "result" in singles.get(f"{name}{r}", {}), f"{name}{r} is not a line of its own"
            assert len(singles[f"transcript{r}"]["result"]["turns"]) == 100
        list_batches = [x for x in batches if len(x) == 2000]
        assert len(list_batches) == rounds, "each batch response is one line"
        for r, batch in enumerate(list_batches):
            assert sorted(x["id"] for x in batch) == [r * 10_000 + i for i in range(2000)]
        assert len(b.lines) == len(b.messages) == 2 + rounds * 6 + 1


async def test_unicode_line_separators_are_written_escaped() -> None:
    odd = "one\u2028two\u2029three\u0085four"
    async with bridge() as b:
        await b.send(INIT)
        await b.request(2, "npc/create", {"npcId": odd, "script": [{"text": f"{odd} {odd}"}]})
        turn_id = (await b.request(3, "npc/respond", {"npcId": odd, "prompt": odd}))["turnId"]
        done = await b.wait_terminal(turn_id)
        await b.send(rpc(4, "npc/transcript", {"npcId": "ghost" + odd}))
        assert error_code(await b.response(4)) == "unknown_npc"
        assert done["params"]["text"] == f"{odd} {odd}" and done["params"]["npcId"] == odd
        raw = bytes(b.raw)
        for ch in ("\u2028", "\u2029", "\u0085"):
            assert ch.encode() not in raw, f"U+{ord(ch):04X} written unescaped"
        assert len(raw.decode().splitlines()) == raw.count(b"\n") == len(b.lines)


# ---- a game that stopped reading ----


@pytest.mark.parametrize("how", ["sigterm", "stdin_eof"])
async def test_the_bridge_exits_within_2s_although_the_game_stopped_reading(how: str) -> None:
    async with bridge(read=False) as b:
        await b.send(
            INIT,
            rpc(2, "npc/create", {"npcId": "bard", "script": [{"text": words(20_000)}]}),
            rpc(3, "npc/respond", {"npcId": "bard", "prompt": "Sing."}),
        )
        await trio.sleep(2)  # stdout is full by now: nothing reads it
        assert b.process.returncode is None
        if how == "sigterm":
            b.process.send_signal(signal.SIGTERM)
        else:
            await b.close_stdin()
        try:
            status = await b.wait_exit(3.0)  # decided: <= 2 s; the rest is slack for a busy machine
        except trio.TooSlowError:
            raise AssertionError(f"still running 3 s after {how} while stdout is not read") from None
        assert status == 0
        b.start_reading()  # what was written before the exit is whole lines of JSON
        await b.eof.wait()
        assert not [x for x in b.bad_lines if x is not b.bad_lines[-1]], "only a cut-off last line may be incomplete"


async def test_seq_is_gap_free_when_cancelled_while_output_is_backed_up() -> None:
    async with bridge(read=False, guard=20) as b:
        await b.send(
            INIT,
            rpc(2, "npc/create", {"npcId": "bard", "script": [{"text": words(20_000)}]}),
            rpc(3, "npc/respond", {"npcId": "bard", "prompt": "Sing."}),
        )
        await wait_idle(b.pid)  # the turn is blocked on the full output
        await b.send(rpc(4, "npc/cancel", {"npcId": "bard"}))
        await wait_idle(b.pid)
        b.start_reading()
        turn_id = (await b.result(3))["turnId"]
        assert (await b.result(4))["cancelled"] == [turn_id]
        done = await b.wait_terminal(turn_id)
        assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "cancelled"
        assert len(b.turn_events(turn_id)) < 20_000, "the turn was cancelled while output was backed up"
        b.assert_well_formed(turn_id)


async def test_output_held_for_a_slow_reader_is_bounded_in_bytes() -> None:
    async with bridge(read=False, guard=20) as b:
        # fullText: every delta carries the text so far, so lines grow to ~96 KB.
        await b.send(
            INIT,
            rpc(2, "npc/create", {"npcId": "bard", "script": [{"text": " ".join(f"w{i:030d}" for i in range(3000))}]}),
        )
        await wait_idle(b.pid)
        before = rss_kib(b.pid)
        await b.send(rpc(3, "npc/respond", {"npcId": "bard", "prompt": "Sing."}))
        await wait_idle(b.pid)  # blocked on the output bound
        held = rss_kib(b.pid) - before
        assert held < 48 * 1024, f"{held} KiB held for a reader that does not read (bound: 8 MiB of lines)"
        b.start_reading()
        limits = (await b.result("init"))["limits"]
        assert limits.get("maxOutboundBytes") == 8 * 1024 * 1024


# ---- a flood ----


async def test_overload_answers_requests_and_keeps_every_notification() -> None:
    async with bridge("--max-pending-lines", "8") as b:
        await b.send(INIT)
        await b.result("init")
        await b.request(
            2,
            "npc/create",
            {
                "npcId": "a",
                "tools": [INVENTORY_TOOL],
                "script": [{"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]}],
            },
        )
        turn_id = (await b.request(3, "npc/respond", {"npcId": "a", "prompt": "Ale?", "toolTimeoutMs": 0}))["turnId"]
        await b.wait_event("turn/toolCallRequested", turnId=turn_id, callId="c1")
        # One write: a create whose model load stalls processing, then a flood of requests
        # (some with invalid ids), the cancel notification, more requests, and exit.
        flood: list[Any] = [rpc("load", "npc/create", {"npcId": "L", "engine": "llama"})]
        flood += [rpc(100 + i, "npc/list") for i in range(40)]
        bad_ids = [
            b'{"jsonrpc":"2.0","id":{"bad":1},"method":"npc/list"}\n',
            b'{"jsonrpc":"2.0","id":true,"method":"npc/list"}\n',
            b'{"jsonrpc":"2.0","id":[1],"method":"npc/list"}\n',
        ]
        flood += bad_ids
        flood.append(note("npc/cancel", {"npcId": "a"}))
        flood += [rpc(200 + i, "npc/list") for i in range(40)]
        flood.append(note("exit"))
        await b.send(*flood)
        try:
            assert await b.wait_exit(8) == 0
        except trio.TooSlowError:
            raise AssertionError("the exit notification sent during a flood did not end the process") from None
        await b.eof.wait()
        assert b.bad_lines == []
        for id_ in ["load", *range(100, 140), *range(200, 240)]:
            assert len(b.responses_to(id_)) == 1, f"request {id_} got {len(b.responses_to(id_))} responses"
        overloaded = [r for r in b.messages if isinstance(r, dict) and error_code(r) == "overloaded"]
        assert overloaded, "past 8 pending lines some requests are answered overloaded"
        for r in overloaded:
            data = r["error"]["data"]
            assert (
                data["retryable"] is True
                and isinstance(data.get("retryAfterMs"), int)
                and "retryable_after_ms" not in data
            )
        echoed = [r for r in b.messages if isinstance(r, dict) and "id" in r and r["id"] in ({"bad": 1}, True, [1])]
        assert echoed == [], "invalid ids are never echoed"
        assert len([r for r in b.messages if isinstance(r, dict) and "id" in r and r["id"] is None]) == len(bad_ids)
        done = await b.wait_terminal(turn_id)
        assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "cancelled", (
            "the cancel notification was applied"
        )
        withdrawn = [e for e in b.turn_events(turn_id) if e["method"] == "turn/toolCallWithdrawn"]
        assert [e["params"]["reason"] for e in withdrawn] == ["cancelled"]


# ---- signals and the end of stdin ----


async def test_sigterm_right_after_initialize_always_exits_zero() -> None:
    statuses: list[int] = []

    async def one() -> None:
        async with bridge(read=True) as b:
            await b.send(INIT)
            await b.result("init")
            b.process.send_signal(signal.SIGTERM)
            statuses.append(await b.wait_exit(5))

    with trio.fail_after(40):
        for _ in range(4):  # 20 spawns, 5 at a time
            async with trio.open_nursery() as nursery:
                for _ in range(5):
                    nursery.start_soon(one)
    assert statuses == [0] * 20


# found by the long fuzz run (bench/fuzz_protocol.py, 1,000,000 inputs)
@pytest.mark.parametrize("how", ["delete", "restore"])
async def test_turns_of_a_deleted_or_replaced_npc_still_end_when_stdin_closes_at_once(how: str) -> None:
    # The fuzzer's recipe, reduced: turns queued on an NPC, the NPC deleted (or replaced by
    # a restore), and stdin's end, all in one write. The old NPC leaves the registry at
    # once, but its worker still has to end its turns; exit waited only for the NPCs still
    # registered, so their terminal events were dropped ("exiting: dropped N bytes").
    async with bridge() as b:
        await b.send(INIT)
        await b.result("init")
        await b.request("c", "npc/create", {"npcId": "a", "script": [{"text": words(50), "chunkMs": 5}] * 8})
        ids = [f"r{i}" for i in range(8)]
        last = (
            rpc("d", "npc/delete", {"npcId": "a"})
            if how == "delete"
            else rpc("d", "npc/restore", {"save": {"version": 1, "config": {"npcId": "a"}, "turns": []}})
        )
        await b.send(*[rpc(i, "npc/respond", {"npcId": "a", "prompt": "hi"}) for i in ids], last)
        await b.close_stdin()
        assert await b.wait_exit(5) == 0
        await b.eof.wait()
        for i in ids:
            turn_id = (await b.result(i))["turnId"]
            b.assert_well_formed(turn_id)
        assert b"dropped" not in bytes(b.stderr), bytes(b.stderr)
