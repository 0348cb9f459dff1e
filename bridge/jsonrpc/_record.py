"""Recording a session (``oam-bridge --record FILE``, env ``OAM_RECORD``): every line the game
wrote and every line the bridge wrote, in order, to a JSONL file that ``bridge/hosts/replay.py``
plays back against a fresh bridge.

The file, one JSON object per line:

- line 1, the header: ``{"oamRecording": 1, "bridgeVersion", "startedAt", "argv", "options",
  "script", "llamaModel", "python", "platform"}``. ``options`` are the bridge's resolved
  options (command line and environment alike; the OpenAI API key is never written), ``script``
  the steps of ``--script`` (so a replay needs no other file), ``llamaModel`` the path and size
  of the llama engine's default model.
- then one record per line, in the order the bridge saw them, ``t`` in seconds on a monotonic
  clock from the start:

  - ``{"t", "dir": "in", "read": N, "line": "..."}``: a line the game wrote, exactly (as a
    JSON string; bytes that are not UTF-8 as ``\\udcXX``); ``read`` numbers the reads from
    stdin, so lines that arrived in one write share it;
  - ``{"t", "dir": "in", "read": N, "tooLong": bytes}``: a line over ``maxLineBytes`` (dropped);
  - ``{"t", "dir": "in", "eof": true}``, ``{"t", "dir": "in", "signal": 15}``,
    ``{"t", "dir": "in", "parentGone": true}``: how the session ended, when the game ended it;
  - ``{"t", "dir": "out", "msg": {...}}``: a line the bridge wrote, verbatim (the bridge's
    lines are JSON, so the record embeds the line's own bytes); ``t`` is when it was written,
    shared by the lines of one write. Lines dropped at exit because the game did not read
    them are not in the recording.
- last, the trailer: ``{"end": true, "t", "npcs": {npcId: {"engine", "model", "options"}},
  "droppedLines": N}``: each NPC's engine as the bridge chose it and its generation options
  (``temperature``, ``seed``: null is the engine's default; the llama engine's default seed is
  random, so only an NPC with a seed, or at temperature 0, replays its texts).

Cost on the event loop: a time stamp and a deque append per read and per write (the writer
writes many lines at once while a turn streams). A thread formats and writes the records,
flushing every ``FLUSH_EVERY_S``; it never touches stdout. ``close`` (stdin EOF,
``exit``, a signal, the game gone) writes what is queued and the trailer. Bound: past
``MAX_BACKLOG_BYTES`` not yet written (a disk slower than the bridge), lines are dropped from
the recording, never from the protocol, and the trailer counts them.

The recording never stops the bridge. A file that cannot be opened for writing (a missing
folder, a read-only path, a FIFO that no process reads: it is opened non-blocking, so that
open does not wait for a reader) and the first error writing it (a full disk, ``/dev/full``,
a reader gone) each say so in one line on stderr; the bridge goes on serving without a
recording, and what was queued for the file is dropped at once. A file cut short that way
has no trailer, like the file of a bridge that was killed: a replay plays it to its end.
"""

from __future__ import annotations

import datetime
import errno
import json
import logging
import os
import platform
import sys
import threading
import time
from collections import deque
from typing import Any, Final

from bridge._version import __version__
from bridge.jsonrpc._framing import LineTooLong

log = logging.getLogger("oam_bridge.record")

FORMAT_VERSION: Final = 1
FLUSH_EVERY_S: Final = 0.05  # a bridge that is SIGKILLed loses at most this much of the recording
MAX_BACKLOG_BYTES: Final = 64 * 1024 * 1024  # lines queued for the file, not yet written
CLOSE_TIMEOUT_S: Final = 1.0  # close() waits this long for the thread at most

# options that are not the session's (how stdio is read, logging) or not to be written
_NOT_RECORDED = frozenset(
    {"record", "parent", "argv", "stdio", "poll_us", "parent_watch_ms", "log_level", "openai_api_key"}
)

_IN, _OUT, _NOTE = 0, 1, 2
_TOO_LONG_SIZE = 64  # what an oversize line's record weighs in the backlog (its bytes are gone)


class Recorder:
    """Records one session to ``path``. ``inbound``/``outbound``/``note`` are called on the
    event loop and never block; ``close`` once, at the end (later calls do nothing).

    Never raises for the file: one that cannot be opened, or the first write that fails,
    says so once on stderr and the recorder stops (``recording`` is then false)."""

    def __init__(self, path: str, header: dict[str, Any]) -> None:
        self.path = path
        self._header = header
        self._t0 = time.monotonic()
        self._queue: deque[tuple[int, float, Any]] = deque()
        self._added = 0  # bytes queued: the loop's counter
        self._written = 0  # bytes formatted: the thread's counter
        self._reads = 0
        self.dropped_lines = 0
        self._closing = threading.Event()
        self._closed = False
        # what the trailer says about each NPC (the thread's only)
        self._npcs: dict[str, dict[str, Any]] = {}
        self._creating: dict[Any, str] = {}  # request id -> npcId, until its response
        self._fd = _open(path)
        # False once the file cannot be written: the loop then queues nothing (a plain
        # attribute: the thread sets it, the loop reads it; a line queued in between is dropped)
        self.recording = self._fd is not None
        self._thread: threading.Thread | None = None
        if self._fd is not None:
            self._thread = threading.Thread(target=self._run, args=(self._fd,), name="oam-record", daemon=True)
            self._thread.start()

    # ---- on the event loop ----

    def inbound(self, items: list[bytes | LineTooLong]) -> None:
        """The lines of one read from stdin."""
        if not self.recording:
            return
        self._reads += 1
        t = time.monotonic()
        for item in items:
            self._add(_IN, t, (self._reads, item), _TOO_LONG_SIZE if isinstance(item, LineTooLong) else len(item))

    def outbound(self, data: bytes) -> None:
        """Lines the bridge writes (whole, with their newlines; one or many)."""
        if not self.recording:
            return
        if self._added - self._written > MAX_BACKLOG_BYTES:
            self.dropped_lines += data.count(b"\n")
            return
        self._added += len(data)
        self._queue.append((_OUT, time.monotonic(), data))

    def note(self, **what: Any) -> None:
        """How the game ended the session: ``eof=True``, ``signal=15``, ``parentGone=True``."""
        if not self.recording:
            return
        self._queue.append((_NOTE, time.monotonic(), what))

    def _add(self, kind: int, t: float, what: Any, size: int) -> None:
        if self._added - self._written > MAX_BACKLOG_BYTES:
            self.dropped_lines += 1
            return
        self._added += size
        self._queue.append((kind, t, what))

    def close(self) -> None:
        """Write what is queued and the trailer, close the file; waits ``CLOSE_TIMEOUT_S`` at
        most (the bridge's exit stays bounded)."""
        if self._closed or self._thread is None:
            return
        self._closed = True
        self._closing.set()
        self._thread.join(CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            log.warning("recording: not finished writing within %.1f s; the file may end early", CLOSE_TIMEOUT_S)

    # ---- the recording thread ----

    def _run(self, fd: int) -> None:
        try:
            _write(fd, _dumps(_complete_header(self._header)))
            while True:
                closing = self._closing.wait(FLUSH_EVERY_S)
                self._drain(fd)
                if closing:
                    break
            trailer = {
                "end": True,
                "t": round(time.monotonic() - self._t0, 6),
                "npcs": self._npcs,
                "droppedLines": self.dropped_lines,
            }
            _write(fd, _dumps(trailer))
        except OSError as e:  # a full disk, /dev/full, a FIFO's reader gone: stop, once
            self._stop()
            _say(self.path, f"stopped recording ({_reason(e)}); the file ends here, the bridge goes on without it")
        except Exception:  # a bug of the recorder's: it must never take the bridge down
            self._stop()
            log.exception("recording failed; the bridge goes on without it")
        finally:
            try:
                os.close(fd)
            except OSError:
                pass  # what close reports about a file already given up on changes nothing

    def _stop(self) -> None:
        """No more recording: the loop stops queueing, and what it queued is dropped."""
        self.recording = False
        self._queue.clear()

    def _drain(self, fd: int) -> None:
        t0 = self._t0
        queue = self._queue
        out: list[bytes] = []
        written = 0
        while queue:
            kind, t, what = queue.popleft()
            if kind == _OUT:
                # The bridge's lines are JSON without a raw newline: one replace makes the
                # records of the whole write, with no Python work per line.
                written += len(what)
                prefix = b'{"t":%.6f,"dir":"out","msg":' % (t - t0)
                out.append(prefix + what[:-1].replace(b"\n", b"}\n" + prefix) + b"}\n")
                if self._creating:
                    for line in what.split(b"\n"):
                        if line.startswith((b'{"jsonrpc":"2.0","id":', b"[")):  # a response, or a batch's
                            self._created(line)
            elif kind == _IN:
                read, item = what
                rec: dict[str, Any] = {"t": round(t - t0, 6), "dir": "in", "read": read}
                if isinstance(item, LineTooLong):
                    rec["tooLong"] = item.size
                    written += _TOO_LONG_SIZE
                else:
                    rec["line"] = item.decode("utf-8", "surrogateescape")
                    written += len(item)
                    if b"npc/create" in item or b"npc/restore" in item:
                        self._creating_from(item)
                out.append(_dumps(rec))
            else:
                out.append(_dumps({"t": round(t - t0, 6), "dir": "in", **what}))
            if len(out) >= 4096:
                _write(fd, b"".join(out))
                out.clear()
                self._written += written
                written = 0
        if out:
            _write(fd, b"".join(out))
        self._written += written

    def _creating_from(self, line: bytes) -> None:
        """An ``npc/create`` or ``npc/restore``: the NPC's requested engine, model, options."""
        try:
            msg = json.loads(line)
            for call in msg if isinstance(msg, list) else [msg]:
                params = call.get("params") or {}
                if call.get("method") == "npc/restore":
                    config = (params.get("save") or {}).get("config") or {}
                    npc_id = params.get("npcId") or config.get("npcId")
                elif call.get("method") == "npc/create":
                    config, npc_id = params, params.get("npcId")
                else:
                    continue
                if isinstance(npc_id, str):
                    self._npcs[npc_id] = {
                        "engine": config.get("engine", "auto"),
                        "model": config.get("model"),
                        "options": config.get("options") or {},
                    }
                    if "id" in call:
                        self._creating[json.dumps(call["id"])] = npc_id
        except (ValueError, AttributeError, TypeError, RecursionError):
            pass  # not a valid request (nested too deeply too): the bridge answered it with an error

    def _created(self, line: bytes) -> None:
        """A response (or a batch of them): the engine the bridge chose for an NPC created by
        that request."""
        try:
            msg = json.loads(line)
            for reply in msg if isinstance(msg, list) else [msg]:
                npc_id = self._creating.pop(json.dumps(reply.get("id")), None)
                if npc_id is not None and isinstance(reply.get("result"), dict) and "engine" in reply["result"]:
                    self._npcs[npc_id]["engine"] = reply["result"]["engine"]
        except (ValueError, AttributeError, TypeError, RecursionError):
            pass


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":")).encode() + b"\n"


def _open(path: str) -> int | None:
    """``path`` opened for writing (created, truncated), or ``None`` after one line on stderr.
    Non-blocking, so that a FIFO no process reads fails at once (ENXIO) instead of waiting for
    a reader forever; the thread then writes it blocking."""
    nonblock = getattr(os, "O_NONBLOCK", 0)
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | nonblock | getattr(os, "O_BINARY", 0)
    fd = None
    try:
        fd = os.open(path, flags, 0o666)
        if nonblock:
            os.set_blocking(fd, True)
        return fd
    except OSError as e:
        if fd is not None:
            os.close(fd)
        why = "a FIFO that no process reads" if e.errno == errno.ENXIO else _reason(e)
        _say(path, f"cannot write it ({why}); the bridge goes on without recording")
        return None


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _reason(e: OSError) -> str:
    return e.strerror or str(e)


def _say(path: str, what: str) -> None:
    """One line on stderr, whatever the log level (the game's developer must see it)."""
    try:
        sys.stderr.write(f"oam-bridge: --record {path}: {what}\n")
        sys.stderr.flush()
    except (OSError, ValueError):
        pass  # no stderr to say it on


def recording_header(argv: list[str], options: dict[str, Any]) -> dict[str, Any]:
    """The header for a bridge started with ``argv``, whose resolved options are ``options``
    (``vars(args)``): what a replay needs to start the same bridge."""
    opts = {k: v for k, v in options.items() if k not in _NOT_RECORDED}
    script: Any = None
    if options.get("script"):
        with open(options["script"], "rb") as f:  # already read and checked by the scripted engine
            script = json.load(f)
    return {
        "oamRecording": FORMAT_VERSION,
        "bridgeVersion": __version__,
        "startedAt": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "argv": _redacted(argv),
        "options": opts,
        "script": script,
    }


def _complete_header(header: dict[str, Any]) -> dict[str, Any]:
    """The parts of the header that take a while (the llama engine's import), in the thread."""
    model = header["options"].get("model")
    if not model:
        try:
            from bridge.engines.llama import default_model_path

            model = default_model_path()
        except Exception:  # llama not installed: no default model
            model = None
    size = None
    if model:
        try:
            size = os.path.getsize(model)
        except OSError:
            pass
    return {
        **header,
        "llamaModel": {"path": model, "bytes": size} if model else None,
        "python": platform.python_version(),
        "platform": sys.platform,
    }


def _redacted(argv: list[str]) -> list[str]:
    """``argv`` without ``--record``'s file and with the API key's value hidden."""
    out: list[str] = []
    skip = False
    for i, a in enumerate(argv):
        if skip:
            skip = False
            continue
        if a == "--record":
            skip = True
        elif a.startswith("--record="):
            pass
        elif a == "--openai-api-key":
            out.append(a)
            if i + 1 < len(argv):
                out.append("(hidden)")
            skip = True
        elif a.startswith("--openai-api-key="):
            out.append("--openai-api-key=(hidden)")
        else:
            out.append(a)
    return out


__all__ = ["FLUSH_EVERY_S", "MAX_BACKLOG_BYTES", "Recorder", "recording_header"]
