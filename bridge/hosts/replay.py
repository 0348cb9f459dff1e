"""Replaying a recorded session (``oam-bridge --record FILE``, see ``bridge/jsonrpc/_record.py``)
against a fresh bridge, and reporting the first divergence.

    python -m bridge.hosts.replay RECORDING [--timeout S] [--bridge CMD] [-- BRIDGE OPTIONS...]

(``oam replay ARGS`` is the same: it calls ``main``.) Exit status: 0 the bridge answered as
recorded, 1 it diverged (the report says where), 2 no replay (an unreadable recording, a
bridge that did not start).

How it plays:

- The bridge is started with the recorded options (engine, model, ``--script`` steps from the
  header, limits); options after ``--`` are added after them and override them (``-- --model
  other.gguf``). The ``OAM_*`` variables those options come from are removed from the bridge's
  environment, so this shell's settings do not change the replay.
- The game's lines are sent in recorded order. Lines the bridge read in one read are sent in
  one write; before each such group, the replay waits until the bridge has written every line
  it had written before the group in the recording (so a ``npc/submit`` goes out after the
  ``turn/toolCallRequested`` it answers). The recorded end (stdin EOF, a signal, the game
  gone) is played the same way: stdin closed, the same signal sent.
- Turn and call ids the bridge made up differ between runs: the first time a recorded id
  meets its counterpart (a ``turnId``, a ``callId``, or a string that looks like the bridge's
  ``turn_…``/``call_…`` in the same place) the pair is kept, and the game's later lines are
  sent with the new id. Ids the game chose (request ids, npc ids, a script's call ids) must
  match exactly.
- The bridge's lines are matched to the recorded ones by what they answer, not by their order
  across turns (two NPCs' turns interleave differently from run to run): a response by its
  request id, an event by its turn and ``seq``. Each is then compared field by field,
  ignoring what legitimately differs: the ids above (compared through the mapping), the
  recording's time stamps (``t``), and in ``initialize`` and ``engine/status`` results the
  bridge's version and the ``engines`` list (which engines are available depends on the
  machine). The wire has no durations or clock times; nothing else is ignored.

The first divergence found ends the replay: a recorded line answered differently (the
recording's line number, the expected and the actual line, the fields that differ), a line the
recording does not have, or a recorded line that did not come (``--timeout`` seconds passed
without a line from the bridge).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final

import trio

DEFAULT_TIMEOUT_S: Final = 30.0  # seconds without a line from the bridge while a recorded one is awaited
STARTUP_S: Final = 60.0  # the bridge's first line (its start-up, a model loading) gets this at least
# what the bridge makes up per run (uuid4-based): turn_ + 12 hex, call_ + 8 or 12 hex
_BRIDGE_ID: Final = re.compile(r"^(turn|call)_[0-9a-f]{8,12}$")
_ID_IN_LINE: Final = re.compile(r'"((?:turn|call)_[0-9a-f]{8,12})"')
_ID_IN_TEXT: Final = re.compile(r"\b(?:turn|call)_[0-9a-f]{8,12}\b")
_ID_FIELDS: Final = frozenset({"turnId", "callId"})
# per method: result fields that depend on the machine or the build, not on the session
IGNORED: Final[dict[str, tuple[tuple[str, ...], ...]]] = {
    "initialize": (("result", "serverInfo", "version"), ("result", "engines")),
    "engine/status": (("result", "engines"),),
}
# recorded option -> the bridge's flag (options of the session; not stdio, polling, logging)
_FLAGS: Final = {
    "engine": "--engine",
    "model": "--model",
    "llama_ctx": "--llama-ctx",
    "llama_threads": "--llama-threads",
    "openai_url": "--openai-url",
    "openai_model": "--openai-model",
    "openai_timeout": "--openai-timeout",
    "openai_connect_timeout": "--openai-connect-timeout",
    "openai_ctx": "--openai-ctx",
    "max_line_bytes": "--max-line-bytes",
    "max_npcs": "--max-npcs",
    "max_pending_lines": "--max-pending-lines",
    "max_outbound_bytes": "--max-outbound-bytes",
    "exit_grace_ms": "--exit-grace-ms",
}
_SWITCHES: Final = {"openai_grammar": "--openai-grammar"}
_ENV_OF_OPTIONS: Final = (
    "OAM_ENGINE",
    "OAM_LLAMA_MODEL",
    "OAM_LLAMA_CTX",
    "OAM_LLAMA_THREADS",
    "OAM_LLAMA_VERBOSE",
    "OAM_OPENAI_URL",
    "OAM_OPENAI_MODEL",
    "OAM_OPENAI_TIMEOUT",
    "OAM_OPENAI_CONNECT_TIMEOUT",
    "OAM_OPENAI_CTX",
    "OAM_OPENAI_GRAMMAR",
    "OAM_RECORD",
)


class RecordingError(Exception):
    """The file is not a recording this replayer reads."""


# ---- the recording ----


@dataclass
class Step:
    """What the game did at one point: lines written in one write, or how it ended."""

    line: int  # the recording's line number of the first
    after: int  # the bridge's recorded lines before it (to wait for)
    lines: list[tuple[int, bytes]] = field(default_factory=list)  # (recording line, raw line)
    end: dict[str, Any] | None = None  # {"eof": true} | {"signal": n} | {"parentGone": true}


@dataclass
class Recording:
    header: dict[str, Any]
    steps: list[Step]
    expected: list[tuple[int, Any]]  # (recording line, message) the bridge wrote
    trailer: dict[str, Any] | None

    @classmethod
    def load(cls, path: str) -> Recording:
        with open(path, "rb") as f:
            raw = f.read().split(b"\n")
        try:
            header = json.loads(raw[0])
        except ValueError:
            header = None
        if not isinstance(header, dict) or header.get("oamRecording") != 1:
            raise RecordingError(f"{path}: line 1 is not an oam-bridge recording header (format 1)")
        steps: list[Step] = []
        expected: list[tuple[int, Any]] = []
        trailer = None
        last_read = None
        for n, b in enumerate(raw[1:], start=2):
            if not b.strip():
                continue
            try:
                rec = json.loads(b)
            except ValueError:
                raise RecordingError(f"{path}: line {n} is not JSON (a recording cut off mid-line?)") from None
            if rec.get("end"):
                trailer = rec
            elif rec.get("dir") == "out":
                expected.append((n, rec["msg"]))
            elif rec.get("dir") == "in" and ("line" in rec or "tooLong" in rec):
                data = rec["line"].encode("utf-8", "surrogateescape") if "line" in rec else b"x" * rec["tooLong"]
                if last_read is None or rec.get("read") != last_read or steps[-1].end is not None:
                    steps.append(Step(n, len(expected)))
                steps[-1].lines.append((n, data))
                last_read = rec.get("read")
            elif rec.get("dir") == "in":
                steps.append(Step(n, len(expected), end={k: v for k, v in rec.items() if k not in ("t", "dir")}))
            else:
                raise RecordingError(f"{path}: line {n} is no record this replayer knows")
        return cls(header, steps, expected, trailer)

    def ended_by_game(self) -> bool:
        """The session's end is in the recording (stdin EOF, a signal, ``exit``): the bridge's
        lines after it are the replay's to compare too."""
        if not self.steps:
            return False
        last = self.steps[-1]
        return last.end is not None or any(b'"exit"' in line for _, line in last.lines)

    def warnings(self) -> list[str]:
        """What the recording cannot promise to replay exactly."""
        out = []
        if self.trailer is None:
            out.append(
                "the recording has no trailer (the bridge was killed?): the lines after its end are not compared"
            )
        elif self.trailer.get("droppedLines"):
            out.append(
                f"the recording dropped {self.trailer['droppedLines']} lines (the disk was slower than the bridge)"
            )
        for npc, info in ((self.trailer or {}).get("npcs") or {}).items():
            opts = info.get("options") or {}
            if (
                info.get("engine") in ("llama", "openai", "native")
                and opts.get("temperature") != 0
                and opts.get("seed") is None
            ):
                out.append(
                    f"npc {npc!r} sampled on {info['engine']} at temperature {opts.get('temperature', 'default')} "
                    "without a seed: its texts are random and may differ"
                )
        return out


def bridge_argv(header: dict[str, Any], script_path: str | None) -> list[str]:
    """The recorded bridge options as command-line flags."""
    opts = header.get("options") or {}
    argv: list[str] = []
    for key, flag in _FLAGS.items():
        if opts.get(key) is not None:
            argv += [flag, str(opts[key])]
    for key, flag in _SWITCHES.items():
        if opts.get(key):
            argv.append(flag)
    if script_path is not None:
        argv += ["--script", script_path]
    return argv


# ---- matching, without I/O ----


@dataclass
class Divergence:
    kind: str  # "differs" | "unexpected" | "missing" | "not_json"
    line: int  # the recording's line number (of the expected line, or where the replay was)
    expected: Any = None
    actual: Any = None
    actual_index: int | None = None  # the bridge's line number in this replay
    diffs: list[str] = field(default_factory=list)

    def report(self) -> str:
        what = {
            "differs": "the bridge answered differently",
            "unexpected": "the bridge wrote a line the recording does not have",
            "missing": "a recorded line did not come",
            "not_json": "the bridge wrote a line that is not JSON",
        }[self.kind]
        out = [f"DIVERGED at recording line {self.line}: {what}"]
        if self.expected is not None:
            out.append(f"  expected (recording line {self.line}): {_compact(self.expected)}")
        if self.actual is not None:
            out.append(f"  actual (replay line {self.actual_index}): {_compact(self.actual)}")
        elif self.kind == "missing":
            out.append("  actual: nothing within the timeout")
        if self.diffs:
            out.append("  diff:")
            out += [f"    {d}" for d in self.diffs]
        return "\n".join(out)


def _compact(msg: Any) -> str:
    text = json.dumps(msg, separators=(",", ":"), ensure_ascii=False)
    return text if len(text) <= 600 else text[:600] + f"... ({len(text)} characters)"


def _key(msg: Any, turn: Callable[[str], str | None]) -> tuple[Any, ...] | None:
    """What a line answers: a response its request id, an event its turn and seq. ``None``:
    an event of a turn not known yet."""
    if isinstance(msg, list):
        return ("batch", tuple(json.dumps(m.get("id") if isinstance(m, dict) else None) for m in msg))
    if isinstance(msg, dict) and "method" in msg:
        params = msg.get("params")
        if isinstance(params, dict) and isinstance(params.get("turnId"), str):
            mapped = turn(params["turnId"])
            return None if mapped is None else ("event", mapped, params.get("seq"))
        return ("notification", msg["method"])
    if isinstance(msg, dict):
        return ("response", json.dumps(msg.get("id")))
    return ("other",)


class Matcher:
    """The recorded lines of the bridge against the replay's, one actual line at a time."""

    def __init__(self, expected: list[tuple[int, Any]]) -> None:
        self.expected = expected
        self.matched = [False] * len(expected)
        self._prefix = 0  # every expected line before this index is matched
        self._by_key: dict[tuple[Any, ...], deque[int]] = {}
        for i, (_, msg) in enumerate(expected):
            k = _key(msg, lambda t: t)
            assert k is not None
            self._by_key.setdefault(k, deque()).append(i)
        self.ids: dict[str, str] = {}  # recorded id -> this run's
        self._rev: dict[str, str] = {}
        self._held: list[tuple[int, Any]] = []  # actual events of turns not mapped yet
        self.methods: dict[str, str] = {}  # request id (as JSON) -> method, as sent
        self.count = 0  # actual lines fed
        self.lenient = False  # past the recording's end: lines without a counterpart are not divergences

    def sent(self, line: bytes) -> bytes:
        """A line of the game's, about to be sent: recorded ids become this run's; the
        methods of its requests are noted (for ``IGNORED``)."""
        if self.ids:
            line = _ID_IN_LINE.sub(
                lambda mo: f'"{self.ids.get(mo.group(1), mo.group(1))}"', line.decode("utf-8", "surrogateescape")
            ).encode("utf-8", "surrogateescape")
        try:
            msg = json.loads(line)
        except ValueError:
            return line
        for call in msg if isinstance(msg, list) else [msg]:
            if isinstance(call, dict) and "id" in call and isinstance(call.get("method"), str):
                self.methods[json.dumps(call["id"])] = call["method"]
        return line

    def matched_before(self, n: int) -> bool:
        while self._prefix < len(self.matched) and self.matched[self._prefix]:
            self._prefix += 1
        return self._prefix >= n

    def first_missing(self, at_line: int) -> Divergence:
        self.matched_before(len(self.matched))
        if self._prefix < len(self.expected):
            n, msg = self.expected[self._prefix]
            return Divergence("missing", n, expected=msg)
        index, msg = self._held[0]
        return Divergence("unexpected", at_line, actual=msg, actual_index=index)

    def held(self) -> list[tuple[int, Any]]:
        return list(self._held)

    def feed(self, raw: bytes, at_line: int) -> Divergence | None:
        """One line the bridge wrote; ``at_line``: the recording's line the replay is at."""
        self.count += 1
        try:
            msg = json.loads(raw)
        except ValueError:
            return Divergence("not_json", at_line, actual=raw.decode("utf-8", "replace"), actual_index=self.count)
        return self._place(self.count, msg, at_line)

    def _place(self, index: int, msg: Any, at_line: int) -> Divergence | None:
        k = _key(msg, self._rev.get)
        if k is None:
            self._held.append((index, msg))
            return None
        queue = self._by_key.get(k)
        if not queue:
            if self.lenient:
                return None
            return Divergence("unexpected", at_line, actual=msg, actual_index=index)
        i = queue.popleft()
        line, expected = self.expected[i]
        ignored = (
            IGNORED.get(self.methods.get(json.dumps(msg.get("id")), ""), ())
            if isinstance(msg, dict) and "id" in msg
            else ()
        )
        diffs = list(self._diff(expected, msg, (), ignored))
        if diffs:
            return Divergence("differs", line, expected=expected, actual=msg, actual_index=index, diffs=diffs[:12])
        self.matched[i] = True
        return self._retry_held(at_line)

    def _retry_held(self, at_line: int) -> Divergence | None:
        progress = True
        while progress and self._held:
            progress = False
            for j, (index, msg) in enumerate(self._held):
                if _key(msg, self._rev.get) is not None:
                    del self._held[j]
                    found = self._place(index, msg, at_line)
                    if found is not None:
                        return found
                    progress = True
                    break
        return None

    def _same_id(self, rec: str, act: str) -> bool:
        if rec in self.ids:
            return self.ids[rec] == act
        if rec == act:
            return True
        if act in self._rev or not (_BRIDGE_ID.match(rec) and _BRIDGE_ID.match(act) and rec[:5] == act[:5]):
            return False
        self.ids[rec], self._rev[act] = act, rec
        return True

    def _mapped_text(self, text: str) -> str:
        """``text`` with the recorded ids in it (an error message naming a call) as this run's."""
        return _ID_IN_TEXT.sub(lambda mo: self.ids.get(mo.group(0), mo.group(0)), text) if self.ids else text

    def _diff(self, exp: Any, act: Any, path: tuple[str, ...], ignored: tuple[tuple[str, ...], ...]) -> Iterator[str]:
        if path in ignored:
            return
        where = _path(path)
        if isinstance(exp, dict) and isinstance(act, dict):
            for k in [*exp, *(k for k in act if k not in exp)]:
                if k not in act:
                    yield f"{_path((*path, k))}: missing (recorded {_compact(exp[k])})"
                elif k not in exp:
                    yield f"{_path((*path, k))}: not in the recording (now {_compact(act[k])})"
                elif k in _ID_FIELDS and isinstance(exp[k], str) and isinstance(act[k], str):
                    if not self._same_id(exp[k], act[k]):
                        was = self.ids.get(exp[k])
                        yield f"{_path((*path, k))}: {exp[k]!r} was {was!r} in this replay, now {act[k]!r}"
                else:
                    yield from self._diff(exp[k], act[k], (*path, k), ignored)
        elif isinstance(exp, list) and isinstance(act, list):
            if len(exp) != len(act):
                yield f"{where}: {len(exp)} items recorded, {len(act)} now"
            for i, (e, a) in enumerate(zip(exp, act, strict=False)):  # a length change is said above
                yield from self._diff(e, a, (*path, str(i)), ignored)
        elif isinstance(exp, str) and isinstance(act, str):
            if exp != act and not (_BRIDGE_ID.match(exp) and self._same_id(exp, act)) and self._mapped_text(exp) != act:
                yield f"{where}: {_compact(exp)} -> {_compact(act)}"
        elif type(exp) is not type(act) or exp != act:
            yield f"{where}: {_compact(exp)} -> {_compact(act)}"


def _path(path: tuple[str, ...]) -> str:
    return ".".join(path) or "(the whole line)"


# ---- playing it, over a real bridge process ----


@dataclass
class Outcome:
    divergence: Divergence | None
    sent: int = 0
    compared: int = 0
    notes: list[str] = field(default_factory=list)
    stderr: bytes = b""


async def replay(rec: Recording, command: list[str], env: dict[str, str], timeout_s: float) -> Outcome:
    """Plays ``rec`` against the bridge ``command`` starts; the first divergence, if any."""
    matcher = Matcher(rec.expected)
    out = Outcome(None)
    changed = trio.Event()
    at_line = rec.steps[0].line if rec.steps else 1
    stdout_done = trio.Event()
    err = bytearray()

    def found(d: Divergence | None) -> None:
        if d is not None and out.divergence is None:
            out.divergence = d

    process = await trio.lowlevel.open_process(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
    )
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    stdin, stdout, stderr = process.stdin, process.stdout, process.stderr

    async def read_stdout() -> None:
        nonlocal changed
        buf = b""
        try:
            async for data in stdout:
                buf += data
                *lines, buf = buf.split(b"\n")
                for line in lines:
                    found(matcher.feed(line, at_line))
                changed.set()
                changed = trio.Event()
        finally:
            stdout_done.set()
            changed.set()

    async def read_stderr() -> None:
        async for data in stderr:
            err.extend(data)

    async def wait_for(done: Callable[[], bool]) -> bool:
        """Until ``done()``; ``False`` after ``timeout_s`` with no line from the bridge (its
        first line, which waits for its start-up, gets ``STARTUP_S`` at least)."""
        while not done() and out.divergence is None:
            if stdout_done.is_set():
                return done()
            with trio.move_on_after(timeout_s if matcher.count else max(timeout_s, STARTUP_S)) as waited:
                await changed.wait()
            if waited.cancelled_caught:
                return False
        return True

    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_stdout)
            nursery.start_soon(read_stderr)
            stdin_open = True
            for step in rec.steps:
                at_line = step.line
                if not await wait_for(partial(matcher.matched_before, step.after)):
                    found(matcher.first_missing(at_line))
                if out.divergence is not None:
                    break
                if step.end is None:
                    data = b"".join(matcher.sent(line) + b"\n" for _, line in step.lines)
                    out.sent += len(step.lines)
                    try:
                        await stdin.send_all(data)
                    except (trio.BrokenResourceError, trio.ClosedResourceError):
                        pass  # it exited: what it wrote decides
                elif "signal" in step.end:
                    process.send_signal(int(step.end["signal"]))
                elif stdin_open:  # stdin EOF, or the game gone: both end the session the same way
                    await stdin.aclose()
                    stdin_open = False
            if out.divergence is None:
                at_line = rec.steps[-1].line if rec.steps else 1
                if not await wait_for(lambda: matcher.matched_before(len(rec.expected))):
                    found(matcher.first_missing(at_line))
            if out.divergence is None:
                if not rec.ended_by_game():
                    matcher.lenient = True
                    out.notes.append(
                        "the recording ends without the session's end: the bridge's lines after it were not compared"
                    )
                if stdin_open:
                    await stdin.aclose()
                with trio.move_on_after(timeout_s):
                    await stdout_done.wait()
                    await process.wait()
                if matcher.held() and not matcher.lenient:
                    found(matcher.first_missing(at_line))
            nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
    out.compared = sum(matcher.matched)
    out.stderr = bytes(err)
    return out


def _parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    ap = argparse.ArgumentParser(
        prog="oam replay",
        description=(
            "Replay a session recorded with oam-bridge --record against a fresh bridge and report the first divergence "
            "(exit status 0: it matched, 1: it diverged, 2: no replay). Options after -- go to the bridge, after the "
            "recorded ones."
        ),
    )
    ap.add_argument("recording", help="the JSONL file oam-bridge --record wrote")
    ap.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_S,
        help=(
            "seconds without a line from the bridge before a recorded line it has not written counts as missing "
            f"(default {DEFAULT_TIMEOUT_S:g}; its first line gets {STARTUP_S:g} at least)"
        ),
    )
    ap.add_argument(
        "--bridge",
        help="the bridge command to replay against (default: this Python's -m bridge), e.g. dist/oam-bridge/oam-bridge",
    )
    ap.add_argument("--quiet", action="store_true", help="print the divergence only")
    return ap.parse_args(argv), extra


def main(argv: list[str]) -> int:
    """``oam replay ARGS``: 0 the replay matched, 1 it diverged, 2 no replay."""
    args, extra = _parse_args(argv)
    try:
        rec = Recording.load(args.recording)
    except OSError as e:
        print(f"oam replay: {args.recording}: {e.strerror or e}", file=sys.stderr)
        return 2
    except RecordingError as e:
        print(f"oam replay: {e}", file=sys.stderr)
        return 2
    env = {k: v for k, v in os.environ.items() if k not in _ENV_OF_OPTIONS}
    with tempfile.TemporaryDirectory(prefix="oam-replay-") as tmp:
        script_path = None
        if rec.header.get("script") is not None:
            script_path = os.path.join(tmp, "script.json")
            with open(script_path, "w") as f:
                json.dump(rec.header["script"], f)
        base = shlex.split(args.bridge) if args.bridge else [sys.executable, "-m", "bridge"]
        command = [*base, *bridge_argv(rec.header, script_path), *extra]
        if not args.quiet:
            print(
                f"replaying {args.recording} (bridge {rec.header.get('bridgeVersion')}, {len(rec.steps)} writes "
                f"of the game, {len(rec.expected)} lines of the bridge)"
            )
            for w in rec.warnings():
                print(f"  note: {w}")
        try:
            outcome = trio.run(replay, rec, command, env, args.timeout)
        except OSError as e:
            print(f"oam replay: cannot start the bridge {shlex.join(base)}: {e.strerror or e}", file=sys.stderr)
            return 2
    if not args.quiet:
        for note in outcome.notes:
            print(f"  note: {note}")
    if outcome.divergence is not None:
        print(outcome.divergence.report())
        tail = outcome.stderr.decode("utf-8", "replace").strip().splitlines()[-5:]
        if tail and not args.quiet:
            print("  the bridge's last stderr lines:\n" + "\n".join(f"    {x}" for x in tail))
        return 1
    if not args.quiet:
        print(f"MATCHED: {outcome.sent} lines sent, {outcome.compared} lines of the bridge compared")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
