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

A recording cut short (no trailer: the recorded bridge was killed, a player's crash, or its
disk filled) is replayed up to its end: every recorded line must come and match, and a line
of the bridge's that the recording does not have counts as written after the recording's end,
unless it cannot be (an event of a turn whose ``turn/completed`` or ``turn/failed`` is
recorded). Its last line, when the kill cut it in half, is left out. Such a replay ends
``MATCHED up to the recording's end, where the recorded bridge stopped``.

The recording is read as untrusted input (a bug report from anyone): every record is checked
against its shape (``msgspec`` structs) and the recorded bridge's own limits before anything
runs, and a file that fails is no replay (exit status 2, one line naming the recording's line
and what is wrong). A game's line is at most the recorded ``maxLineBytes`` (the bridge could
not have read a longer one); a line the bridge dropped as too long (``tooLong``) is longer than
that, and is sent again as that many bytes streamed in ``CHUNK_BYTES`` pieces, never held in
memory, the recording's such lines ``MAX_DROPPED_BYTES`` at most together; a record nests JSON
``MAX_DEPTH`` deep at most; a recorded signal is SIGTERM or SIGINT (the ones the bridge
records). The bridge's recorded lines are kept as their bytes and decoded when compared, so
the replay holds about the file's size in memory.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import shlex
import signal
import subprocess
import sys
import tempfile
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec
import trio

from bridge.core._messages import Limits
from bridge.hosts._json import nesting_ok

DEFAULT_TIMEOUT_S: Final = 30.0  # seconds without a line from the bridge while a recorded one is awaited
STARTUP_S: Final = 60.0  # the bridge's first line (its start-up, a model loading) gets this at least
MAX_DROPPED_BYTES: Final = 1 << 30  # the too-long lines of one recording, together (streamed, never held)
CHUNK_BYTES: Final = 1 << 20  # a too-long line goes to the bridge in pieces of this size
# JSON nesting of a recorded message: the bridge reads maxNestingDepth (100) at most, and its
# answers put what it read a few levels deeper; far below Python's recursion limit
MAX_DEPTH: Final = 2 * Limits().max_nesting_depth
RECORDED_SIGNALS: Final = frozenset({int(signal.SIGTERM), int(signal.SIGINT)})  # what the bridge records
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
    "llama_batch_threads": "--llama-batch-threads",
    "native_stream": "--native-stream",
    "priority": "--priority",
    "openai_url": "--openai-url",
    "openai_model": "--openai-model",
    "openai_timeout": "--openai-timeout",
    "openai_step_timeout": "--openai-step-timeout",
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
    "OAM_LLAMA_BATCH_THREADS",
    "OAM_NATIVE_STREAM",
    "OAM_PRIORITY",
    "OAM_LLAMA_VERBOSE",
    "OAM_OPENAI_URL",
    "OAM_OPENAI_MODEL",
    "OAM_OPENAI_TIMEOUT",
    "OAM_OPENAI_STEP_TIMEOUT",
    "OAM_OPENAI_CONNECT_TIMEOUT",
    "OAM_OPENAI_CTX",
    "OAM_OPENAI_GRAMMAR",
    "OAM_RECORD",
)


_T = TypeVar("_T")


class RecordingError(Exception):
    """The file is not a recording this replayer reads."""


# ---- the recording ----

_Text = Annotated[str, msgspec.Meta(pattern="^[^\x00]*$")]  # a command-line argument: no NUL


class _Options(msgspec.Struct):
    """The header's ``options`` the replay passes on (``_FLAGS``; ``vars(args)``, so snake
    case); the others are not read. A value of the wrong type is no replay."""

    engine: _Text | None = None
    model: _Text | None = None
    llama_ctx: int | None = None
    llama_threads: int | None = None
    llama_batch_threads: int | None = None
    native_stream: Literal["untooled", "never"] | None = None
    priority: Literal["below", "normal"] | None = None
    openai_url: _Text | None = None
    openai_model: _Text | None = None
    openai_timeout: float | None = None
    openai_step_timeout: float | None = None
    openai_connect_timeout: float | None = None
    openai_ctx: int | None = None
    openai_grammar: bool | None = None
    max_line_bytes: Annotated[int, msgspec.Meta(ge=1)] | None = None
    max_npcs: int | None = None
    max_pending_lines: int | None = None
    max_outbound_bytes: int | None = None
    exit_grace_ms: int | None = None


class Header(msgspec.Struct, rename="camel"):
    """The recording's first line, the parts the replay reads."""

    oam_recording: Literal[1]
    bridge_version: str | None = None
    options: _Options | None = None
    script: Any = None  # --script's steps: the bridge checks them

    @property
    def max_line_bytes(self) -> int:
        opts = self.options
        return opts.max_line_bytes if opts is not None and opts.max_line_bytes is not None else Limits().max_line_bytes


class _Record(msgspec.Struct, rename="camel"):
    """Any record after the header (``bridge/jsonrpc/_record.py``); which one it is, by the
    fields set, is checked in ``Recording.load``."""

    t: float | None = None
    dir: Literal["in", "out"] | None = None
    read: int | None = None
    line: str | msgspec.UnsetType = msgspec.UNSET
    too_long: int | msgspec.UnsetType = msgspec.UNSET
    eof: Literal[True] | msgspec.UnsetType = msgspec.UNSET
    signal: int | msgspec.UnsetType = msgspec.UNSET
    parent_gone: Literal[True] | msgspec.UnsetType = msgspec.UNSET
    msg: msgspec.Raw | msgspec.UnsetType = msgspec.UNSET  # kept as bytes (a view of the line)
    end: Literal[True] | msgspec.UnsetType = msgspec.UNSET
    npcs: dict[str, Any] | None = None
    dropped_lines: Annotated[int, msgspec.Meta(ge=0)] | None = None

    def ins(self) -> list[str]:
        """The fields set that only a record of the game's side has."""
        return [
            name
            for name, value in (
                ("line", self.line),
                ("tooLong", self.too_long),
                ("eof", self.eof),
                ("signal", self.signal),
                ("parentGone", self.parent_gone),
            )
            if value is not msgspec.UNSET
        ]


@dataclass
class Step:
    """What the game did at one point: lines written in one write, or how it ended."""

    line: int  # the recording's line number of the first
    after: int  # the bridge's recorded lines before it (to wait for)
    # (recording line, raw line); an int: a line of that many bytes the bridge dropped as too long
    lines: list[tuple[int, bytes | int]] = field(default_factory=list)
    end: dict[str, Any] | None = None  # {"eof": true} | {"signal": n} | {"parentGone": true}


@dataclass
class Expected:
    """A line the recorded bridge wrote: its bytes, decoded when compared."""

    line: int  # the recording's line number
    raw: msgspec.Raw
    key: tuple[Any, ...]

    def msg(self) -> Any:
        return msgspec.json.decode(self.raw)


@dataclass
class Recording:
    header: Header
    steps: list[Step]
    expected: list[Expected]
    trailer: _Record | None
    finished_turns: set[str] = field(default_factory=set)  # turns whose terminal event is recorded
    cut_line: int | None = None  # the last line, cut in half by a kill (left out)

    @property
    def cut_short(self) -> bool:
        """No trailer: the recorded bridge stopped (killed, a crash, a full disk) before its end."""
        return self.trailer is None

    @classmethod
    def load(cls, path: str) -> Recording:
        """Reads and checks ``path``; ``RecordingError`` (one line: the recording's line and
        what is wrong) for anything a replay cannot play or the recorder cannot have written."""
        with open(path, "rb") as f:
            return cls._read(path, f)

    @classmethod
    def _read(cls, path: str, f: Any) -> Recording:
        def bad(n: int, what: str) -> RecordingError:
            return RecordingError(f"{path}: line {n}: {what}")

        first = f.readline()
        try:
            header = _decode(first, Header)
        except msgspec.ValidationError as e:  # (a DecodeError too)
            raise RecordingError(f"{path}: line 1 is not an oam-bridge recording header (format 1): {e}") from None
        except msgspec.DecodeError:
            raise RecordingError(f"{path}: line 1 is not an oam-bridge recording header (format 1)") from None
        except RecursionError:
            raise RecordingError(
                f"{path}: line 1 is not an oam-bridge recording header (format 1): JSON nested too deeply"
            ) from None
        if not nesting_ok(header.script, MAX_DEPTH):
            raise RecordingError(f"{path}: line 1: the header's script is JSON nested deeper than {MAX_DEPTH}")
        limit = header.max_line_bytes
        steps: list[Step] = []
        expected: list[Expected] = []
        finished: set[str] = set()
        trailer: _Record | None = None
        cut_line = None
        last_read: int | None = None
        dropped = 0
        n = 1
        for b in f:
            n += 1
            if not b.strip():
                continue
            if trailer is not None:
                raise bad(n, "a record after the trailer (the recording's last line)")
            try:
                rec = _decode(b, _Record)
            except msgspec.ValidationError as e:  # (a DecodeError too: first)
                raise bad(n, f"not a record this replayer reads: {e}") from None
            except (msgspec.DecodeError, RecursionError) as e:
                if not b.endswith(b"\n"):  # the last line, cut in half by a kill: left out
                    cut_line = n
                    break
                raise bad(
                    n,
                    f"not JSON ({e})" if isinstance(e, msgspec.DecodeError) else f"JSON nested deeper than {MAX_DEPTH}",
                ) from None
            ins = rec.ins()
            if rec.end is not msgspec.UNSET:
                if rec.dir is not None or ins or rec.msg is not msgspec.UNSET:
                    raise bad(n, "a trailer with the fields of another record")
                trailer = rec
            elif rec.dir == "out":
                if rec.msg is msgspec.UNSET:
                    raise bad(n, 'a line of the bridge\'s ("dir":"out") without its "msg"')
                if ins:
                    raise bad(n, f'a line of the bridge\'s ("dir":"out") with {ins[0]!r}')
                expected.append(_expected(n, rec.msg, finished, bad))
            elif rec.dir == "in":
                if len(ins) != 1 or rec.msg is not msgspec.UNSET:
                    what = ", ".join(ins + (["msg"] if rec.msg is not msgspec.UNSET else [])) or "none of them"
                    raise bad(
                        n, f"a record of the game's side has one of line, tooLong, eof, signal, parentGone: {what}"
                    )
                data: bytes | int
                if rec.line is not msgspec.UNSET:
                    try:
                        data = rec.line.encode("utf-8", "surrogateescape")
                    except UnicodeEncodeError:
                        raise bad(n, "the line holds characters that are no bytes the game wrote") from None
                    if len(data) > limit:
                        raise bad(
                            n,
                            f"a line of {len(data)} bytes, over the recorded maxLineBytes {limit}: "
                            "the bridge would have dropped it",
                        )
                    if b"\n" in data:
                        raise bad(n, "a line with a newline in it: the bridge reads lines")
                elif rec.too_long is not msgspec.UNSET:
                    data = rec.too_long
                    if data <= limit:
                        raise bad(
                            n,
                            f"a line dropped as too long, of {data} bytes: not over the recorded maxLineBytes {limit}",
                        )
                    dropped += data
                    if dropped > MAX_DROPPED_BYTES:
                        raise bad(
                            n,
                            f"a line dropped as too long, of {data} bytes: a replay sends {MAX_DROPPED_BYTES} bytes "
                            f"of such lines at most, and the recording has {dropped} up to here",
                        )
                else:
                    if rec.signal is not msgspec.UNSET and rec.signal not in RECORDED_SIGNALS:
                        raise bad(
                            n,
                            f"signal {rec.signal}: the bridge records SIGTERM ({int(signal.SIGTERM)}) "
                            f"and SIGINT ({int(signal.SIGINT)}) only",
                        )
                    end = {ins[0]: getattr(rec, {"parentGone": "parent_gone"}.get(ins[0], ins[0]))}
                    steps.append(Step(n, len(expected), end=end))
                    continue
                if last_read is None or rec.read != last_read or steps[-1].end is not None:
                    steps.append(Step(n, len(expected)))
                steps[-1].lines.append((n, data))
                last_read = rec.read
            else:
                raise bad(n, 'no record this replayer knows (no "dir" and not the trailer)')
        return cls(header, steps, expected, trailer, finished, cut_line)

    def ended_by_game(self) -> bool:
        """The session's end is in the recording (stdin EOF, a signal, ``exit``): the bridge's
        lines after it are the replay's to compare too."""
        if not self.steps:
            return False
        last = self.steps[-1]
        return last.end is not None or any(isinstance(line, bytes) and b'"exit"' in line for _, line in last.lines)

    def warnings(self) -> list[str]:
        """What the recording cannot promise to replay exactly."""
        out = []
        if self.trailer is None:
            out.append(
                "the recording has no trailer (the bridge was killed?): it is replayed up to its end, and the "
                "lines after its end are not compared"
            )
        elif self.trailer.dropped_lines:
            out.append(
                f"the recording dropped {self.trailer.dropped_lines} lines (the disk was slower than the bridge)"
            )
        if self.cut_line is not None:
            out.append(f"its last line (line {self.cut_line}) was cut in half when the bridge stopped: left out")
        npcs = (self.trailer.npcs if self.trailer is not None else None) or {}
        for npc, info in npcs.items():  # the game's requests as recorded: anything
            if not isinstance(info, dict):
                continue
            opts = info.get("options")
            opts = opts if isinstance(opts, dict) else {}
            engine, temperature = info.get("engine"), opts.get("temperature")
            if engine in ("llama", "openai", "native") and temperature != 0 and opts.get("seed") is None:
                shown = temperature if isinstance(temperature, (int, float)) else "default"
                out.append(
                    f"npc {npc[:80]!r} sampled on {engine} at temperature {shown} "
                    "without a seed: its texts are random and may differ"
                )
        return out


_SURROGATE: Final = re.compile(rb"\\u[dD][89a-fA-F]")


def _decode(data: bytes, typ: type[_T]) -> _T:
    """One record as ``typ``. msgspec refuses a lone surrogate in a string (``\\udcff``), which
    is how the recorder writes a byte that is not UTF-8 (a game's line, a file name in
    ``argv``): such a record is read by ``json`` and then checked by msgspec. The bridge's own
    lines (``msg``, kept as msgspec's raw bytes) never hold one."""
    try:
        return msgspec.json.decode(data, type=typ)
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError:
        if not _SURROGATE.search(data):
            raise
        try:
            obj = json.loads(data)
        except (ValueError, RecursionError):
            obj = None
        if not isinstance(obj, dict) or "msg" in obj:
            raise
        try:
            return msgspec.convert(obj, typ)
        except UnicodeEncodeError:  # msgspec's message about a value holding a lone surrogate
            raise msgspec.ValidationError("a value of the wrong type, holding a lone surrogate") from None


def _expected(n: int, raw: msgspec.Raw, finished: set[str], bad: Callable[[int, str], RecordingError]) -> Expected:
    """A recorded line of the bridge's, checked: a JSON object or a batch, ``MAX_DEPTH`` deep
    at most."""
    try:
        msg = msgspec.json.decode(raw)
    except RecursionError:
        raise bad(n, f"JSON nested deeper than {MAX_DEPTH}") from None
    if not isinstance(msg, (dict, list)):
        raise bad(n, f'"msg" is {type(msg).__name__}: the bridge writes JSON objects and batches (arrays)')
    if not nesting_ok(msg, MAX_DEPTH):
        raise bad(n, f"JSON nested deeper than {MAX_DEPTH}")
    key = _key(msg, lambda t: t)
    assert key is not None
    if isinstance(msg, dict) and msg.get("method") in ("turn/completed", "turn/failed"):
        params = msg.get("params")
        if isinstance(params, dict) and isinstance(params.get("turnId"), str):
            finished.add(params["turnId"])
    return Expected(n, raw, key)


def bridge_argv(header: Header, script_path: str | None) -> list[str]:
    """The recorded bridge options as command-line flags."""
    opts = header.options or _Options()
    argv: list[str] = []
    for key, flag in _FLAGS.items():
        value = getattr(opts, key)
        if value is not None:
            argv += [flag, str(value)]
    for key, flag in _SWITCHES.items():
        if getattr(opts, key):
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
    an event of a turn not known yet. Values are taken as their JSON (hashable, whatever a
    recording holds)."""
    if isinstance(msg, list):
        return ("batch", tuple(json.dumps(m.get("id") if isinstance(m, dict) else None) for m in msg))
    if isinstance(msg, dict) and "method" in msg:
        params = msg.get("params")
        if isinstance(params, dict) and isinstance(params.get("turnId"), str):
            mapped = turn(params["turnId"])
            return None if mapped is None else ("event", mapped, json.dumps(params.get("seq")))
        return ("notification", json.dumps(msg["method"]))
    if isinstance(msg, dict):
        return ("response", json.dumps(msg.get("id")))
    return ("other",)


class Matcher:
    """The recorded lines of the bridge against the replay's, one actual line at a time."""

    def __init__(self, expected: list[Expected], finished_turns: set[str] | None = None) -> None:
        self.expected = expected
        self.matched = [False] * len(expected)
        self._prefix = 0  # every expected line before this index is matched
        self._by_key: dict[tuple[Any, ...], deque[int]] = {}
        for i, e in enumerate(expected):
            self._by_key.setdefault(e.key, deque()).append(i)
        # a recording cut short (no trailer): a line without a counterpart may come from after
        # its end, unless it is an event of a turn whose end is recorded
        self.cut_short = False
        self.finished_turns = finished_turns or set()
        self.past_end = 0  # lines taken as written after the recording's end
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
            msg = msgspec.json.decode(line)
        except (msgspec.DecodeError, RecursionError):
            return line  # the bridge answers it as it is
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
            e = self.expected[self._prefix]
            return Divergence("missing", e.line, expected=e.msg())
        index, msg = self._held[0]
        return Divergence("unexpected", at_line, actual=msg, actual_index=index)

    def held(self) -> list[tuple[int, Any]]:
        return list(self._held)

    def feed(self, raw: bytes, at_line: int) -> Divergence | None:
        """One line the bridge wrote; ``at_line``: the recording's line the replay is at."""
        self.count += 1
        try:
            msg = msgspec.json.decode(raw)
            if not nesting_ok(msg, MAX_DEPTH):
                raise RecursionError
        except (msgspec.DecodeError, RecursionError):
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
                self.past_end += self.cut_short
                return None
            if self.cut_short and not (k[0] == "event" and k[1] in self.finished_turns):
                self.past_end += 1
                return None
            return Divergence("unexpected", at_line, actual=msg, actual_index=index)
        i = queue.popleft()
        line, expected = self.expected[i].line, self.expected[i].msg()
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
    lines: int = 0  # the bridge's lines in this replay
    exit_status: int | None = None  # the bridge's, when it exited by itself
    cut_short: bool = False  # the recording ended before the session did; it matched up to there


_STDERR_KEPT: Final = 64 * 1024  # the end of the bridge's stderr, for the report
_FILL: Final = memoryview(b"x" * CHUNK_BYTES)  # what a too-long line is made of


async def _send_lines(stdin: trio.abc.SendStream, matcher: Matcher, lines: list[tuple[int, bytes | int]]) -> None:
    """One step's lines: in one write, but a too-long line streamed in ``CHUNK_BYTES`` pieces."""
    parts: list[bytes] = []
    for _, line in lines:
        if isinstance(line, bytes):
            parts.append(matcher.sent(line) + b"\n")
            continue
        if parts:
            await stdin.send_all(b"".join(parts))
            parts.clear()
        left = line
        while left > 0:
            piece = min(left, CHUNK_BYTES)
            await stdin.send_all(_FILL[:piece])
            left -= piece
        parts.append(b"\n")
    if parts:
        await stdin.send_all(b"".join(parts))


async def replay(rec: Recording, command: list[str], env: dict[str, str], timeout_s: float) -> Outcome:
    """Plays ``rec`` against the bridge ``command`` starts; the first divergence, if any."""
    matcher = Matcher(rec.expected, rec.finished_turns)
    matcher.cut_short = rec.cut_short
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
            if len(err) > 2 * _STDERR_KEPT:
                del err[:-_STDERR_KEPT]

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
                    out.sent += len(step.lines)
                    try:
                        await _send_lines(stdin, matcher, step.lines)
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
                if rec.cut_short:
                    matcher.lenient = True  # the rest of the session is not in the recording
                    out.cut_short = True
                elif not rec.ended_by_game():
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
                if rec.cut_short and out.divergence is None:
                    past = matcher.past_end + len(matcher.held())
                    out.notes.append(f"{past} lines of the bridge's came after the recording's end: not compared")
            elif matcher.count == 0 and stdout_done.is_set():
                with trio.move_on_after(min(timeout_s, 5)):  # it ended at start-up: its exit status says why
                    await process.wait()
            out.exit_status = process.returncode
            nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
    out.compared = sum(matcher.matched)
    out.lines = matcher.count
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
    for stream in (sys.stdout, sys.stderr):  # a recording's text (or its file name) is any text
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
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
        if rec.header.script is not None:
            script_path = os.path.join(tmp, "script.json")
            with open(script_path, "w") as f:
                json.dump(rec.header.script, f)  # its strings may hold lone surrogates: as the recorder wrote them
        base = shlex.split(args.bridge) if args.bridge else [sys.executable, "-m", "bridge"]
        command = [*base, *bridge_argv(rec.header, script_path), *extra]
        if not args.quiet:
            print(
                f"replaying {args.recording} (bridge {rec.header.bridge_version}, {len(rec.steps)} writes "
                f"of the game, {len(rec.expected)} lines of the bridge)"
            )
            for w in rec.warnings():
                print(f"  note: {w}")
        try:
            outcome = trio.run(replay, rec, command, env, args.timeout)
        except OSError as e:
            print(f"oam replay: cannot start the bridge {shlex.join(base)}: {e.strerror or e}", file=sys.stderr)
            return 2
    if outcome.lines == 0 and outcome.exit_status not in (None, 0):
        tail = outcome.stderr.decode("utf-8", "replace").strip().splitlines()[-1:]
        print(
            f"oam replay: the bridge did not start (exit status {outcome.exit_status})"
            + (f": {tail[0]}" if tail else ""),
            file=sys.stderr,
        )
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
        where = " up to the recording's end, where the recorded bridge stopped" if outcome.cut_short else ""
        print(f"MATCHED{where}: {outcome.sent} lines sent, {outcome.compared} lines of the bridge compared")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
