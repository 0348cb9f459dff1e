"""Long sessions: a turn over a long history, many turns' memory, exact token counts while the
window slides, and slow checks at create that must not hold the other NPCs; through the real
``oam-bridge`` subprocess over real pipes.

Each test failed on commit d14face, before the fixes; ``OAM_BRIDGE_ROOT=<a checkout of it>``
runs this file's bridges from that tree (tests/support/harness.py). Time limits here are hang
guards, not performance checks.
"""

from __future__ import annotations

from typing import Any

import trio

from tests.support.harness import INIT, bridge, rpc, words
from tests.support.procfs import rss_kib


async def test_npc_list_answers_while_a_turn_over_20000_restored_turns_runs() -> None:
    turns = [
        [{"role": "user", "content": f"hello {i}"}, {"role": "assistant", "content": f"hi {i}"}] for i in range(20_000)
    ]
    async with bridge(guard=20) as b:
        await b.send(INIT)
        await b.result("init")
        assert (
            await b.request(2, "npc/restore", {"save": {"version": 1, "config": {"npcId": "elder"}, "turns": turns}})
        )["turns"] == 20_000
        turn_id = (await b.request(3, "npc/respond", {"npcId": "elder", "prompt": "Remember me?"}))["turnId"]
        try:
            with trio.fail_after(3):
                npcs = (await b.request(4, "npc/list"))["npcs"]
        except trio.TooSlowError:
            raise AssertionError("npc/list got no answer within 3 s while one turn ran over a long history") from None
        assert npcs[0]["npcId"] == "elder"
        with trio.fail_after(5):
            done = await b.wait_terminal(turn_id)
        assert done["method"] == "turn/completed"
        b.assert_well_formed(turn_id)


async def test_turns_leave_no_memory_behind_after_reset_and_delete() -> None:
    # The recipe that found it (500 turns with 20 KB prompts, then npc/reset and npc/delete), as
    # 200 turns with 50 KB prompts (the same 10 MB of prompts, faster), three rounds. Freed
    # memory is reused by the next round, so RSS must not grow round by round; on d14face
    # each round kept its 10 MB (and the turns slowed down quadratically).
    async with bridge(guard=20) as b:
        b.keep_raw = False
        await b.send(INIT)
        await b.result("init")
        rss: list[int] = []
        for rnd in range(3):
            npc = f"n{rnd}"
            await b.request(f"create{rnd}", "npc/create", {"npcId": npc, "script": [{"text": "ok"}] * 200})
            for start in range(0, 200, 25):
                ids = [f"{rnd}:{i}" for i in range(start, start + 25)]
                await b.send(*[rpc(i, "npc/respond", {"npcId": npc, "prompt": f"{i} " + "x" * 50_000}) for i in ids])
                for i in ids:
                    await b.wait_terminal((await b.result(i))["turnId"])
            await b.request(f"reset{rnd}", "npc/reset", {"npcId": npc})
            await b.request(f"delete{rnd}", "npc/delete", {"npcId": npc})
            b.forget()  # the test's own memory, not the bridge's
            rss.append(rss_kib(b.pid))
        grown = rss[2] - rss[0]
        assert grown < 6 * 1024, f"RSS grew {grown} KiB over two rounds of 200 turns (KiB after each round: {rss})"


async def test_input_tokens_stay_exact_while_the_window_slides_over_a_long_history() -> None:
    # The scripted engine counts a step's prompt from the previous one (the messages that
    # changed only) instead of word-counting the whole window every step (bench_history:
    # CPU per turn 3x from history 0 to 100). Its usage.inputTokens must stay the full
    # count of the prompt the step saw: the visible turns (contextTrimmed says where they
    # start) and the turn's own messages, over trimming, failed and cancelled turns, a
    # restore, and a reset.
    from bridge.core._messages import NpcConfig
    from bridge.core.agent import render_instructions
    from bridge.engines.base import Message
    from bridge.engines.scripted import _count_prompt

    config = {"npcId": "a", "instructions": "You are Greta, the tavern keeper. Be brief."}
    instructions = render_instructions(NpcConfig(npc_id="a", instructions=config["instructions"]))
    script: list[dict[str, Any]] = [{"text": words(40 + k % 7)} for k in range(200)]
    script[50] = {"error": "refusal"}
    script[90] = {"text": "slow", "delayMs": 5000}
    async with bridge(guard=60) as b:
        await b.send(INIT)
        await b.request(1, "npc/create", {**config, "script": script})
        history: list[list[dict[str, Any]]] = []
        seen = trimmed = 0
        for k in range(160):
            if k == 120:  # a restore of the same history: the engine counts it afresh
                await b.request(
                    f"restore{k}",
                    "npc/restore",
                    {"save": {"version": 1, "config": {**config, "script": script[121:]}, "turns": history}},
                )
            prompt = f"Turn {k}: " + words(k % 30)
            turn_id = (await b.request(f"r{k}", "npc/respond", {"npcId": "a", "prompt": prompt}))["turnId"]
            if k == 90:
                await b.wait_event("turn/started", turnId=turn_id)
                await b.request(f"x{k}", "npc/cancel", {"npcId": "a"})
            done = await b.wait_terminal(turn_id)
            trims = [e["params"] for e in b.turn_events(turn_id) if e["method"] == "turn/contextTrimmed"]
            dropped = trims[-1]["droppedTurns"] if trims else 0
            trimmed = max(trimmed, dropped)
            if done["method"] == "turn/failed":
                continue
            seen += 1
            visible = [Message(role=x["role"], content=x["content"]) for t in history[dropped:] for x in t]
            expected = _count_prompt(instructions, [*visible, Message(role="user", content=prompt)], [])
            assert done["params"]["usage"]["inputTokens"] == expected, f"turn {k} (first visible turn {dropped})"
            history.append(
                [{"role": "user", "content": prompt}, {"role": "assistant", "content": done["params"]["text"]}]
            )
        assert seen == 158 and trimmed > 40, "the window slid over most of the history"


async def test_checking_a_large_tool_schema_at_create_does_not_stall_other_npcs() -> None:
    # A tool's schema is checked at create, at a cost that grows with its size: 4,000
    # properties held the loop (and every NPC's stream) for seconds. The check runs in a worker
    # thread: the bard keeps streaming while the smith is created. How long a check takes is
    # the machine's: the schema is doubled until its check takes long enough to tell a stalled
    # stream from a pause, and the stream's pace while it ran is compared with its own pace
    # just before, not with a rate this machine may not reach.
    async with bridge(guard=120) as b:
        await b.send(INIT)
        await b.result("init")
        await b.request(2, "npc/create", {"npcId": "bard", "script": [{"text": words(30_000), "chunkMs": 5}]})
        turn_id = (await b.request(3, "npc/respond", {"npcId": "bard", "prompt": "sing", "fullText": False}))["turnId"]
        await b.wait_event("turn/textDelta", turnId=turn_id)
        for size in (4_000, 8_000, 16_000, 32_000, 64_000):
            t0, before = trio.current_time(), len(b.turn_events(turn_id))
            await trio.sleep(0.5)
            pace = (len(b.turn_events(turn_id)) - before) / (trio.current_time() - t0)  # deltas a second, undisturbed
            properties = {f"p{i}": {"type": "string", "maxLength": 9} for i in range(size)}
            forge = {"name": "forge", "parameters": {"type": "object", "properties": properties}}
            t0, before = trio.current_time(), len(b.turn_events(turn_id))
            await b.request(f"smith{size}", "npc/create", {"npcId": f"smith{size}", "tools": [forge]})
            took = trio.current_time() - t0
            streamed = len(b.turn_events(turn_id)) - before
            if took >= 0.3:
                break
        assert took >= 0.3, f"{size:,} properties were checked in {took:.2f} s: too fast to tell a stall from a pause"
        assert b.turn_events(turn_id)[-1]["method"] == "turn/textDelta", "the bard was still singing"
        assert streamed >= pace * took / 4, (
            f"{streamed} deltas in the {took:.2f} s the create took, {pace:.0f} a second before it: the stream stalled"
        )
