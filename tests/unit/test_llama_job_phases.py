"""The llama batch scheduler's job phases (bridge/engines/llama/_batch.py): the table of moves,
and the phases a job goes through when the real ``Scheduler`` runs it on a stand-in for
``llama_cpp`` (``FakeLlama``: every decode succeeds unless told otherwise, no logits, no
model). The steps are stand-ins too (``Say``): they pick their tokens from a list, not from
logits, so what is checked is the scheduling, not the words."""

from __future__ import annotations

import itertools
import sys
import threading
import time
import types
from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("numpy")  # the saved states' arrays (llama-cpp-python brings it)

from bridge.engines.llama._batch import ENDS, MOVES, Job, Phase, PhaseError, Scheduler  # noqa: E402
from bridge.engines.llama._states import SavedState, StateCache  # noqa: E402
from bridge.errors import BridgeError  # noqa: E402

DEADLINE = 10.0  # seconds: a hang guard, not a performance check
W, R, G = Phase.WAITING, Phase.READING, Phase.GENERATING
FILLER = 7  # the token a step says while it waits for something


# ---- the table ----


def test_every_phase_has_its_moves_and_the_ends_have_none() -> None:
    assert set(MOVES) == set(Phase)
    assert ENDS == {Phase.ENDED, Phase.STOPPED, Phase.FAILED}
    assert all(not MOVES[end] for end in ENDS)


def test_a_job_moves_forward_only_and_generates_only_after_reading() -> None:
    assert all(W not in to for to in MOVES.values()), "nothing goes back to waiting for a slot"
    assert G not in MOVES[W], "a prompt is read before the first token"
    assert R not in MOVES[G], "a step does not read again"
    # every phase is reached from WAITING, and every phase that is not an end can end any way
    reached, todo = {W}, [W]
    while todo:
        for to in MOVES[todo.pop()] - reached:
            reached.add(to)
            todo.append(to)
    assert reached == set(Phase)
    assert all(MOVES[p] >= {Phase.STOPPED, Phase.FAILED} for p in Phase if p not in ENDS)


@pytest.mark.parametrize(("start", "to"), list(itertools.product(Phase, Phase)), ids=lambda p: p.value)
def test_a_move_outside_the_table_raises_phase_error_and_leaves_the_phase(start: Phase, to: Phase) -> None:
    job = Job("npc", [1, 2, 3], threading.Event(), keep_last=True, step=None, reserve=0)
    assert job.phase is W
    job.phase = start
    if to in MOVES[start]:
        job.move(to)
        assert job.phase is to
        return
    with pytest.raises(PhaseError) as raised:
        job.move(to)
    assert (raised.value.start, raised.value.to, raised.value.npc_id) == (start, to, "npc")
    assert f"from {start.value} to {to.value}" in str(raised.value)
    assert job.phase is start


# ---- the scheduler on a stand-in for llama_cpp ----


class FakeLlama:
    """The functions of ``llama_cpp`` the scheduler calls. Each decode is recorded as its
    rows, ``(sequence, token, logits wanted)``, and returns -1 for an empty batch (as
    llama.cpp does), else the next of ``codes`` (0 once they are used up). Saved sequences
    are empty (nothing is kept in RAM); a state given back is taken whole. ``raises``: how
    many of the next calls of a state function (by name) raise, as llama.cpp's may."""

    def __init__(self) -> None:
        self.decodes: list[list[tuple[int, int, bool]]] = []
        self.codes: list[int] = []
        self.raises: dict[str, int] = {}
        mod = types.ModuleType("llama_cpp")
        mod.llama_context_default_params = types.SimpleNamespace  # type: ignore[attr-defined]
        mod._internals = types.SimpleNamespace(LlamaContext=self._context)  # type: ignore[attr-defined]
        mod.llama_get_memory = lambda ctx: "memory"  # type: ignore[attr-defined]
        mod.llama_batch_init = self._batch  # type: ignore[attr-defined]
        mod.llama_batch_free = lambda batch: None  # type: ignore[attr-defined]
        mod.llama_decode = self._decode  # type: ignore[attr-defined]
        mod.llama_memory_seq_rm = lambda mem, seq, p0, p1: True  # type: ignore[attr-defined]
        mod.llama_memory_seq_cp = lambda mem, src, dst, p0, p1: None  # type: ignore[attr-defined]
        mod.llama_state_seq_get_size = self._breakable(  # type: ignore[attr-defined]
            "llama_state_seq_get_size", lambda ctx, seq: 0
        )
        mod.llama_state_seq_get_data = self._breakable(  # type: ignore[attr-defined]
            "llama_state_seq_get_data", lambda ctx, buf, size, seq: 0
        )
        mod.llama_state_seq_set_data = self._breakable(  # type: ignore[attr-defined]
            "llama_state_seq_set_data", lambda ctx, buf, size, seq: size
        )
        self.module = mod

    def _breakable(self, name: str, call: Callable[..., Any]) -> Callable[..., Any]:
        def maybe(*args: Any) -> Any:
            if self.raises.get(name, 0) > 0:
                self.raises[name] -= 1
                raise RuntimeError(f"{name} went wrong")
            return call(*args)

        return maybe

    @staticmethod
    def _context(model: Any, params: Any, verbose: bool) -> Any:
        return types.SimpleNamespace(ctx="context", close=lambda: None)

    @staticmethod
    def _batch(n_tokens: int, embd: int, n_seq_max: int) -> Any:
        return types.SimpleNamespace(
            n_tokens=0,
            token=[0] * n_tokens,
            pos=[0] * n_tokens,
            n_seq_id=[0] * n_tokens,
            seq_id=[[0] for _ in range(n_tokens)],
            logits=[False] * n_tokens,
        )

    def _decode(self, ctx: Any, b: Any) -> int:
        self.decodes.append([(b.seq_id[r][0], b.token[r], bool(b.logits[r])) for r in range(b.n_tokens)])
        if b.n_tokens == 0:
            return -1  # llama.cpp refuses an empty batch
        return self.codes.pop(0) if self.codes else 0


class Say:
    """A step that says ``words``, one token a pass, then ends with "said" ("cut" when
    stopped). ``until``: it says ``FILLER`` until that is true (asked on the scheduler's
    thread), then its words. ``stop_at``/``fail_at``: at that choice it sets ``stop`` /
    raises."""

    def __init__(
        self,
        words: list[int],
        *,
        until: Callable[[], bool] | None = None,
        stop: threading.Event | None = None,
        stop_at: int | None = None,
        fail_at: int | None = None,
    ) -> None:
        self.words, self.until, self.stop, self.stop_at, self.fail_at = words, until, stop, stop_at, fail_at
        self.said: list[int] = []

    def choose(self, ctx: Any, idx: int) -> int | None:
        n = len(self.said)
        if n == self.fail_at:
            raise ValueError("no logits here")
        if n == self.stop_at:
            assert self.stop is not None
            self.stop.set()
        if self.until is not None and not self.until():
            tok: int | None = FILLER
        else:
            self.until = None
            tok = self.words.pop(0) if self.words else None
        if tok is not None:
            self.said.append(tok)
        return tok

    def end(self) -> Any:
        return "said"

    def cancelled(self) -> Any:
        return "cut"


class Traced(Job):
    """A job that keeps the phases it went through."""

    __slots__ = ("seen",)

    def __init__(
        self,
        npc_id: str,
        tokens: list[int],
        step: Say | None = None,
        stop: threading.Event | None = None,
        reserve: int = 0,
    ) -> None:
        super().__init__(
            npc_id, tokens, stop or threading.Event(), keep_last=step is not None, step=step, reserve=reserve
        )
        self.seen = [self.phase]

    def move(self, to: Phase) -> None:
        super().move(to)
        self.seen.append(to)


@pytest.fixture
def llama(monkeypatch: pytest.MonkeyPatch) -> FakeLlama:
    fake = FakeLlama()
    monkeypatch.setitem(sys.modules, "llama_cpp", fake.module)
    return fake


@pytest.fixture
def open_scheduler(llama: FakeLlama) -> Iterator[Callable[..., Scheduler]]:
    opened: list[Scheduler] = []

    def open_(n_seq: int = 2, chunk: int = 4, states: StateCache | None = None) -> Scheduler:
        sched = Scheduler(types.SimpleNamespace(_model="model"), 256, states or StateCache(1 << 20), n_seq, 1, 1, chunk)
        opened.append(sched)
        return sched

    yield open_
    for sched in opened:
        sched.close()


class Running:
    """``Scheduler.submit`` in a thread of its own; ``outcome`` joins it."""

    def __init__(self, sched: Scheduler, job: Job) -> None:
        self.job = job
        self.result: Any = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(sched,), daemon=True)
        self._thread.start()

    def _run(self, sched: Scheduler) -> None:
        try:
            self.result = sched.submit(self.job)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            self.error = e

    def outcome(self) -> Any:
        self._thread.join(DEADLINE)
        assert not self._thread.is_alive(), f"the job is still {self.job.phase.value}"
        if self.error is not None:
            raise self.error
        return self.result


def run(sched: Scheduler, job: Job) -> Any:
    return Running(sched, job).outcome()


def until(what: Callable[[], bool]) -> None:
    deadline = time.monotonic() + DEADLINE
    while not what():
        assert time.monotonic() < deadline, "never happened"
        time.sleep(0.001)


def test_a_step_reads_its_prompt_a_chunk_a_pass_then_says_a_token_a_pass(
    open_scheduler: Callable[..., Scheduler], llama: FakeLlama
) -> None:
    job = Traced("a", list(range(1, 11)), Say([101, 102, 103]))
    assert run(open_scheduler(chunk=4), job) == "said"
    assert job.seen == [W, R, G, Phase.ENDED]
    assert [len(rows) for rows in llama.decodes] == [4, 4, 2, 1, 1, 1]
    assert [rows[0][1] for rows in llama.decodes[3:]] == [101, 102, 103]
    # logits for the prompt's last token (the first choice) and for every token said
    assert [rows[-1][2] for rows in llama.decodes] == [False, False, True, True, True, True]
    assert job.slot is None and job.cached == 0


def test_a_prewarm_reads_and_ends_and_one_whose_prompt_is_there_ends_at_once(
    open_scheduler: Callable[..., Scheduler], llama: FakeLlama
) -> None:
    sched = open_scheduler(chunk=4)
    first = Traced("a", [1, 2, 3, 4, 5, 6])
    assert run(sched, first) == ("prewarmed", 0)
    assert first.seen == [W, R, Phase.ENDED]
    assert [len(rows) for rows in llama.decodes] == [4, 2]
    again = Traced("a", [1, 2, 3, 4, 5, 6])
    assert run(sched, again) == ("prewarmed", 6)
    assert again.seen == [W, R, Phase.ENDED]
    assert len(llama.decodes) == 2, "nothing read again"


def test_a_step_restored_from_its_saved_state_reads_only_the_rest(
    open_scheduler: Callable[..., Scheduler], llama: FakeLlama
) -> None:
    import numpy as np

    prompt = list(range(1, 11))
    states = StateCache(1 << 20)
    states.put("a", SavedState(np.asarray(prompt[:6], dtype=np.intc), 6, bytearray(b"kv")))
    job = Traced("a", prompt, Say([101]))
    assert run(open_scheduler(chunk=8, states=states), job) == "said"
    assert job.seen == [W, R, G, Phase.ENDED]
    assert job.cached == 6
    assert [[tok for _, tok, _ in rows] for rows in llama.decodes] == [[7, 8, 9, 10], [101]]


def test_a_job_stopped_before_it_has_a_slot_ends_without_reading(
    open_scheduler: Callable[..., Scheduler], llama: FakeLlama
) -> None:
    stop = threading.Event()
    stop.set()
    job = Traced("a", [1, 2, 3], Say([101]), stop)
    assert run(open_scheduler(), job) is None
    assert job.seen == [W, Phase.STOPPED]
    assert llama.decodes == []


def test_a_step_stopped_while_generating_ends_with_its_cancelled_result(
    open_scheduler: Callable[..., Scheduler], llama: FakeLlama
) -> None:
    stop = threading.Event()
    job = Traced("a", [1, 2, 3], Say([101, 102, 103, 104], stop=stop, stop_at=1), stop)
    assert run(open_scheduler(), job) == "cut"
    assert job.seen == [W, R, G, Phase.STOPPED]
    assert [rows[0][1] for rows in llama.decodes[1:]] == [101], "stopped at the next pass"


def test_a_step_whose_sampling_fails_fails_with_generation_failed(open_scheduler: Callable[..., Scheduler]) -> None:
    job = Traced("a", [1, 2, 3], Say([101, 102], fail_at=1))
    with pytest.raises(BridgeError) as raised:
        run(open_scheduler(), job)
    assert raised.value.code == "generation_failed" and "no logits here" in raised.value.message
    assert job.seen == [W, R, G, Phase.FAILED]


def test_a_refused_decode_fails_the_job_reading(open_scheduler: Callable[..., Scheduler], llama: FakeLlama) -> None:
    llama.codes = [2]
    job = Traced("a", [1, 2, 3], Say([101]))
    with pytest.raises(BridgeError) as raised:
        run(open_scheduler(), job)
    assert (raised.value.code, raised.value.message) == ("generation_failed", "llama_decode failed (2)")
    assert job.seen == [W, R, Phase.FAILED]


def test_a_job_waits_for_the_only_slot_and_takes_it_when_the_step_on_it_ends(
    open_scheduler: Callable[..., Scheduler], llama: FakeLlama
) -> None:
    sched = open_scheduler(n_seq=1)
    second = Traced("b", [21, 22, 23], Say([201]))
    # the first step goes on until the second waits (asked on the scheduler's thread)
    first = Traced("a", [1, 2, 3], Say([101], until=lambda: second in sched._waiting))
    one = Running(sched, first)
    until(lambda: first.phase is G)
    two = Running(sched, second)
    assert (one.outcome(), two.outcome()) == ("said", "said")
    assert first.seen == [W, R, G, Phase.ENDED]
    assert second.seen == [W, R, G, Phase.ENDED]
    decoded = [tok for rows in llama.decodes for _, tok, _ in rows]
    assert decoded.index(21) > decoded.index(101), "the second read its prompt once the first had ended"


def test_close_fails_the_job_running_and_the_job_waiting(open_scheduler: Callable[..., Scheduler]) -> None:
    sched = open_scheduler(n_seq=1)
    first = Traced("a", [1, 2, 3], Say([], until=lambda: False))  # says FILLER for ever
    second = Traced("b", [21, 22, 23], Say([201]))
    one = Running(sched, first)
    until(lambda: first.phase is G)
    two = Running(sched, second)
    until(lambda: second in sched._waiting)
    sched.close()
    for running in (one, two):
        with pytest.raises(BridgeError) as raised:
            running.outcome()
        assert raised.value.code == "model_unavailable"
    assert first.seen == [W, R, G, Phase.FAILED]
    assert second.seen == [W, Phase.FAILED]


def test_an_illegal_move_fails_the_jobs_instead_of_stranding_them(
    open_scheduler: Callable[..., Scheduler], monkeypatch: pytest.MonkeyPatch
) -> None:
    from bridge.engines.llama import _batch

    monkeypatch.setitem(_batch.MOVES, R, frozenset({Phase.ENDED, Phase.STOPPED, Phase.FAILED}))
    job = Traced("a", [1, 2, 3], Say([101]))
    with pytest.raises(BridgeError) as raised:
        run(open_scheduler(), job)
    assert raised.value.code == "generation_failed"
    assert "PhaseError: a job of 'a' cannot go from reading to generating" in raised.value.message
    assert job.seen == [W, R, Phase.FAILED]


def together(sched: Scheduler, *jobs: Job) -> list[Running]:
    """Submits ``jobs``, in this order, so that the scheduler takes them into ``_waiting`` in
    one pass: a step of NPC "holder" (prompt [91, 92, 93]) keeps the scheduler's thread in
    its first choice until they are all queued, then says 99 and ends. The jobs are admitted
    beside it if there are slots to spare, else together once it has left its slot."""
    gate = threading.Event()
    holder = Traced("holder", [91, 92, 93], Say([99], until=lambda: gate.wait(DEADLINE)))
    holding = Running(sched, holder)
    until(lambda: holder.phase is G)
    running = []
    for n, job in enumerate(jobs, 1):
        running.append(Running(sched, job))
        until(lambda: len(sched._queue) == n)  # noqa: B023 - used before the next job
    gate.set()
    assert holding.outcome() == "said"
    return running


def ended_once(job: Traced) -> bool:
    return job.done.is_set() and [p for p in job.seen if p in ENDS] == [job.seen[-1]]


def test_a_prewarm_that_finds_its_whole_prompt_shared_has_read_it(
    open_scheduler: Callable[..., Scheduler], llama: FakeLlama
) -> None:
    # Two NPCs prewarm one prompt at the same moment: admitted together, before either read
    # anything, the second finds the first's cells when its turn to read comes (_share_late):
    # the whole prompt (a prewarm keeps no last token to read again). Its prompt is read then;
    # an empty batch would be refused by llama.cpp (-1) and fail it.
    sched = open_scheduler(n_seq=3, chunk=4)
    prompt = [1, 2, 3, 4, 5, 6]
    first, second = Traced("a", prompt), Traced("b", prompt)
    one, two = together(sched, first, second)
    assert one.outcome() == ("prewarmed", 0)
    assert two.outcome() == ("prewarmed", 6)
    assert first.seen == second.seen == [W, R, Phase.ENDED]
    assert second.shared == 6
    assert all(llama.decodes), "no empty batch"
    assert [[tok for _, tok, _ in rows] for rows in llama.decodes if rows[0][1] in prompt] == [[1, 2, 3, 4], [5, 6]]
    assert sched._active == [] and sched._thread.is_alive()
    assert run(sched, Traced("c", [31, 32, 33], Say([301]))) == "said"


def test_a_step_that_finds_its_whole_prompt_shared_reads_its_last_token(
    open_scheduler: Callable[..., Scheduler], llama: FakeLlama
) -> None:
    # The same for two steps: the second takes all but the last token (keep_last) and reads
    # that one, for the logits its first choice needs
    sched = open_scheduler(n_seq=3, chunk=4)
    prompt = [1, 2, 3, 4, 5, 6]
    first, second = Traced("a", prompt, Say([101])), Traced("b", prompt, Say([201]))
    one, two = together(sched, first, second)
    assert (one.outcome(), two.outcome()) == ("said", "said")
    assert second.seen == [W, R, G, Phase.ENDED]
    assert (second.shared, second.cached) == (5, 5)
    seq = next(s for rows in llama.decodes for s, tok, _ in rows if tok == 201)
    assert [row for rows in llama.decodes for row in rows if row[0] == seq] == [(seq, 6, True), (seq, 201, True)]
    assert all(llama.decodes), "no empty batch"


def test_a_job_with_nothing_to_decode_fails_alone_and_no_empty_batch_is_decoded(
    open_scheduler: Callable[..., Scheduler], llama: FakeLlama, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The guard where the batch is built: a job reading nothing (a bug of the scheduler,
    # here a _share_late that leaves nothing to read and does not end the prewarm) fails with
    # generation_failed; it sends llama.cpp no empty batch, and the scheduler serves on
    def share_late(self: Scheduler, job: Job) -> None:
        if job.npc_id == "b":
            job.cached = len(job.tokens)
            job.pending = []

    monkeypatch.setattr(Scheduler, "_share_late", share_late)
    sched = open_scheduler(n_seq=3, chunk=4)
    first, second = Traced("a", [1, 2, 3]), Traced("b", [1, 2, 3])
    one, two = together(sched, first, second)
    assert one.outcome() == ("prewarmed", 0)
    with pytest.raises(BridgeError) as raised:
        two.outcome()
    assert raised.value.code == "generation_failed" and "nothing to decode" in raised.value.message
    assert second.seen == [W, R, Phase.FAILED]
    assert all(llama.decodes), "no empty batch"
    assert run(sched, Traced("c", [31, 32, 33], Say([301]))) == "said"


@pytest.mark.parametrize("broken", ["llama_state_seq_get_size", "llama_state_seq_set_data"], ids=["save", "load"])
def test_a_job_whose_placing_raises_fails_alone_and_the_jobs_behind_it_run(
    open_scheduler: Callable[..., Scheduler], llama: FakeLlama, broken: str
) -> None:
    # Three jobs wait for the only slot and are placed in one pass once the holder leaves it.
    # Placing the first saves the holder's sequence (its slot goes to another NPC) and loads
    # the first NPC's saved state: llama.cpp raises in one of them. That job fails with
    # generation_failed; the two behind it run, each job ends exactly once, and a job
    # submitted later is served.
    import numpy as np

    states = StateCache(1 << 20)
    states.put("a", SavedState(np.asarray([1, 2, 3, 4], dtype=np.intc), 4, bytearray(b"kv")))
    sched = open_scheduler(n_seq=1, states=states)
    llama.raises[broken] = 1
    a = Traced("a", [1, 2, 3, 4, 5], Say([101]))
    b = Traced("b", [21, 22, 23], Say([201]))
    c = Traced("c", [31, 32, 33], Say([301]))
    runs = together(sched, a, b, c)
    with pytest.raises(BridgeError) as raised:
        runs[0].outcome()
    assert raised.value.code == "generation_failed" and f"{broken} went wrong" in raised.value.message
    # saving fails before the job has the slot; loading, once it has it (then cleared)
    assert a.seen == ([W, Phase.FAILED] if broken == "llama_state_seq_get_size" else [W, R, Phase.FAILED])
    assert [r.outcome() for r in runs[1:]] == ["said", "said"]
    assert b.seen == c.seen == [W, R, G, Phase.ENDED]
    d = Traced("d", [41, 42, 43], Say([401]))
    assert run(sched, d) == "said"
    assert all(ended_once(job) for job in (a, b, c, d))
    assert sched._thread.is_alive() and not sched._waiting and not sched._active
    assert all(s.job is None for s in sched.slots)
