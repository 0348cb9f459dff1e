"""Continuous batching: every NPC's step on one model decodes in one llama.cpp context.

One scheduler thread owns a context with one KV sequence per *slot*
(``llama_context_params.n_seq_max``, ``kv_unified``: the sequences share one pool of KV
cells, so one NPC may use the whole window and a prefix can be shared without copying).
A slot belongs to an NPC while its tokens are resident, so a returning NPC reads only its
new line. Each pass of the scheduler decodes

- the last token of every step that is generating (one token each, with logits), in one
  batch, and hands each step the logits of its row (``Job.choose``: each step has its own
  sampler chain and grammar), but for steps held so that NPCs who asked before their
  first word get theirs sooner (``_holds``: through a burst of short prompts, else at
  most ``hold`` prompt tokens at a time); then
- up to ``prefill_chunk`` tokens of the oldest prompt still being read (a prompt that
  ends in the pass ends the reading: that NPC's first token comes first), in a batch of
  their own (``_decode`` says why). A new step joins at the next pass; a long
prompt is read a chunk per pass while the others keep streaming; a cancelled step leaves
at the next pass, keeping what it read.

Where a step's prompt starts:

- its NPC's slot, when the slot still holds a prefix of the prompt;
- a saved state (``StateCache``): the NPC's own, written when its slot's cells left the
  pool, or any other that starts alike;
- any resident slot that shares a longer prefix (the same instructions, lore or rules):
  ``llama_memory_seq_cp`` shares those cells (unified KV), so NPCs whose prompts start
  alike read the common text once. Looked for again when the step reads its first chunk
  (``_share_late``): NPCs admitted together have read their prompts by then, oldest first.

KV cells are admitted, not fought over: a step starts when its prompt and its longest
answer fit beside the running steps, giving idle slots' cells back (their state saved) as
needed; otherwise it waits for a running step to end. Idle slots give their cells back in
any case once the rows decoded beside them would have paid for it (``_tidy``): llama.cpp's
attention looks at every cell up to the highest in use, for every row. Cells a slot shares
with the slot it copied them from count once (``Slot.lent``), and that slot is not evicted
to make room.

A job is in one ``Phase`` at a time and moves only as ``MOVES`` allows: waiting for a slot,
reading its prompt (its start restored, shared or kept in place when it is admitted), then a
step generating, and one of three ends. What a pass does with a job follows from its phase;
``Job.pending`` and ``Job.next`` are only the tokens it reads.
"""

from __future__ import annotations

import ctypes
import enum
import logging
import math
import threading
import time
from collections import deque
from typing import Any, Protocol

from bridge.engines.llama._states import SavedState, StateCache
from bridge.errors import BridgeError

log = logging.getLogger("oam_bridge.llama")

# An idle slot gives its cells back (``Scheduler._tidy``) once the rows decoded beside it
# since it went idle and the prompt rows still to read come to TIDY_ROWS, at most
# TIDY_TOKENS of them a pass; a slot of no one with at least TIDY_ROWS tokens is kept in RAM
# when its cells go.
TIDY_ROWS = 64
TIDY_TOKENS = 1024
# Once idle slots have left, the slots still resident move to the start of the pool
# (``Scheduler._pack``) if they hold at most 1/PACK_RATIO of the most tokens the pool held
# since the last move.
PACK_RATIO = 2


class Phase(enum.Enum):
    """Where a job is. Only the scheduler's thread moves a job (``Job.move``); another thread
    reads the phase once ``Job.done`` is set, and it is then an end (``ENDS``)."""

    WAITING = "waiting"  # submitted, no slot yet (Scheduler._queue, then _waiting)
    READING = "reading"  # on a slot (Scheduler._active): the prompt's rest is read, a chunk a pass
    GENERATING = "generating"  # a step whose prompt is read: ``Job.next`` is decoded each pass
    ENDED = "ended"  # the result is set: a prewarm's prompt is read, or a step ended
    STOPPED = "stopped"  # the stop flag was seen: the result is None, or the step's cancelled()
    FAILED = "failed"  # the error is set


# The moves a job may make. A prewarm goes from READING to ENDED; only a step generates.
MOVES: dict[Phase, frozenset[Phase]] = {
    Phase.WAITING: frozenset({Phase.READING, Phase.STOPPED, Phase.FAILED}),
    Phase.READING: frozenset({Phase.GENERATING, Phase.ENDED, Phase.STOPPED, Phase.FAILED}),
    Phase.GENERATING: frozenset({Phase.ENDED, Phase.STOPPED, Phase.FAILED}),
    Phase.ENDED: frozenset(),
    Phase.STOPPED: frozenset(),
    Phase.FAILED: frozenset(),
}
ENDS = frozenset(p for p, to in MOVES.items() if not to)


class PhaseError(RuntimeError):
    """A move ``MOVES`` does not allow: a bug of the scheduler (its thread then fails every
    job with ``generation_failed``)."""

    def __init__(self, npc_id: str, start: Phase, to: Phase) -> None:
        super().__init__(f"a job of {npc_id!r} cannot go from {start.value} to {to.value}")
        self.npc_id, self.start, self.to = npc_id, start, to


class Step(Protocol):
    """What a generating job does with its logits (``_worker.Sampling``)."""

    def choose(self, ctx: Any, idx: int) -> int | None:
        """The next token to evaluate, or None when the step has ended."""

    def end(self) -> Any:
        """The step's result once ``choose`` returned None, or when stopped."""

    def cancelled(self) -> Any:
        """The result when the step is stopped while generating."""


class Job:
    """One step (``step`` set) or prewarm (``step`` None) submitted to the scheduler.
    ``result``/``error`` are set once, with the move to an end (``ENDS``), then ``done`` is
    set. ``slot`` is set while the job is READING or GENERATING, ``next`` while it is
    GENERATING."""

    __slots__ = (
        "npc_id",
        "tokens",
        "stop",
        "keep_last",
        "step",
        "reserve",
        "phase",
        "slot",
        "pending",
        "cached",
        "shared",
        "next",
        "result",
        "error",
        "done",
        "admitted",
        "asked",
        "spoke",
        "held",
    )

    def __init__(
        self, npc_id: str, tokens: list[int], stop: threading.Event, keep_last: bool, step: Step | None, reserve: int
    ) -> None:
        self.npc_id, self.tokens, self.stop, self.keep_last = npc_id, tokens, stop, keep_last
        self.step = step
        self.reserve = reserve  # KV cells the step may still need past its prompt
        self.phase = Phase.WAITING
        self.slot: Slot | None = None
        self.pending: list[int] = []  # prompt tokens not read yet
        self.cached = 0  # prompt tokens reused from a slot or a saved state
        self.shared = 0  # of those, tokens copied from another NPC's slot
        self.next: int | None = None  # the generated token to evaluate in the next pass
        self.result: Any = None
        self.error: BaseException | None = None
        self.done = threading.Event()
        self.admitted = 0.0
        self.asked = time.monotonic()
        self.spoke = math.inf  # when its first token came
        self.held = 0  # prompt tokens read since its last token was decoded (Scheduler._holds)

    def move(self, to: Phase) -> None:
        """The job is now in ``to``; ``PhaseError`` if ``MOVES`` does not allow it."""
        if to not in MOVES[self.phase]:
            raise PhaseError(self.npc_id, self.phase, to)
        self.phase = to

    def wait(self) -> Any:
        self.done.wait()
        if self.error is not None:
            raise self.error
        return self.result


class Slot:
    """A KV sequence: the NPC whose tokens it holds and the job running on it."""

    __slots__ = ("seq", "npc", "tokens", "job", "used", "rent", "epoch", "lent")

    def __init__(self, seq: int) -> None:
        self.seq = seq
        self.npc: str | None = None
        self.tokens: list[int] = []  # what the sequence holds, positions 0..len-1
        self.job: Job | None = None
        self.used = 0.0  # when its last job ended: the least recently used idle slot goes first
        self.rent = 0  # rows decoded beside its cells since then (Scheduler._tidy)
        # cells shared with another slot: (donor, the donor's epoch then, tokens); the epoch
        # changes whenever cells leave the sequence, which ends what it lent
        self.epoch = 0
        self.lent: tuple[Slot, int, int] | None = None

    def shared(self, gone: Slot | None = None) -> int:
        """Of its tokens, those whose cells the donor holds too (counted there), unless the
        donor is ``gone``."""
        if self.lent is None:
            return 0
        donor, epoch, n = self.lent
        if donor is gone or donor.epoch != epoch:
            return 0
        return min(n, len(self.tokens), len(donor.tokens))


def _common(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class Scheduler:
    """The context and its thread. ``submit`` from any thread; ``close`` ends the thread
    (steps still running end with ``model_unavailable``)."""

    def __init__(
        self,
        llm: Any,
        n_ctx: int,
        states: StateCache,
        n_seq: int,
        n_threads: int,
        n_threads_batch: int,
        prefill_chunk: int,
        hold: int = 0,
        hold_burst: int = 0,
    ) -> None:
        import llama_cpp
        from llama_cpp import _internals

        self.llm = llm
        self.n_ctx = n_ctx
        self.states = states
        self.chunk = max(1, prefill_chunk)
        self.hold = max(0, hold)
        self.hold_burst = max(0, hold_burst)
        self.n_batch = max(512, self.chunk + n_seq)
        p = llama_cpp.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = p.n_ubatch = self.n_batch
        p.n_seq_max = n_seq
        p.kv_unified = True
        # llama.cpp decodes a batch of one token with n_threads and anything larger (prompt
        # chunks, several NPCs' tokens) with n_threads_batch
        p.n_threads, p.n_threads_batch = n_threads, n_threads_batch
        self.ctx: Any = _internals.LlamaContext(model=llm._model, params=p, verbose=False)
        self.mem = llama_cpp.llama_get_memory(self.ctx.ctx)
        self.batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)
        self.slots = [Slot(i) for i in range(n_seq)]
        self._cv = threading.Condition()  # guards _queue, _forget, _closing
        self._queue: deque[Job] = deque()
        self._forget: set[str] = set()
        self._closing = False
        self._waiting: deque[Job] = deque()  # submitted, not admitted (scheduler thread only)
        self._active: list[Job] = []  # admitted, in admission order
        self.batched = 0  # decodes that held more than one NPC's tokens
        self.shared_tokens = 0  # prompt tokens taken from another NPC's slot
        self.moved = 0  # tokens moved to the start of the pool (_pack)
        self._high = 0  # the most tokens the slots held since the last _pack
        self._thread = threading.Thread(target=self._run, name="oam-llama-batch", daemon=True)
        self._thread.start()

    # -- any thread ------------------------------------------------------------------
    def submit(self, job: Job) -> Any:
        """Runs ``job`` and returns its result (None when stopped before it started)."""
        if len(job.tokens) >= self.n_ctx:
            raise BridgeError(
                "context_size_exceeded",
                "prompt exceeds context",
                promptTokens=len(job.tokens),
                contextSize=self.n_ctx,
            )
        with self._cv:
            if self._closing:
                raise BridgeError("model_unavailable", "engine closed")
            self._queue.append(job)
            self._cv.notify()
        # the stop flag is looked at by the scheduler on every pass; wake it when set so a
        # waiting job ends without waiting for one
        while not job.done.wait(0.05):
            if job.stop.is_set():
                with self._cv:
                    self._cv.notify()
        return job.wait()

    def forget(self, npc_id: str) -> None:
        """Drops the NPC's resident tokens (reset, delete, restore), at the next pass."""
        with self._cv:
            self._forget.add(npc_id)
            self._cv.notify()

    def close(self) -> None:
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join()

    # -- the scheduler thread --------------------------------------------------------
    def _run(self) -> None:
        import llama_cpp

        try:
            while True:
                with self._cv:
                    # a waiting job with nothing active is admitted at once (every slot is idle)
                    while not (self._closing or self._queue or self._forget or self._active or self._waiting):
                        self._cv.wait()
                    if self._closing:
                        break
                    self._waiting.extend(self._queue)
                    self._queue.clear()
                    forget, self._forget = self._forget, set()
                for npc in forget:
                    self._drop(npc)
                self._admit()
                self._tidy()
                if self._active:
                    self._pass()
        except BaseException as e:  # noqa: BLE001 - every job must end
            log.exception("llama scheduler failed")
            err = BridgeError("generation_failed", f"llama scheduler failed: {type(e).__name__}: {e}")
            self._fail_all(err)
            with self._cv:
                self._closing = True
        finally:
            self._fail_all(BridgeError("model_unavailable", "engine closed"))
            with self._cv:
                self._fail_queue(BridgeError("model_unavailable", "engine closed"))
            llama_cpp.llama_batch_free(self.batch)
            self.ctx.close()

    def _fail_queue(self, err: BaseException) -> None:
        while self._queue:
            self._finish(self._queue.popleft(), Phase.FAILED, error=err)

    def _fail_all(self, err: BaseException) -> None:
        for job in list(self._active) + list(self._waiting):
            self._finish(job, Phase.FAILED, error=err)
        self._active.clear()
        self._waiting.clear()

    def _finish(self, job: Job, end: Phase, result: Any = None, error: BaseException | None = None) -> None:
        """The job moves to ``end`` with its result or error, leaves its slot and is done
        (nothing if it has ended already)."""
        if job.phase in ENDS:
            return
        job.move(end)
        job.result, job.error = result, error
        if job.slot is not None:
            job.slot.job = None
            job.slot.used = time.monotonic()
            job.slot.rent = 0
            job.slot = None
        job.done.set()

    def _drop(self, npc: str) -> None:
        """The NPC is gone (or reset): its saved state goes, and its slot belongs to no one.
        The slot keeps its tokens until its cells are needed: they are only a cache of what
        a prompt that starts the same way would read again (the OpenAI-compatible server's
        requests are NPCs deleted after each request, and the next one starts alike)."""
        self.states.forget(npc)
        for s in self.slots:
            if s.npc == npc and s.job is None:
                s.npc = None

    def _cells_used(self, gone: Slot | None = None) -> int:
        """KV cells the slots hold (a shared prefix once) and their running jobs may still
        take; ``gone``'s tokens not counted (the slot a job is about to take)."""
        used = 0
        for s in self.slots:
            if s is not gone:
                used += len(s.tokens) - s.shared(gone)
            if s.job is not None:
                used += len(s.job.pending) + s.job.reserve
        return used

    def _clear(self, s: Slot) -> None:
        import llama_cpp

        llama_cpp.llama_memory_seq_rm(self.mem, s.seq, -1, -1)
        s.tokens, s.lent = [], None
        s.epoch += 1

    def _truncate(self, s: Slot, n: int) -> None:
        """Keeps the slot's first ``n`` tokens (all gone if llama.cpp cannot cut there)."""
        import llama_cpp

        if n >= len(s.tokens):
            return
        if not llama_cpp.llama_memory_seq_rm(self.mem, s.seq, n, -1):
            self._clear(s)
            return
        s.tokens = s.tokens[:n]
        s.epoch += 1

    def _evict(self, s: Slot) -> None:
        """Gives an idle slot's cells back, saved: its NPC's state for its return, or the
        tokens of no one as a prefix a prompt may start with."""
        if s.tokens and (s.npc is not None or len(s.tokens) >= TIDY_ROWS) and (st := self._save(s)) is not None:
            if s.npc is not None:
                self.states.put(s.npc, st)
            else:
                self.states.put_prefix(st)
        self._clear(s)
        s.npc = None

    def _tidy(self) -> None:
        """Idle slots give their cells back, saved, once they cost more where they are than
        in RAM. Each row llama.cpp decodes scans the attention mask over all the cells up to
        the highest in use, so idle cells slow every row: a token said beside 7 idle NPCs
        of 1000 tokens took 30.8 against 24.4 ms alone (2000 cells: 1.08x), and 4 NPCs'
        prompts read beside 4 idle NPCs 7.55 against 7.17 ms a row. A state goes to RAM and
        comes back in about 18 ms per 1000 tokens, so a slot goes once the rows decoded
        beside it since it went idle (``Slot.rent``) and the prompt rows still to read come
        to ``TIDY_ROWS``: a long prompt sends idle slots away before it is read, and a
        conversation sends them away after a line or two. Kept: a slot whose tokens start
        like a prompt being read (they may be shared), and one whose cells other slots
        share for the most part (they would stay in the pool). At most ``TIDY_TOKENS`` a
        pass, the least recently used slots first, so that saving long histories does not
        stall the NPCs speaking."""
        reading = [job for job in self._active if job.phase is Phase.READING]
        ahead = sum(len(job.pending) for job in reading)
        lending = self._lending()
        saved = 0
        for s in sorted((s for s in self.slots if s.job is None and s.tokens), key=lambda s: s.used):
            if (
                s.rent + ahead < TIDY_ROWS
                or 2 * lending.get(s.seq, 0) > len(s.tokens)
                or any(_common(s.tokens, job.tokens) >= TIDY_ROWS for job in reading)
            ):
                continue
            if saved and saved + len(s.tokens) > TIDY_TOKENS:
                return  # the rest next pass
            saved += len(s.tokens)
            self._evict(s)
        if saved:
            self._pack()

    def _pack(self) -> None:
        """The slots still resident move to the start of the pool, saved and loaded back
        (about 18 ms per 1000 tokens), if they hold at most 1/``PACK_RATIO`` of the most
        tokens the pool held since the last move. llama.cpp scans the mask up to the highest
        cell in use (which it does not tell), so cells given back below the slots that stay
        gain nothing: a speaking NPC whose cells were read after 7 idle NPCs' went on paying
        for them. Slots that share cells stay where they are (a move would copy them)."""
        held = sum(len(s.tokens) for s in self.slots)
        if held * PACK_RATIO > self._high:
            return
        self._high = held
        lending = self._lending()
        for s in self.slots:
            if not s.tokens or s.shared() or s.seq in lending:
                continue
            saved = self._save(s)
            if saved is None:
                continue
            if self._load(s, saved):
                self.moved += saved.n_tokens
            elif s.job is not None:
                self._fail(s.job, BridgeError("generation_failed", "llama.cpp could not move the step's KV cells"))
            elif s.npc is not None:
                self.states.put(s.npc, saved)
                s.npc = None

    def _lending(self) -> dict[int, int]:
        """The sequences of the slots whose cells other slots share, and how many of them."""
        lent: dict[int, int] = {}
        for s in self.slots:
            if s.lent is not None and (n := s.shared()):
                lent[s.lent[0].seq] = max(lent.get(s.lent[0].seq, 0), n)
        return lent

    def _save(self, s: Slot) -> SavedState | None:
        """The slot's sequence (None if llama.cpp wrote none)."""
        import llama_cpp
        import numpy as np

        size = int(llama_cpp.llama_state_seq_get_size(self.ctx.ctx, s.seq))
        data = bytearray(size)
        buf = (ctypes.c_uint8 * size).from_buffer(data)
        n = int(llama_cpp.llama_state_seq_get_data(self.ctx.ctx, buf, size, s.seq))
        del buf  # the buffer is exported while the array lives
        if n <= 0:
            return None
        del data[n:]
        return SavedState(np.asarray(s.tokens, dtype=np.intc), len(s.tokens), data)

    def _load(self, s: Slot, saved: SavedState) -> bool:
        """The slot holds ``saved`` (False and empty if llama.cpp took none of it). llama.cpp
        puts the cells in the first free ones from the start of the pool, or from the last
        cell it wrote if few are free before it."""
        import llama_cpp

        self._clear(s)
        arr = (ctypes.c_uint8 * saved.size).from_buffer(saved.data)
        loaded = llama_cpp.llama_state_seq_set_data(self.ctx.ctx, arr, saved.size, s.seq) == saved.size
        del arr
        if not loaded:
            self._clear(s)
            return False
        s.tokens = saved.input_ids[: saved.n_tokens].tolist()
        return True

    def _admit(self) -> None:
        """Moves waiting jobs onto slots, oldest first, while slots and KV cells allow. A job
        whose placing raises fails alone (``_try_place``) and the pass goes on. Whatever
        raises, every job the pass took is on a slot (``_active``), ended, or back in
        ``_waiting``, so the scheduler's catch-all (``_run``) still ends it."""
        keep: deque[Job] = deque()
        try:
            while self._waiting:
                # the job stays in _waiting until it is placed, kept or ended
                job = self._waiting[0]
                if job.stop.is_set():
                    self._finish(job, Phase.STOPPED)  # stopped before it started: nothing read
                elif keep or not self._try_place(job):  # an older job waits: keep the order
                    keep.append(job)
                self._waiting.popleft()
        finally:
            keep.extend(self._waiting)
            self._waiting = keep

    def _try_place(self, job: Job) -> bool:
        """Whether the job has left the waiting jobs: placed (``_place``), or failed because
        placing it raised (llama.cpp saving or loading a state): ``generation_failed``, its
        slot cleared. A ``PhaseError`` (a bug of the scheduler) is raised."""
        try:
            return self._place(job)
        except PhaseError:
            raise
        except Exception as e:  # noqa: BLE001 - one job's placing fails that job alone
            log.exception("placing a job of %s failed", job.npc_id)
            self._fail(
                job,
                BridgeError("generation_failed", f"llama scheduler failed placing the job: {type(e).__name__}: {e}"),
            )
            return True

    def _place(self, job: Job) -> bool:
        own = next((s for s in self.slots if s.npc == job.npc_id), None)
        if own is not None and own.job is not None:
            return False  # the NPC's previous job has not left its slot yet
        idle = sorted(
            (s for s in self.slots if s.job is None and s is not own), key=lambda s: (s.npc is not None, s.used)
        )
        slot = own
        if slot is None and idle:
            # a slot of no one that holds the start of this prompt is taken as it is
            best = max((s for s in idle if s.npc is None), key=lambda s: _common(s.tokens, job.tokens), default=None)
            slot = best if best is not None and _common(best.tokens, job.tokens) > 0 else idle[0]
            idle.remove(slot)
        if slot is None:
            return False
        toks = job.tokens
        # where the prompt starts: the slot's own tokens (unless they are another NPC's), a
        # saved state (the NPC's own, or any that starts alike), or another slot with a
        # longer common start (its cells are shared)
        mine = _common(slot.tokens, toks) if slot.npc in (None, job.npc_id) else 0
        key, saved, from_saved = self.states.start_of(job.npc_id, toks)
        donor, lent = self._lender(slot, toks)
        if donor is not None and lent > max(mine, from_saved):
            if donor in idle:
                idle.remove(donor)  # it keeps its place: what it lends is not new cells
        else:
            donor, lent = None, 0
        # cells: the job's prompt and answer beside what the others hold and may still need
        need = len(toks) + job.reserve - lent
        free = self.n_ctx - self._cells_used(slot)
        while free < need and idle:
            self._evict(idle.pop(0))
            free = self.n_ctx - self._cells_used(slot)
        if free < need and any(s.job is not None for s in self.slots):
            return False
        if slot.npc is not None and slot.npc != job.npc_id:
            self._evict(slot)
        elif slot.npc is None and len(slot.tokens) - mine >= TIDY_ROWS and (st := self._save(slot)) is not None:
            self.states.put_prefix(st)  # what of it the prompt does not start with
        slot.npc, slot.job, job.slot = job.npc_id, job, slot
        job.move(Phase.READING)
        n = mine
        if donor is not None:
            self._copy(donor, slot, lent)
            job.shared = n = lent
        elif from_saved > mine:
            assert saved is not None and key is not None
            if not self._load(slot, saved):
                n = 0
            else:
                n = from_saved
                if from_saved >= saved.n_tokens:
                    self.states.take(key)  # a prefix of no one is resident again, whole
        if job.keep_last:  # the last token is read again: its logits start the sampling
            n = min(n, len(toks) - 1)
        self._truncate(slot, n)
        n = min(n, len(slot.tokens))
        job.cached = n
        job.pending = toks[n:]
        job.admitted = time.monotonic()
        self._active.append(job)
        if not job.pending:  # a prewarm whose prompt is all there
            self._complete_prompt(job, -1)
        return True

    def _lender(self, slot: Slot, toks: list[int]) -> tuple[Slot | None, int]:
        """The other slot whose tokens share the longest start with ``toks``, and its length."""
        best: Slot | None = None
        n = 0
        for s in self.slots:
            if s is not slot and s.tokens and (k := _common(s.tokens, toks)) > n:
                best, n = s, k
        return best, n

    def _copy(self, donor: Slot, slot: Slot, n: int) -> None:
        """``slot`` holds the first ``n`` tokens of ``donor`` (cells shared, not copied)."""
        import llama_cpp

        self._clear(slot)
        llama_cpp.llama_memory_seq_cp(self.mem, donor.seq, slot.seq, 0, n)
        slot.tokens = donor.tokens[:n]
        slot.lent = (donor, donor.epoch, n)
        self.shared_tokens += n

    def _share_late(self, job: Job) -> None:
        """Before a job reads its first chunk: the NPCs admitted with it and ahead of it have
        read their prompts since, so one that starts alike (the same lore, rules or
        instructions) gives its cells; NPCs asking at the same moment read the common text
        once. Prompts are read oldest first, so waiting for it costs the job nothing. A job
        left with nothing to read has read its prompt (``_complete_prompt``): a prewarm of a
        prompt another NPC has just read ends; a step always keeps its last token to read
        (``keep_last``)."""
        slot = job.slot
        assert slot is not None
        toks = job.tokens
        donor, n = self._lender(slot, toks)
        if job.keep_last:  # the last token is read again: its logits start the sampling
            n = min(n, len(toks) - 1)
        if donor is None or n <= len(slot.tokens):
            return
        self.shared_tokens -= job.shared  # counted again in full by _copy
        self._copy(donor, slot, n)
        job.shared = n
        job.cached = n
        job.pending = toks[n:]
        if not job.pending:  # nothing is left to decode: llama.cpp refuses an empty batch
            self._complete_prompt(job, -1)

    def _complete_prompt(self, job: Job, idx: int) -> None:
        """The prompt is read: a prewarm ends; a step samples its first token."""
        if job.step is None:
            self._end(job, ("prewarmed", job.cached))
            return
        job.move(Phase.GENERATING)
        job.spoke = time.monotonic()
        self._advance(job, idx)

    def _advance(self, job: Job, idx: int) -> None:
        assert job.step is not None
        try:
            tok = job.step.choose(self.ctx, idx)
        except Exception as e:  # noqa: BLE001 - one step's sampling fails that step alone
            log.exception("sampling failed for %s", job.npc_id)
            err = (
                e
                if isinstance(e, BridgeError)
                else BridgeError("generation_failed", f"sampling failed: {type(e).__name__}: {e}")
            )
            self._fail(job, err)
            return
        if tok is None:
            self._end(job, job.step.end())
        else:
            job.next = tok

    def _end(self, job: Job, result: Any, end: Phase = Phase.ENDED) -> None:
        if job in self._active:
            self._active.remove(job)
        self._finish(job, end, result=result)

    def _pass(self) -> None:
        """One pass: the next token of every generating job not held (``_holds``) in one
        decode, then a chunk of the oldest prompt still being read in another
        (``_reading``)."""
        for job in list(self._active):
            if job.stop.is_set():
                step = job.step if job.phase is Phase.GENERATING else None
                self._end(job, None if step is None else step.cancelled(), Phase.STOPPED)
        speaking: list[tuple[Job, list[int]]] = []
        held: list[Job] = []
        for job in self._active:
            if job.phase is Phase.GENERATING:
                assert job.next is not None
                if self._holds(job):
                    held.append(job)
                else:
                    speaking.append((job, [job.next]))
        if speaking and not self._decode(speaking):
            return
        reading = self._reading()
        if reading and self._decode(reading):
            for job in held + [j for j, _ in speaking]:
                job.held += len(reading[0][1])  # read since the job's last token

    def _holds(self, job: Job) -> bool:
        """First words first: a speaking job's next token waits while steps that asked
        before its first word still read their prompts: through to their last first word
        when the tokens it would wait in all (read since its last token, and left to read)
        come to at most ``hold_burst``, else for at most ``hold`` prompt tokens at a time. On
        two cores a speaking NPC's token costs as much as a prompt token or two, so each
        token decoded in a burst puts back the first word of every NPC still reading
        (bench/bench_batch.py's 8 NPCs asking at once: without a hold, 28 tokens of the
        first seven were decoded before the eighth's first word, 0.4-0.5 s of its 6 s;
        with ``hold`` alone, 4 lone decodes, 0.12 s). A long prompt (an NPC back with a long
        history) holds it for ``hold`` tokens at a time, so its line goes on. An NPC that was
        already speaking when the others asked is never held: a burst of barks does not
        slow the conversation the player is in."""
        if not self.hold:
            return False
        holders = [j for j in self._active if j.phase is Phase.READING and j.step is not None and j.asked < job.spoke]
        if not holders:
            return False
        return job.held < self.hold or job.held + sum(len(j.pending) for j in holders) <= self.hold_burst

    def _reading(self) -> list[tuple[Job, list[int]]]:
        """The next ``chunk`` tokens of the oldest prompt still being read (none if no job
        reads). One prompt per pass: a prompt that ends in the pass ends the pass's reading,
        so its first token is not kept waiting for the start of the next NPC's prompt
        (measured with bench/bench_batch.py: a bigger budget while several prompts wait made
        the first NPC's first word later and did not lift the total within the noise). A
        prompt found whole in another slot (``_share_late``) is read without a decode, and
        the next one is looked at."""
        for job in [j for j in self._active if j.phase is Phase.READING]:
            assert job.slot is not None
            if len(job.slot.tokens) == job.cached:  # nothing read yet
                self._share_late(job)
            if job.phase is Phase.READING:
                return [(job, job.pending[: self.chunk])]
        return []

    def _decode(self, work: list[tuple[Job, list[int]]]) -> bool:
        """Decodes each job's tokens at the end of its slot and moves the jobs on; False if
        llama.cpp refused the batch (``_decode_failed``). A job with no tokens here (a bug of
        the scheduler) fails alone with ``generation_failed``; an empty batch is never
        decoded (llama.cpp refuses it with -1, which would fail every job in it).

        The generating jobs' tokens and a prompt chunk are decoded apart, not in one batch:
        llama.cpp's CPU flash attention takes a batch's rows in tiles of 64 and skips only
        the KV cells masked for every row of a tile, so one generating row beside a prompt's
        rows makes that tile read every NPC's cells. Measured on the bundled model with a
        110-token chunk and 4 / 7 NPCs speaking: one batch 968 / 1145 ms, two 927 / 1045 ms."""
        import llama_cpp

        b = self.batch
        b.n_tokens = 0
        rows: list[tuple[Job, int, int]] = []  # (job, first row, tokens added)
        for job, toks in work:
            slot = job.slot
            assert slot is not None
            if not toks:
                self._fail(
                    job, BridgeError("generation_failed", f"llama scheduler bug: nothing to decode for {job.npc_id!r}")
                )
                continue
            start, pos = b.n_tokens, len(slot.tokens)
            last = job.phase is Phase.GENERATING or len(toks) == len(job.pending)
            for i, t in enumerate(toks):
                r = start + i
                b.token[r] = t
                b.pos[r] = pos + i
                b.n_seq_id[r] = 1
                b.seq_id[r][0] = slot.seq
                b.logits[r] = last and i == len(toks) - 1 and job.step is not None
            b.n_tokens = start + len(toks)
            rows.append((job, start, len(toks)))
        if not rows:
            return True  # nothing refused: the jobs with nothing to decode have failed
        rc = llama_cpp.llama_decode(self.ctx.ctx, b)
        self.batched += len(rows) > 1
        if rc != 0:
            self._decode_failed(rc, rows)
            return False
        held = 0
        for s in self.slots:
            held += len(s.tokens)
            if s.job is None and s.tokens:
                s.rent += b.n_tokens
        self._high = max(self._high, held + b.n_tokens)
        for job, start, k in rows:
            slot = job.slot
            assert slot is not None
            if job.phase is Phase.GENERATING:
                slot.tokens.append(job.next)  # type: ignore[arg-type]
                job.next = None
                job.held = 0
                self._advance(job, start)
            else:
                slot.tokens.extend(job.pending[:k])
                del job.pending[:k]
                if not job.pending:
                    self._complete_prompt(job, start + k - 1)
        return True

    def _decode_failed(self, rc: int, rows: list[tuple[Job, int, int]]) -> None:
        """rc 1: no room in the KV cells (give idle slots back and try again next pass; if
        none is idle, the newest job gives way); anything else fails the batch's jobs."""
        if rc == 1:
            idle = [s for s in self.slots if s.job is None and s.tokens]
            if idle:
                for s in idle:
                    self._evict(s)
                return
            job = max((j for j, _, _ in rows), key=lambda j: j.admitted)
            self._fail(
                job,
                BridgeError("busy", "the model's KV cache is full: too many NPCs generating at once for --llama-ctx"),
            )
            return
        for job, _, _ in rows:
            self._fail(job, BridgeError("generation_failed", f"llama_decode failed ({rc})"))

    def _fail(self, job: Job, err: BaseException) -> None:
        slot = job.slot
        if slot is not None:  # what the sequence holds past the known tokens is uncertain
            self._clear(slot)
            slot.npc = None
        if job in self._active:
            self._active.remove(job)
        self._finish(job, Phase.FAILED, error=err)
