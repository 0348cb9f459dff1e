"""The context window of one NPC: its committed history (complete turns only), what each
turn costs in tokens, and which newest turns fit beside a step's prompt.

Token accounting (trimming): the prompt of a step is counted as
``base(instructions, tools shown) + sum(tokens of each visible turn) + tokens of the
turn's own messages so far``, where a turn's (or a batch of messages') tokens are
``count_tokens("", msgs, []) - count_tokens("", [], [])``. Each committed turn is counted
once, from the messages the turn counted as it went; restored turns are counted lazily,
newest first, only as far back as the window reaches (``COUNT_CHUNK`` per worker-thread
hop on slow engines); ``base`` is cached per tool set. This is exact on engines whose
count is additive over messages (the scripted engine) and a close estimate on chat
templates (llama, native), whose boundary tokens it may count slightly differently.
The visible window (first visible turn, its running total) moves with the history, so a
step costs amortised O(1) counting, and its message list is one slice of the history's
messages kept flat (a copy of references in C, no Python loop over the window):
O(new messages) per turn, whatever the history's length. The window is the longest run of
newest turns that fits ``context_size - maxTokens (or 256)``, exactly what dropping the
oldest turn one at a time until it fits gave.

Only ``commit`` adds to the history and only ``replace`` swaps it; both are synchronous,
so a turn either enters the history whole or not at all.
"""

from __future__ import annotations

import itertools
from array import array
from collections.abc import Sequence
from typing import Any

import trio

from bridge.engines.base import Engine, GenerationOptions, Message, ToolSpec, counts_block
from bridge.errors import BridgeError

# How many restored turns one lazy count covers (one worker-thread hop for slow engines).
COUNT_CHUNK = 64
# The answer's room when the game sets no maxTokens.
DEFAULT_ANSWER_ROOM = 256

CountJob = tuple[str, list[Message], list[ToolSpec]]  # count_tokens' arguments


def _count_batch(engine: Engine, jobs: Sequence[CountJob]) -> list[int]:
    return [engine.count_tokens(i, msgs, tools) for i, msgs, tools in jobs]


async def count_jobs(engine: Engine, jobs: Sequence[CountJob], *, blocking: bool) -> list[int]:
    """Run ``engine.count_tokens`` on each job: inline for engines whose count is cheap,
    else in one worker-thread hop, so a model's tokenizer never runs on the event loop."""
    if not blocking:
        return _count_batch(engine, jobs)
    return await trio.to_thread.run_sync(_count_batch, engine, jobs)


async def count_text_tokens(engine: Engine, text: str) -> int:
    """Tokens ``text`` costs as a user message (what ``tokens/count`` answers)."""
    jobs: list[CountJob] = [("", [Message(role="user", content=text)], []), ("", [], [])]
    with_text, empty = await count_jobs(engine, jobs, blocking=counts_block(engine))
    return max(0, with_text - empty)


def prompt_budget(context_size: int, options: GenerationOptions) -> int:
    """Tokens a prompt may take: the context less the room the answer may need."""
    return context_size - (options.max_tokens or DEFAULT_ANSWER_ROOM)


def check_fits(fixed: int, visible: int, budget: int, context_size: int) -> None:
    """Raise ``context_size_exceeded`` unless a prompt of ``fixed`` tokens (instructions,
    tools, the turn's own messages) and ``visible`` ones of history fits ``budget``."""
    if fixed + visible > budget:
        raise BridgeError(
            "context_size_exceeded",
            f"prompt needs {fixed} tokens; the window leaves {budget}",
            promptTokens=fixed,
            contextSize=context_size,
        )


def fit(counts: Sequence[int | None], start: int, total: int, fixed: int, budget: int) -> tuple[int, int, int | None]:
    """Move a window (its first turn ``start``, the tokens ``total`` of the turns from there
    on) to the longest run of newest turns that fits ``budget`` beside ``fixed`` tokens.

    ``counts`` are the turns' tokens, ``None`` where not counted yet; every turn from
    ``start`` on must be counted. Returns ``(start, total, missing)``: ``missing`` is None
    when the window is final, else the index of the turn to count before it may grow on."""
    while fixed + total > budget and start < len(counts):
        c = counts[start]
        assert c is not None, "turns from the window's start on are counted"
        total -= c
        start += 1
    while start > 0 and fixed + total <= budget:
        c = counts[start - 1]
        if c is None:
            return start, total, start - 1
        if fixed + total + c > budget:
            break
        start -= 1
        total += c
    return start, total, None


class Window:
    """One NPC's history and its token counts (see the module docstring)."""

    # Slots: one per NPC, thousands of them idle.
    __slots__ = (
        "engine",
        "turns",
        "_blocking",
        "_turn_tokens",
        "_start",
        "_visible",
        "_epoch",
        "_base",
        "_empty",
        "_messages",
        "_turn_at",
    )

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._blocking = counts_block(engine)  # once: an isinstance on a protocol costs microseconds
        self.turns: list[list[Message]] = []
        self._turn_tokens: list[int | None] = []  # parallel to turns; None: not counted yet
        self._start = 0  # first visible turn; every turn from here on is counted
        self._visible = 0  # sum of _turn_tokens[_start:]
        self._epoch = 0  # bumped when the history is replaced: stale counts are dropped
        self._base: dict[tuple[Any, ...], int] = {}
        self._empty: int | None = None
        # every turn's messages in order, so a window's messages are one slice
        self._messages: list[Message] = []
        self._turn_at = array("q")  # parallel to turns: where each starts in _messages

    @property
    def span(self) -> tuple[int, int]:
        """(first visible turn, tokens of the turns from there on), as the last fit or commit
        left them."""
        return self._start, self._visible

    def replace(self, turns: list[list[Message]]) -> None:
        """Replace the history (restore). O(len(turns)); no turn is counted until a prompt
        needs it."""
        self.turns = turns
        self._messages = list(itertools.chain.from_iterable(turns))
        self._turn_at = array("q", itertools.accumulate(map(len, turns), initial=0))
        self._turn_at.pop()  # where a next turn would start
        self._turn_tokens = [None] * len(turns)
        self._start = len(turns)
        self._visible = 0
        self._epoch += 1

    def commit(self, working: list[Message], tokens: int) -> None:
        """Append one complete turn (``tokens``: what its messages cost). The newest turn is
        always visible until the next fit."""
        self.turns.append(working)
        self._turn_at.append(len(self._messages))
        self._messages.extend(working)
        self._turn_tokens.append(tokens)
        self._visible += tokens

    def messages_from(self, first: int) -> list[Message]:
        """The messages of the turns from ``first`` on: one slice, copied in C."""
        return self._messages[self._turn_at[first] :] if first < len(self._turn_at) else []

    async def _count(self, jobs: Sequence[CountJob]) -> list[int]:
        return await count_jobs(self.engine, jobs, blocking=self._blocking)

    async def _empty_tokens(self) -> int:
        if self._empty is None:
            (self._empty,) = await self._count([("", [], [])])
        return self._empty

    async def base_tokens(self, instructions: str, tools: list[ToolSpec]) -> int:
        """Tokens of the instructions and the tools shown, before any message (cached)."""
        key = (instructions, *((t.name, t.description) for t in tools))
        n = self._base.get(key)
        if n is None:
            (n,) = await self._count([(instructions, [], tools)])
            if len(self._base) >= 32:  # old world views and tool sets
                self._base.clear()
            self._base[key] = n
        return n

    async def messages_tokens(self, msgs: list[Message]) -> int:
        """Tokens ``msgs`` add to a prompt."""
        empty = await self._empty_tokens()
        (n,) = await self._count([("", msgs, [])])
        return max(0, n - empty)

    def fit(self, fixed: int, budget: int) -> int | None:
        """``fit`` on this history, kept: synchronous, so the window is consistent when it
        returns. Returns ``None`` when done, else the index of a turn to count first."""
        self._start, self._visible, missing = fit(self._turn_tokens, self._start, self._visible, fixed, budget)
        return missing

    async def _count_turns(self, hi: int) -> None:
        """Count the uncounted turns in ``[hi - COUNT_CHUNK + 1, hi]`` (one thread hop)."""
        epoch = self._epoch
        lo = max(0, hi - COUNT_CHUNK + 1)
        idx = [i for i in range(lo, hi + 1) if self._turn_tokens[i] is None]
        empty = await self._empty_tokens()
        counts = await self._count([("", self.turns[i], []) for i in idx])
        if self._epoch != epoch:
            return  # the history was replaced meanwhile: these counts are for another one
        for i, n in zip(idx, counts, strict=True):
            self._turn_tokens[i] = max(0, n - empty)

    async def fit_counted(self, fixed: int, budget: int) -> tuple[int, int]:
        """(first visible turn, tokens of the visible turns), counting turns as the window
        reaches them: consistent with ``turns`` until the caller's next checkpoint."""
        while True:
            missing = self.fit(fixed, budget)
            if missing is None:
                return self.span
            await self._count_turns(missing)
