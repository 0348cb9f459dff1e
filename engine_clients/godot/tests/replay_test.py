#!/usr/bin/env python3
"""Replays engine_clients/scenario.json against the real bridge with the lines the Godot
addon would send, and reads the bridge's lines the way the addon would.

This does NOT run GDScript (there is no Godot binary here). What it proves: the message
shapes built by addons/oam_bridge/oam_protocol.gd are accepted by the bridge and give the
scenario's expected results. The functions in the "port" section below are line-for-line
ports of oam_protocol.gd (same names; the GDScript is quoted next to each), and the
`Client` class follows oam_bridge.gd's flow (reader thread -> main-thread queue, request
ids, tool dispatch with auto-submit, seq check, turn kinds -> decision_made, bridge_closed).
Godot's JSON is mimicked: JSON.parse turns every number into a float, JSON.stringify(v, "",
false) is compact with keys in insertion order and non-ASCII text as UTF-8.

Usage: python3 engine_clients/godot/tests/replay_test.py
Bridge command: $OAM_BRIDGE_CMD, default "<repo>/.venv/bin/python -m bridge --engine scripted"
run from the repo root (as the other client tests do). Exit 0 = pass.
"""

from __future__ import annotations

import json
import math
import os
import queue
import shlex
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
SCENARIO = json.loads((ROOT / "engine_clients" / "scenario.json").read_text())

# --- port of oam_protocol.gd ------------------------------------------------------------

PROTOCOL_VERSION = 1
BRIDGE_CLOSED = "bridge_closed"
TOOL_ERROR_KEY = "__oam_tool_error__"
ERROR_CODES = {  # const ERROR_CODES (checked against bridge/errors.py below)
    "model_unavailable": (-31001, False), "guardrail_violation": (-31002, False),
    "refusal": (-31003, False), "context_size_exceeded": (-31004, False),
    "rate_limited": (-31005, True), "unsupported_language": (-31006, False),
    "invalid_schema": (-31007, False), "tool_failed": (-31008, False),
    "cancelled": (-31009, False), "busy": (-31010, True),
    "invalid_request": (-31011, False), "generation_failed": (-31012, True),
    "unknown_npc": (-31020, False), "unknown_tool_call": (-31021, False),
    "not_initialized": (-31022, False), "overloaded": (-31023, True),
    "message_too_large": (-31024, False), "npc_exists": (-31025, False),
    "shutting_down": (-31026, False), "limit_reached": (-31027, False),
    "parse_error": (-32700, False), "invalid_message": (-32600, False),
    "method_not_found": (-32601, False), "invalid_params": (-32602, False),
    "internal_error": (-32603, False),
}
EVENT_SIGNALS = {
    "turn/started": "turn_started", "turn/textDelta": "text_delta",
    "turn/partialJson": "partial_json", "turn/toolCallRequested": "tool_call_requested",
    "turn/toolCallCompleted": "tool_call_completed",
    "turn/toolCallWithdrawn": "tool_call_withdrawn",
    "turn/contextTrimmed": "context_trimmed", "turn/completed": "turn_completed",
    "turn/failed": "turn_failed",
}
TERMINAL_EVENTS = ("turn/completed", "turn/failed")
KIND_RESPOND, KIND_DECIDE, KIND_PREWARM = "respond", "decide", "prewarm"
GUARDRAIL_FAIL, GUARDRAIL_FALLBACK, GUARDRAIL_RETRY = "fail", "fallback", "retry"
TOOL_CHOICE_TOOL_OR_ANSWER = "tool_or_answer"


def godot_json_parse(text: str) -> Any:
    """JSON.new().parse(text) / .data: every number is a float in Godot 4."""
    return json.loads(text, parse_int=float)


def godot_json_stringify(value: Any) -> str:
    """JSON.stringify(value, "", false): compact, insertion order, UTF-8."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def build_request(id_: int, method: str, params: dict | None = None) -> str:
    # return encode({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
    return encode({"jsonrpc": "2.0", "id": id_, "method": method, "params": params or {}})


def build_notification(method: str, params: dict | None = None) -> str:
    # return encode({"jsonrpc": "2.0", "method": method, "params": params})
    return encode({"jsonrpc": "2.0", "method": method, "params": params or {}})


def encode(message: dict) -> str:
    # return JSON.stringify(normalize_numbers(message), "", false)
    return godot_json_stringify(normalize_numbers(message))


def normalize_numbers(value: Any) -> Any:
    # TYPE_FLOAT: whole and finite and < 9e15 -> int(number)
    if isinstance(value, float):
        if math.isfinite(value) and value == math.floor(value) and abs(value) < 9.0e15:
            return int(value)
        return value
    if isinstance(value, dict):  # TYPE_DICTIONARY: out[str(key)] = normalize(...)
        return {str(k): normalize_numbers(v) for k, v in value.items()}
    if isinstance(value, list):  # TYPE_ARRAY and packed arrays
        return [normalize_numbers(v) for v in value]
    return value


def initialize_params(client_name: str, client_version: str) -> dict:
    return {"protocolVersion": PROTOCOL_VERSION,
            "clientInfo": {"name": client_name, "version": client_version}}


def create_params(npc_id: str, config: dict) -> dict:
    params = json.loads(json.dumps(config))  # config.duplicate(true)
    params["npcId"] = npc_id
    return params


def respond_params(npc_id: str, prompt: str, options: dict) -> dict:
    params = json.loads(json.dumps(options))
    params["npcId"] = npc_id
    params["prompt"] = prompt
    return params


def submit_output_params(npc_id: str, call_id: str, output: Any) -> dict:
    return {"npcId": npc_id, "callId": call_id, "output": output}


def submit_error_params(npc_id: str, call_id: str, message: str) -> dict:
    return {"npcId": npc_id, "callId": call_id, "error": message}


def npc_params(npc_id: str) -> dict:
    return {"npcId": npc_id}


def prewarm_params(npc_id: str, speaker: str, prompt_prefix: str) -> dict:
    params: dict = {"npcId": npc_id}
    if speaker:  # if not speaker.is_empty()
        params["speaker"] = speaker
    if prompt_prefix:
        params["promptPrefix"] = prompt_prefix
    return params


def restore_params(save: dict, npc_id: str) -> dict:
    params: dict = {"save": save}
    if npc_id:
        params["npcId"] = npc_id
    return params


def count_tokens_params(text: str, npc_id: str, engine: str) -> dict:
    params: dict = {"text": text}
    if npc_id:
        params["npcId"] = npc_id
    if engine:
        params["engine"] = engine
    return params


def tool_spec(name: str, description: str, parameters: dict) -> dict:
    return {"name": name, "description": description, "parameters": parameters}


def fallbacks(guardrail_violation: list[str], refusal: list[str] | None = None) -> dict:
    out: dict = {}
    if guardrail_violation:  # if not guardrail_violation.is_empty()
        out["guardrailViolation"] = list(guardrail_violation)
    if refusal:
        out["refusal"] = list(refusal)
    return out


def decision_option(name: str, description: str, parameters: dict | None = None) -> dict:
    option: dict = {"name": name, "description": description}
    if parameters:  # if not parameters.is_empty()
        option["parameters"] = parameters
    return option


def decide_params(npc_id: str, situation: str, options: list, reasoning: bool,
                  remember: bool) -> dict:
    return {"npcId": npc_id, "situation": situation,
            "options": json.loads(json.dumps(options)),  # options.duplicate(true)
            "reasoning": reasoning, "remember": remember}


def set_tags_params(npc_id: str, tags: list[str]) -> dict:
    return {"npcId": npc_id, "tags": list(tags)}


def world_set_params(key: str, value: Any, tags: list[str], npc_ids: list[str],
                     lore: bool) -> dict:
    params: dict = {"key": key, "value": value}
    if npc_ids:
        params["npcIds"] = list(npc_ids)
    if tags:
        params["tags"] = list(tags)
    if lore:
        params["lore"] = True
    return params


def world_key_params(key: str) -> dict:
    return {"key": key}


def world_get_params(npc_id: str) -> dict:
    return {} if not npc_id else {"npcId": npc_id}


def parse_line(line: str) -> dict:
    text = line.strip()  # strip_edges()
    if not text:
        return {"kind": "empty"}
    try:
        message = godot_json_parse(text)
    except ValueError as exc:
        return {"kind": "invalid", "reason": str(exc), "line": text}
    if not isinstance(message, dict):
        return {"kind": "invalid", "reason": "not a JSON object", "line": text}
    out = {"kind": "invalid", "reason": "neither a response nor a notification", "line": text}
    if "method" in message and "id" not in message:
        params = message.get("params")
        if not isinstance(params, dict):
            params = {}
        out = {"kind": "event", "method": str(message["method"]), "params": params}
    elif "id" in message and ("result" in message or "error" in message):
        id_ = -1
        if isinstance(message["id"], (int, float)) and not isinstance(message["id"], bool):
            id_ = int(message["id"])
        error: dict = {}
        if isinstance(message.get("error"), dict):
            error = error_from_rpc(message["error"])
        out = {"kind": "response", "id": id_, "result": message.get("result"), "error": error}
    return out


def error_from_rpc(rpc_error: dict) -> dict:
    rpc_code = int(rpc_error.get("code", 0))
    data = rpc_error["data"] if isinstance(rpc_error.get("data"), dict) else {}
    code = str(data.get("code", code_for_rpc(rpc_code)))
    return {"code": code, "rpc_code": rpc_code, "message": str(rpc_error.get("message", "")),
            "retryable": bool(data.get("retryable", is_retryable(code))), "data": data}


def error_from_event(event_error: dict) -> dict:
    code = str(event_error.get("code", "internal_error"))
    return {"code": code, "rpc_code": rpc_code_for(code),
            "message": str(event_error.get("message", "")),
            "retryable": bool(event_error.get("retryable", is_retryable(code))), "data": {}}


def client_error(code: str, message: str) -> dict:
    return {"code": code, "rpc_code": 0, "message": message, "retryable": False, "data": {}}


def rpc_code_for(code: str) -> int:
    return ERROR_CODES[code][0] if code in ERROR_CODES else 0


def code_for_rpc(rpc_code: int) -> str:
    for code, (num, _) in ERROR_CODES.items():
        if num == rpc_code:
            return code
    return "internal_error"


def is_retryable(code: str) -> bool:
    return ERROR_CODES[code][1] if code in ERROR_CODES else False


def text_or_empty(value: Any) -> str:
    return "" if value is None else str(value)


def dict_or_empty(value: Any) -> dict:
    return value if isinstance(value, dict) else {}


def event_signal(method: str, params: dict) -> list:
    p = params
    npc_id, turn_id = str(p.get("npcId", "")), str(p.get("turnId", ""))
    call_id, name = str(p.get("callId", "")), str(p.get("name", ""))
    args: list = [npc_id, turn_id]
    if method == "turn/started":
        args += [str(p.get("prompt", "")), text_or_empty(p.get("speaker")),
                 str(p.get("kind", KIND_RESPOND))]
    elif method == "turn/textDelta":
        args += [str(p.get("delta", "")), text_or_empty(p.get("text")),
                 bool(p.get("isReset", False))]
    elif method == "turn/partialJson":
        args += [str(p.get("delta", "")), text_or_empty(p.get("json"))]
    elif method == "turn/toolCallRequested":
        args += [call_id, name, dict_or_empty(p.get("arguments"))]
    elif method == "turn/toolCallCompleted":
        args += [call_id, name, p.get("output"), text_or_empty(p.get("error"))]
    elif method == "turn/toolCallWithdrawn":
        args += [call_id, name, str(p.get("reason", ""))]
    elif method in ("turn/contextTrimmed", "turn/completed"):
        args.append(p)
    elif method == "turn/failed":
        args.append(error_from_event(dict_or_empty(p.get("error"))))
    return [EVENT_SIGNALS.get(method, ""), args]


def decision_args(params: dict) -> list:
    answer = dict_or_empty(params.get("json"))
    return [str(params.get("npcId", "")), str(params.get("turnId", "")),
            text_or_empty(answer.get("choice")), dict_or_empty(answer.get("arguments")),
            text_or_empty(answer.get("reasoning"))]


def tool_error(message: str) -> dict:
    return {TOOL_ERROR_KEY: message}


def is_tool_error(value: Any) -> bool:
    return isinstance(value, dict) and TOOL_ERROR_KEY in value


# --- the flow of oam_bridge.gd ----------------------------------------------------------


class Call:
    """OamCall: finished once with (result, error)."""

    def __init__(self, method: str, id_: int) -> None:
        self.method, self.id = method, id_
        self.result: Any = None
        self.error: dict = {}
        self.finished = False
        self.on_done: list[Callable[[Call], None]] = []

    def finish(self, result: Any, error: dict) -> None:
        if self.finished:
            return
        self.finished, self.result, self.error = True, result, error
        for cb in self.on_done:
            cb(self)

    def is_ok(self) -> bool:
        return self.finished and not self.error


class Client:
    """OamBridgeClient without Godot: the main loop is pump(); signals are a list."""

    def __init__(self, cmd: list[str]) -> None:
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.main_queue: queue.Queue = queue.Queue()  # call_deferred
        self.running = True
        self.next_id = 0
        self.pending: dict[int, Call] = {}
        self.tools: dict[str, Callable[[dict], Any]] = {}
        self.next_seq: dict[str, int] = {}
        self.turn_kinds: dict[str, str] = {}
        self.signals: list[tuple[str, list]] = []
        self.seq_errors: list[str] = []
        self.sent: list[str] = []
        self.stderr: list[str] = []
        self.closed = False
        threading.Thread(target=self._read_lines, args=(self.proc.stdout, "out"),
                         daemon=True).start()
        threading.Thread(target=self._read_lines, args=(self.proc.stderr, "err"),
                         daemon=True).start()

    def _read_lines(self, pipe: Any, which: str) -> None:  # _read_lines, on a thread
        for raw in pipe:
            self.main_queue.put((which, raw.decode("utf-8").rstrip("\n")))
        if which == "out":
            self.main_queue.put(("closed", ""))

    def _write_line(self, line: str) -> bool:  # store_line
        assert "\n" not in line
        self.sent.append(line)
        self.proc.stdin.write(line.encode("utf-8") + b"\n")
        self.proc.stdin.flush()
        return True

    def request(self, method: str, params: dict | None = None) -> Call:
        self.next_id += 1
        call = Call(method, self.next_id)
        if self.running and self._write_line(build_request(self.next_id, method, params)):
            self.pending[self.next_id] = call
        else:
            self.main_queue.put(("fail", call))
        return call

    def notify(self, method: str, params: dict | None = None) -> None:
        if self.running:
            self._write_line(build_notification(method, params))

    # typed helpers, as in oam_bridge.gd
    def initialize(self, n: str, v: str) -> Call:
        return self.request("initialize", initialize_params(n, v))

    def create_npc(self, npc_id: str, config: dict) -> Call:
        return self.request("npc/create", create_params(npc_id, config))

    def respond(self, npc_id: str, prompt: str, options: dict) -> Call:
        return self.request("npc/respond", respond_params(npc_id, prompt, options))

    def submit_output(self, npc_id: str, call_id: str, output: Any) -> Call:
        return self.request("npc/submit", submit_output_params(npc_id, call_id, output))

    def submit_error(self, npc_id: str, call_id: str, message: str) -> Call:
        return self.request("npc/submit", submit_error_params(npc_id, call_id, message))

    def cancel(self, npc_id: str) -> Call:
        return self.request("npc/cancel", npc_params(npc_id))

    def get_transcript(self, npc_id: str) -> Call:
        return self.request("npc/transcript", npc_params(npc_id))

    def restore(self, save: dict, npc_id: str = "") -> Call:
        return self.request("npc/restore", restore_params(save, npc_id))

    def reset(self, npc_id: str) -> Call:
        return self.request("npc/reset", npc_params(npc_id))

    def delete_npc(self, npc_id: str) -> Call:
        return self.request("npc/delete", npc_params(npc_id))

    def list_npcs(self) -> Call:
        return self.request("npc/list")

    def count_tokens(self, text: str, npc_id: str = "", engine: str = "") -> Call:
        return self.request("tokens/count", count_tokens_params(text, npc_id, engine))

    def engine_status(self) -> Call:
        return self.request("engine/status")

    def shutdown(self) -> Call:
        return self.request("shutdown")

    def decide(self, npc_id: str, situation: str, options: list, reasoning: bool = True,
               remember: bool = False) -> Call:
        return self.request("npc/decide",
                            decide_params(npc_id, situation, options, reasoning, remember))

    def prewarm(self, npc_id: str, speaker: str = "", prompt_prefix: str = "") -> Call:
        return self.request("npc/prewarm", prewarm_params(npc_id, speaker, prompt_prefix))

    def set_tags(self, npc_id: str, tags: list[str]) -> Call:
        return self.request("npc/setTags", set_tags_params(npc_id, tags))

    def world_set(self, key: str, value: Any, tags: list[str] = (), npc_ids: list[str] = (),
                  lore: bool = False) -> Call:
        return self.request("world/set", world_set_params(key, value, tags, npc_ids, lore))

    def world_delete(self, key: str) -> Call:
        return self.request("world/delete", world_key_params(key))

    def world_get(self, npc_id: str = "") -> Call:
        return self.request("world/get", world_get_params(npc_id))

    def register_tool(self, name: str, handler: Callable[[dict], Any]) -> None:
        self.tools[name] = handler

    # main-thread side
    def pump(self, until: Callable[[], bool], timeout: float = 20.0) -> bool:
        deadline = time.monotonic() + timeout
        while not until():
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            try:
                kind, item = self.main_queue.get(timeout=left)
            except queue.Empty:
                return False
            if kind == "out":
                self._on_stdout_line(item)
            elif kind == "err":
                self.stderr.append(item)
            elif kind == "fail":
                item.finish(None, client_error(BRIDGE_CLOSED, "bridge is not running"))
            elif kind == "closed":
                self._mark_closed()
        return True

    def wait(self, call: Call, timeout: float = 20.0) -> Call:
        self.pump(lambda: call.finished, timeout)
        return call

    def _on_stdout_line(self, line: str) -> None:
        message = parse_line(line)
        if message["kind"] == "response":
            call = self.pending.pop(message["id"], None)
            if call is None:
                raise AssertionError(f"response to no pending request: {line}")
            call.finish(message["result"], message["error"])
        elif message["kind"] == "event":
            self._on_event(message["method"], message["params"])
        elif message["kind"] == "invalid":
            raise AssertionError(f"invalid line: {message}")

    def _on_event(self, method: str, params: dict) -> None:
        turn_id, seq = str(params.get("turnId", "")), int(params.get("seq", -1))
        expected = self.next_seq.get(turn_id, 0)
        if seq != expected:
            self.seq_errors.append(f"turn {turn_id}: seq {seq}, expected {expected}")
        self.next_seq[turn_id] = seq + 1
        if method in TERMINAL_EVENTS:
            self.next_seq.pop(turn_id, None)
        kind = self._turn_kind(method, params)
        name, args = event_signal(method, params)
        if not name:
            raise AssertionError(f"unknown event {method}")
        self.signals.append((name, args))
        if method == "turn/toolCallRequested":
            self._run_tool(params)
        elif method == "turn/completed" and kind == KIND_DECIDE:
            self.signals.append(("decision_made", decision_args(params)))

    def _turn_kind(self, method: str, params: dict) -> str:
        turn_id = str(params.get("turnId", ""))
        if method == "turn/started":
            self.turn_kinds[turn_id] = str(params.get("kind", KIND_RESPOND))
        kind = self.turn_kinds.get(turn_id, "")
        if method in TERMINAL_EVENTS:
            self.turn_kinds.pop(turn_id, None)
        return kind

    def _run_tool(self, params: dict) -> None:
        handler = self.tools.get(str(params.get("name", "")))
        if handler is None:
            return
        output = handler(dict_or_empty(params.get("arguments")))
        if output is None:
            return
        npc_id, call_id = str(params.get("npcId", "")), str(params.get("callId", ""))
        if is_tool_error(output):
            submitted = self.submit_error(npc_id, call_id, str(output[TOOL_ERROR_KEY]))
        else:
            submitted = self.submit_output(npc_id, call_id, output)
        submitted.on_done.append(lambda c: self.signals.append(("(submit done)", [c])))

    def _mark_closed(self) -> None:
        self.running, self.closed = False, True
        for call in list(self.pending.values()):
            call.finish(None, client_error(BRIDGE_CLOSED, "bridge exited"))
        self.pending.clear()
        self.next_seq.clear()
        self.turn_kinds.clear()


# --- the scenario -----------------------------------------------------------------------

FAILS = 0


def check(desc: str, cond: bool, detail: Any = "") -> None:
    global FAILS
    if cond:
        print(f"ok   - {desc}")
    else:
        FAILS += 1
        print(f"FAIL - {desc}: {detail}")


def step(name: str) -> dict:
    return next(s for s in SCENARIO["steps"] if s["name"] == name)


def run_turn(client: Client, npc_id: str, prompt: str, options: dict,
             on_signal: Callable[[str, list], None] | None = None) -> tuple[Call, list]:
    """respond(), then pump until the turn's terminal signal. Returns (call, signals)."""
    return follow_turn(client, client.respond(npc_id, prompt, options), npc_id, repr(prompt),
                       on_signal)


def follow_turn(client: Client, sent: Call, npc_id: str, label: str,
                on_signal: Callable[[str, list], None] | None = None) -> tuple[Call, list]:
    """Waits for a call that starts a turn (respond, decide, prewarm), then pumps until the
    turn's terminal signal (and what the client emits with it). Returns (call, signals)."""
    start = len(client.signals)
    call = client.wait(sent)
    if not call.is_ok():
        return call, []
    turn_id = call.result["turnId"]
    seen = start

    def terminal() -> bool:
        nonlocal seen
        while seen < len(client.signals):
            name, args = client.signals[seen]
            seen += 1
            if on_signal:
                on_signal(name, args)
            if name in ("turn_completed", "turn_failed") and args[1] == turn_id:
                return True
        return False

    client.pump(terminal)
    sigs = [s for s in client.signals[start:] if s[0] != "(submit done)"]
    check(f"turn {label}: every signal carries npc {npc_id} and its turnId",
          all(a[0] == npc_id and a[1] == turn_id for _, a in sigs), sigs)
    return call, sigs


def completed(sigs: list) -> dict:
    """The turn_completed result of a turn's signals; {} if it did not complete."""
    done = [a[2] for n, a in sigs if n == "turn_completed"]
    return done[0] if done else {}


def shown_text(sigs: list) -> str:
    """The text a game shows from text_delta: is_reset replaces what was shown."""
    text = ""
    for name, args in sigs:
        if name == "text_delta":
            text = args[2] if args[4] else text + args[2]
    return text


def game_layer(client: Client) -> None:
    """The scenario's steps world_set ... world_delete, with the addon's game-layer helpers."""
    p = step("world_set")["request"]["params"]
    r = client.wait(client.world_set(p["key"], p["value"], p.get("tags", []),
                                     p.get("npcIds", []), p.get("lore", False)))
    check("world_set: the line's params are the scenario's",
          json.loads(client.sent[-1])["params"] == p, client.sent[-1])
    check("world_set: revision 1", r.is_ok() and r.result["revision"] == 1, r.error or r.result)

    config = dict(step("create_guard")["request"]["params"])
    npc_id = config.pop("npcId")
    check("fallbacks() builds the scenario's fallbacks",
          fallbacks(["Let's talk about something else."]) == config["fallbacks"],
          config["fallbacks"])
    r = client.wait(client.create_npc(npc_id, config))
    check("create_npc with tags and fallbacks", r.is_ok() and r.result["npcId"] == "guard",
          r.error or r.result)

    p = step("world_set_scoped")["request"]["params"]
    r = client.wait(client.world_set(p["key"], p["value"], p["tags"]))
    check("world_set scoped to tag gate: revision 2", r.is_ok() and r.result["revision"] == 2,
          r.error or r.result)

    r = client.wait(client.world_get(step("world_get_for_npc")["request"]["params"]["npcId"]))
    check("world_get line for one NPC", json.loads(client.sent[-1])["params"] == {"npcId": "guard"},
          client.sent[-1])
    facts = r.result["facts"] if r.is_ok() else []
    check("world_get(guard): revision 2, exactly the fact gate (weather is for the tavern)",
          r.is_ok() and r.result["revision"] == 2 and len(facts) == 1
          and facts[0]["key"] == "gate" and facts[0]["value"] == "closed"
          and facts[0]["tags"] == ["gate"] and facts[0]["npcIds"] is None
          and facts[0]["lore"] is False, r.error or r.result)

    p = step("decide")["request"]["params"]
    options = [decision_option(o["name"], o["description"]) for o in p["options"]]
    check("decision_option() builds the scenario's options", options == p["options"], options)
    call, sigs = follow_turn(client, client.decide(p["npcId"], p["situation"], options),
                             "guard", "decide")
    sent = json.loads(client.sent[-1])["params"]
    check("decide line: the scenario's params, reasoning true and remember false (defaults)",
          sent == {**p, "reasoning": True, "remember": False}, sent)
    check("decide: result has a turnId", call.is_ok() and isinstance(call.result["turnId"], str),
          call.error or call.result)
    names = [n for n, _ in sigs]
    check("decide: turn_started kind decide",
          names[:1] == ["turn_started"] and sigs[0][1][4] == KIND_DECIDE, sigs[:1])
    res = completed(sigs)
    want = {"reasoning": "It is late and I do not know them.", "choice": "question"}
    check("decide: turn_completed json {reasoning, choice question}, worldRevision 2",
          res.get("json") == want and res.get("worldRevision") == 2, res)
    partial = "".join(a[2] for n, a in sigs if n == "partial_json")
    check("decide: partial_json deltas (if any) build the JSON text",
          not partial or godot_json_parse(partial) == want, partial)
    made = [a for n, a in sigs if n == "decision_made"]
    check("decide: decision_made(question, {}, reasoning) right after turn_completed",
          names[-2:] == ["turn_completed", "decision_made"]
          and made[0][2:] == ["question", {}, want["reasoning"]], sigs[-2:])

    p = dict(step("guardrail_fallback")["request"]["params"])
    check("GUARDRAIL_FALLBACK is the scenario's policy", p["guardrail"] == GUARDRAIL_FALLBACK)
    call, sigs = run_turn(client, p.pop("npcId"), p.pop("prompt"), p)
    res = completed(sigs)
    check("guardrail fallback: turn_started kind respond",
          sigs[:1] and sigs[0][0] == "turn_started" and sigs[0][1][4] == KIND_RESPOND, sigs[:1])
    check("guardrail fallback: turn_completed with the fallback line, finishReason fallback, "
          "warnings[0] guardrail_violation…",
          res.get("text") == "Let's talk about something else."
          and res.get("finishReason") == "fallback" and bool(res.get("warnings"))
          and str(res["warnings"][0]).startswith("guardrail_violation"), sigs[-1:])
    check("guardrail fallback: text_delta (if any) shows the line",
          "text_delta" not in [n for n, _ in sigs] or shown_text(sigs) == res.get("text"), sigs)
    check("guardrail fallback: no decision_made",
          "decision_made" not in [n for n, _ in sigs], sigs)

    p = dict(step("npc_to_npc")["request"]["params"])
    call, sigs = run_turn(client, p.pop("npcId"), p.pop("prompt"), p)
    check("npc to npc: the respond line carries speaker keeper",
          json.loads(client.sent[-1])["params"].get("speaker") == "keeper", client.sent[-1])
    check("npc to npc: turn_started(prompt, speaker keeper, kind respond)",
          sigs[:1] and sigs[0][1][2:] == ["Heard about the weather?", "keeper", KIND_RESPOND],
          sigs[:1])
    res = completed(sigs)
    check("npc to npc: turn_completed text, shown by the deltas",
          res.get("text") == "The storm is coming, friend."
          and shown_text(sigs) == res.get("text"), sigs)

    call, sigs = follow_turn(client, client.prewarm(step("prewarm")["request"]["params"]["npcId"]),
                             "guard", "prewarm")
    check("prewarm line without speaker or prefix: exactly {npcId}",
          json.loads(client.sent[-1])["params"] == {"npcId": "guard"}, client.sent[-1])
    check("prewarm: result has a turnId", call.is_ok() and isinstance(call.result["turnId"], str),
          call.error or call.result)
    check("prewarm: turn_started(\"\", \"\", kind prewarm) then turn_completed only",
          [n for n, _ in sigs] == ["turn_started", "turn_completed"]
          and sigs[0][1][2:] == ["", "", KIND_PREWARM], sigs)
    res = completed(sigs)
    check("prewarm: finishReason prewarmed, steps 0, text \"\"",
          res.get("finishReason") == "prewarmed" and res.get("steps") == 0
          and res.get("text") == "", res)

    p = step("set_tags")["request"]["params"]
    r = client.wait(client.set_tags(p["npcId"], p["tags"]))
    check("set_tags: the line's params are the scenario's",
          json.loads(client.sent[-1])["params"] == p, client.sent[-1])
    check("set_tags: result {}", r.is_ok() and r.result == {}, r.error or r.result)

    r = client.wait(client.world_get("guard"))
    keys = [f["key"] for f in r.result["facts"]] if r.is_ok() else r.error
    check("world_get(guard) after set_tags: gate, weather", keys == ["gate", "weather"], keys)

    r = client.wait(client.world_delete(step("world_delete")["request"]["params"]["key"]))
    check("world_delete: revision 3, deleted", r.is_ok() and r.result["revision"] == 3
          and r.result["deleted"] is True, r.error or r.result)


LORE = "Built by the old king in the year of the long frost."


def game_layer_extras(client: Client) -> None:
    """The game-layer line shapes the scenario does not send: npc_ids, lore, world_get of
    everything, a decision with parameters and without reasoning, tool_or_answer, a prewarm
    with a speaker and a prompt prefix."""
    r = client.wait(client.world_set("history of the keep", LORE,
                                     [], [], True))
    check("world_set lore line", json.loads(client.sent[-1])["params"] == {
        "key": "history of the keep", "value": LORE, "lore": True},
          client.sent[-1])
    check("world_set lore: revision 4", r.is_ok() and r.result["revision"] == 4,
          r.error or r.result)
    r = client.wait(client.world_set("password", "swordfish", [], ["captain"]))
    check("world_set for npc ids: revision 5", r.is_ok() and r.result["revision"] == 5,
          r.error or r.result)
    r = client.wait(client.world_get())
    check("world_get line without npcId", json.loads(client.sent[-1])["params"] == {},
          client.sent[-1])
    facts = {f["key"]: f for f in r.result["facts"]} if r.is_ok() else {}
    check("world_get(): every fact, sorted by key, scopes and lore as set",
          list(facts) == ["gate", "history of the keep", "password"]
          and facts["password"]["npcIds"] == ["captain"] and facts["password"]["tags"] is None
          and facts["history of the keep"]["lore"] is True, r.error or r.result)
    r = client.wait(client.world_delete("no such fact"))
    check("world_delete of a missing key: deleted false, revision stays 5",
          r.is_ok() and r.result == {"revision": 5, "deleted": False}, r.error or r.result)

    urgency = {"type": "object", "properties": {"urgency": {"type": "string",
                                                            "enum": ["low", "high"]}},
               "required": ["urgency"]}
    r = client.wait(client.create_npc("captain", {
        "engine": "scripted", "tags": ["keep"],
        "script": [{"json": {"choice": "call_help", "arguments": {"urgency": "high"}}},
                   {"toolCalls": [{"name": "recall",
                                   "arguments": {"topic": "history of the keep"}}]},
                   {"text": "The old king built it."},
                   {"toolCalls": [{"name": "respond_directly", "arguments": {}}]},
                   {"text": "Stand easy."}]}))
    check("create captain", r.is_ok(), r.error)
    options = [decision_option("let_in", "open the gate"),
               decision_option("call_help", "ring the bell", urgency)]
    call, sigs = follow_turn(client, client.decide("captain", "Riders at night.", options,
                                                   False, True), "captain", "decide with arguments")
    sent = json.loads(client.sent[-1])["params"]
    check("decide line: option parameters, reasoning false, remember true",
          sent["options"][1]["parameters"] == urgency and "parameters" not in sent["options"][0]
          and sent["reasoning"] is False and sent["remember"] is True, sent)
    made = [a for n, a in sigs if n == "decision_made"]
    check("decision_made(call_help, {urgency: high}, \"\")",
          len(made) == 1 and made[0][2:] == ["call_help", {"urgency": "high"}, ""], sigs)
    check("decide with remember: in the history (npc/list turns 1)",
          next((n["turns"] for n in client.wait(client.list_npcs()).result["npcs"]
                if n["npcId"] == "captain"), None) == 1)

    call, sigs = run_turn(client, "captain", "Who built the keep?", {})
    done = [a for n, a in sigs if n == "tool_call_completed"]
    check("recall: the bridge answers it, tool_call_completed without tool_call_requested",
          "tool_call_requested" not in [n for n, _ in sigs] and len(done) == 1
          and done[0][3] == "recall" and done[0][4] == LORE, sigs)
    check("recall: turn completes", completed(sigs).get("text") == "The old king built it.",
          sigs[-1:])

    call, sigs = run_turn(client, "captain", "At ease?",
                          {"toolChoice": TOOL_CHOICE_TOOL_OR_ANSWER})
    res = completed(sigs)
    check("tool_or_answer: respond_directly has no event, is not in toolCalls; text follows",
          res.get("text") == "Stand easy." and res.get("toolCalls") == []
          and not any(n.startswith("tool_call") for n, _ in sigs), sigs)
    call, sigs = follow_turn(client, client.prewarm("captain", "guard", "Heard about"),
                             "captain", "prewarm with speaker and prefix")
    check("prewarm line with speaker and promptPrefix",
          json.loads(client.sent[-1])["params"]
          == {"npcId": "captain", "speaker": "guard", "promptPrefix": "Heard about"},
          client.sent[-1])
    check("prewarm: turn_started(prefix, speaker Bram (guard's persona name), kind prewarm), "
          "finishReason prewarmed",
          [n for n, _ in sigs] == ["turn_started", "turn_completed"]
          and sigs[0][1][2:] == ["Heard about", "Bram", KIND_PREWARM]
          and completed(sigs).get("finishReason") == "prewarmed", sigs)
    call, sigs = follow_turn(client, client.prewarm("captain", "", "Well,"), "captain",
                             "prewarm with a prefix only")
    check("prewarm line with promptPrefix only (no speaker: the player)",
          json.loads(client.sent[-1])["params"] == {"npcId": "captain", "promptPrefix": "Well,"},
          client.sent[-1])
    check("prewarm: turn_started(prefix, speaker \"\" (the player), kind prewarm)",
          sigs[:1] and sigs[0][1][2:] == ["Well,", "", KIND_PREWARM], sigs)
    r = client.wait(client.delete_npc("captain"))
    check("delete captain", r.is_ok(), r.error)


def main() -> int:
    cmd = shlex.split(os.environ.get(
        "OAM_BRIDGE_CMD", f"{ROOT}/.venv/bin/python -m bridge --engine scripted"))
    sys.path.insert(0, str(ROOT))
    try:
        from bridge.errors import ERROR_CODES as BRIDGE_CODES
        check("ERROR_CODES matches bridge/errors.py",
              {k: tuple(v) for k, v in BRIDGE_CODES.items()} == ERROR_CODES)
    except ImportError as exc:  # the bridge's deps live in its venv
        print(f"# skipped the error-table comparison ({exc})")
    gd = (HERE.parent / "addons" / "oam_bridge" / "oam_protocol.gd").read_text()
    check("every code of the port is in oam_protocol.gd with the same numbers",
          all(f'"{k}": [{n}, {str(r).lower()}]' in gd for k, (n, r) in ERROR_CODES.items()))

    client = Client(cmd)

    p = step("initialize")["request"]["params"]
    r = client.wait(client.initialize(p["clientInfo"]["name"], p["clientInfo"]["version"]))
    check("initialize", r.is_ok() and r.result["protocolVersion"] == 1
          and isinstance(r.result["serverInfo"]["name"], str), r.error or r.result)
    check("initialize line is the documented shape", client.sent[-1] ==
          '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1,'
          '"clientInfo":{"name":"scenario","version":"1"}}}', client.sent[-1])

    config = dict(step("create_keeper")["request"]["params"])
    npc_id = config.pop("npcId")
    r = client.wait(client.create_npc(npc_id, config))
    check("create_npc", r.is_ok() and r.result["npcId"] == "keeper"
          and r.result["engine"] == "scripted", r.error or r.result)

    # respond_with_tool: the handler answers; _run_tool submits it.
    asked: list[dict] = []
    client.register_tool("check_inventory", lambda a: asked.append(a) or {"count": 3})
    p = dict(step("respond_with_tool")["request"]["params"])
    call, sigs = run_turn(client, p.pop("npcId"), p.pop("prompt"), p)
    names = [n for n, _ in sigs]
    check("tool turn: respond result has a turnId",
          call.is_ok() and isinstance(call.result["turnId"], str), call.error)
    check("tool turn: turn_started first", names[:1] == ["turn_started"], names)
    check("tool turn: turn_started(prompt, speaker \"\" (the player), kind respond)",
          sigs[:1] and sigs[0][1][2:] == ["Do you have ale?", "", KIND_RESPOND], sigs[:1])
    check("tool turn: handler got {item: ale}", asked == [{"item": "ale"}], asked)
    req = [a for n, a in sigs if n == "tool_call_requested"]
    check("tool turn: tool_call_requested(check_inventory, {item: ale})",
          len(req) == 1 and req[0][3] == "check_inventory" and req[0][4] == {"item": "ale"}, req)
    submits = [a[0] for n, a in client.signals if n == "(submit done)"]
    check("tool turn: auto-submit accepted", len(submits) == 1 and submits[0].is_ok()
          and submits[0].result == {"accepted": True}, [(s.result, s.error) for s in submits])
    done = [a for n, a in sigs if n == "tool_call_completed"]
    check("tool turn: tool_call_completed same callId, output {count: 3}",
          len(done) == 1 and done[0][2] == req[0][2] and done[0][4] == {"count": 3}
          and done[0][5] == "", done)
    deltas = "".join(a[2] for n, a in sigs if n == "text_delta")
    check("tool turn: deltas concatenate to the text", deltas == "We have 3 barrels of ale.",
          deltas)
    last = sigs[-1] if sigs else ("", [])
    res = last[1][2] if last[0] == "turn_completed" else {}
    check("tool turn: turn_completed with text and toolCalls[0]",
          res.get("text") == "We have 3 barrels of ale."
          and res["toolCalls"][0]["name"] == "check_inventory"
          and res["toolCalls"][0]["output"] == {"count": 3}, last)

    p = dict(step("schema_turn")["request"]["params"])
    call, sigs = run_turn(client, p.pop("npcId"), p.pop("prompt"), p)
    last = sigs[-1] if sigs else ("", [])
    res = last[1][2] if last[0] == "turn_completed" else {}
    check("schema turn: json", res.get("json") == {"mood": "happy", "line": "Welcome!"}, last)
    check("schema turn: json keys in schema order (insertion order kept)",
          list(res.get("json") or {}) == ["mood", "line"], res.get("json"))
    partial = "".join(a[2] for n, a in sigs if n == "partial_json")
    check("schema turn: partial_json deltas (if any) build the JSON text",
          not partial or godot_json_parse(partial) == res.get("json"), partial)

    cancel_calls: list[Call] = []

    def cancel_on_first_delta(name: str, args: list) -> None:
        if name == "text_delta" and not cancel_calls:
            cancel_calls.append(client.cancel("keeper"))

    p = dict(step("cancel_turn")["request"]["params"])
    call, sigs = run_turn(client, p.pop("npcId"), p.pop("prompt"), p, cancel_on_first_delta)
    tid = call.result["turnId"] if call.is_ok() else None
    c = client.wait(cancel_calls[0]) if cancel_calls else None
    check("cancel: result.cancelled contains the turnId",
          c is not None and c.is_ok() and tid in c.result["cancelled"], c and c.result)
    names = [n for n, _ in sigs]
    err = sigs[-1][1][2] if names and names[-1] == "turn_failed" else {}
    check("cancel: turn_failed {code cancelled, rpc_code -31009}, no turn_completed",
          err.get("code") == "cancelled" and err.get("rpc_code") == -31009
          and err.get("retryable") is False and "turn_completed" not in names, sigs[-1:])

    t = client.wait(client.get_transcript("keeper"))
    save = t.result
    check("transcript: a save object (numbers are floats, as Godot parses them)",
          t.is_ok() and isinstance(save, dict) and save.get("version") == 1.0
          and isinstance(save.get("version"), float), t.error or save)
    r = client.wait(client.restore(save, "keeper2"))
    check("restore the Godot-parsed save under keeper2 (normalize_numbers makes 1.0 -> 1)",
          r.is_ok() and r.result["npcId"] == "keeper2" and r.result["turns"] >= 2,
          r.error or r.result)
    # The bridge also takes whole-number floats where it wants an int (protocol.md, Framing),
    # so even a save sent without normalize_numbers restores; normalize_numbers keeps the
    # lines the addon sends exact all the same.
    client.next_id += 1
    raw = godot_json_stringify({"jsonrpc": "2.0", "id": client.next_id, "method": "npc/restore",
                                "params": {"save": save, "npcId": "keeper3"}})
    client.pending[client.next_id] = raw_call = Call("npc/restore", client.next_id)
    client._write_line(raw)
    client.wait(raw_call)
    check("(without normalize_numbers, the 1.0s of a Godot-parsed save are accepted too)",
          raw_call.is_ok() and raw_call.result["npcId"] == "keeper3", raw_call.error or raw_call.result)

    game_layer(client)

    r = client.wait(client.respond("nobody", "hi", {}))
    check("unknown npc: error {code unknown_npc, rpc_code -31020, retryable false}",
          r.error.get("code") == "unknown_npc" and r.error.get("rpc_code") == -31020
          and r.error.get("retryable") is False and r.error["data"].get("npcId") == "nobody",
          r.error)

    # The remaining helpers, so every line shape the addon builds has been sent once.
    r = client.wait(client.engine_status())
    check("engine_status", r.is_ok() and isinstance(r.result["engines"], list), r.error)
    r = client.wait(client.list_npcs())
    ids = sorted(n["npcId"] for n in r.result["npcs"]) if r.is_ok() else r.error
    check("list_npcs", ids == ["guard", "keeper", "keeper2", "keeper3"], ids)
    game_layer_extras(client)
    r = client.wait(client.count_tokens("How much for a room?", "keeper"))
    check("count_tokens with npc", r.is_ok() and r.result["tokens"] > 0
          and r.result["promptTokens"] is not None, r.error or r.result)
    r = client.wait(client.count_tokens("How much for a room?", "", "scripted"))
    check("count_tokens with engine", r.is_ok() and r.result["promptTokens"] is None,
          r.error or r.result)
    r = client.wait(client.create_npc("cellar", {
        "engine": "scripted", "instructions": "You guard the cellar.",
        "tools": [tool_spec("open_door", "Open a door",
                            {"type": "object", "properties": {"door": {"type": "string"}}})],
        "script": [{"toolCalls": [{"name": "open_door", "arguments": {"door": "north"}}]},
                   {"text": "Locked."}]}))
    check("create_npc with tool_spec", r.is_ok(), r.error)
    client.register_tool("open_door", lambda a: tool_error(f"the {a['door']} door is stuck"))
    call, sigs = run_turn(client, "cellar", "Open it", {"toolChoice": "auto",
                                                        "maxToolRounds": 2})
    done = [a for n, a in sigs if n == "tool_call_completed"]
    check("tool_error -> submit_error: tool_call_completed error text",
          len(done) == 1 and done[0][5] == "the north door is stuck" and done[0][4] is None, done)
    check("submit_error turn completes", sigs and sigs[-1][0] == "turn_completed", sigs[-1:])
    r = client.wait(client.submit_output("cellar", "call_nope", {"x": 1}))
    check("submit to an unknown call: unknown_tool_call", r.error.get("code") ==
          "unknown_tool_call", r.error or r.result)
    r = client.wait(client.reset("cellar"))
    check("reset", r.is_ok() and r.result == {}, r.error)
    r = client.wait(client.delete_npc("cellar"))
    check("delete_npc", r.is_ok() and r.result == {}, r.error)
    check("seq gap-free in every turn", not client.seq_errors, client.seq_errors)

    r = client.wait(client.shutdown())
    check("shutdown: result null", r.is_ok() and r.result is None, r.error or r.result)
    # stop(): the exit notification, then wait for the process and the stdout EOF.
    client.notify("exit")
    check("exit line is the documented shape",
          client.sent[-1] == '{"jsonrpc":"2.0","method":"exit","params":{}}', client.sent[-1])
    try:
        rc = client.proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        client.proc.kill()
        rc = "killed after 5 s"
    check("bridge exited 0 after exit", rc == 0, rc)
    client.pump(lambda: client.closed, 5)
    check("stdout EOF seen (bridge_exited)", client.closed)
    late = client.wait(client.list_npcs(), 2)
    check("a request after exit fails with bridge_closed",
          late.error.get("code") == BRIDGE_CLOSED, late.error)

    print(f"# {len(client.sent)} lines sent; bridge stderr had {len(client.stderr)} lines")
    print("godot replay: PASS" if FAILS == 0 else f"godot replay: FAIL ({FAILS})")
    return 1 if FAILS else 0


if __name__ == "__main__":
    sys.exit(main())
