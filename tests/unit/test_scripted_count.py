"""The scripted engine's prompt count (``usage.inputTokens``) follows an NPC's prompts step by
step, counting only the messages that changed: here it is checked against a count of the
whole prompt over random histories, windows and turns."""

from __future__ import annotations

import random

import pytest

from bridge.core import _messages as m
from bridge.engines import scripted
from bridge.engines.base import Message, ToolCall, ToolSpec
from bridge.engines.scripted import _count_prompt, _PromptCount
from tests.support.agent import Sink, history, make_npc, respond, running

TOOLS = [ToolSpec(name="t", description="d e f", parameters={"type": "object"})]


def a_message(rng: random.Random) -> Message:
    if rng.random() < 0.1:
        return Message(
            role="assistant",
            content="x " * rng.randint(0, 5),
            tool_calls=[ToolCall(id="c", name="t", arguments={"a": "b" * rng.randint(0, 40)})],
        )
    return Message(
        role=rng.choice(["user", "assistant", "tool"]), content=" ".join("w" for _ in range(rng.randint(0, 12)))
    )


def test_the_incremental_prompt_count_equals_the_whole_count_whatever_the_prompts_do() -> None:
    rng = random.Random(5)
    for _ in range(200):
        counted = _PromptCount()
        history = [a_message(rng) for _ in range(rng.randint(0, 60))]
        start = rng.randint(0, len(history))
        for _ in range(50):
            r = rng.random()
            if r < 0.3:
                history.append(a_message(rng))  # a turn committed
            elif r < 0.45:
                start = min(len(history), start + rng.randint(0, 5))  # the window moves on
            elif r < 0.55:
                start = max(0, start - rng.randint(0, 5))  # it reaches back (fewer tools shown)
            elif r < 0.6:
                history, start = [a_message(rng) for _ in range(rng.randint(0, 30))], 0  # restored
            elif r < 0.65 and history:
                i = rng.randrange(len(history))  # an equal message, another object
                history[i] = Message(role=history[i].role, content=history[i].content, tool_calls=history[i].tool_calls)
            elif r < 0.7 and history:
                history[rng.randrange(len(history))] = a_message(rng)  # a different one
            elif r < 0.73 and history:
                history.append(history[rng.randrange(len(history))])  # one object twice
            prompt = history[start:] + [a_message(rng) for _ in range(rng.randint(0, 3))]  # + the turn's own
            instructions = rng.choice(["a b", "a b c", ""])
            tools = rng.choice([[], TOOLS, [TOOLS[0], TOOLS[0]]])
            assert counted.count(instructions, prompt, tools) == _count_prompt(instructions, prompt, tools)
            assert counted.messages == prompt and len(counted.totals) == len(prompt) + 1


@pytest.mark.parametrize("size", [100, 10_000])
async def test_a_step_word_counts_only_the_messages_new_to_its_prompt(
    size: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    # usage.inputTokens of every step once word-counted the whole visible window (bench:
    # CPU per turn 3x from history 0 to 100); now the agent's counts and the engine's
    # together touch the turn's new messages only.
    counted: list[Message] = []
    real = scripted._count_message

    def counting(message: Message) -> int:
        counted.append(message)
        return real(message)

    monkeypatch.setattr(scripted, "_count_message", counting)
    engine = scripted.ScriptedEngine(context_size=4096)
    sink = Sink()
    npc = make_npc(engine, sink)
    npc.set_history(history(size))
    async with running(npc):
        await sink.terminal(respond(npc, "warm up"))  # the window, counted once after a restore
        counted.clear()
        seen = []
        for i in range(20):
            done = await sink.terminal(respond(npc, f"turn {i}"))
            assert isinstance(done, m.TurnCompleted)
            seen.append((done.usage.input_tokens, engine.requests[-1].messages))
    # per turn: the agent counts the prompt and the answer, the engine the new prompt's last
    # two messages (the previous answer, the prompt)
    assert len(counted) == 20 * 4
    monkeypatch.undo()
    assert [n for n, _ in seen] == [_count_prompt(npc.instructions, msgs, []) for _, msgs in seen]
    assert min(len(msgs) for _, msgs in seen) > 200, "a full window"
