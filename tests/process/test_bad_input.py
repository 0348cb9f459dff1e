"""Bad input is an answer at the request that carries it: a refused request changes nothing,
never fails a later turn, and says why (the stable code, and a reason where there are several);
through the real ``oam-bridge`` subprocess over real pipes.

Each test failed on commit d14face, before the fixes; ``OAM_BRIDGE_ROOT=<a checkout of it>``
runs this file's bridges from that tree (tests/support/harness.py). Time limits here are hang
guards, not performance checks.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.support.harness import (
    BRIDGE_ROOT,
    DEADLINE,
    INIT,
    INVENTORY_TOOL,
    bridge,
    bridge_command,
    bridge_env,
    error_code,
    rpc,
)

BAD_CREATES: list[tuple[str, dict[str, Any], str, str | None]] = [
    (
        "$schema 5 in tool parameters",
        {"tools": [{"name": "t", "parameters": {"type": "object", "$schema": 5}}]},
        "invalid_schema",
        None,
    ),
    (
        "remote $ref in tool parameters",
        {
            "tools": [
                {
                    "name": "t",
                    "parameters": {"type": "object", "properties": {"a": {"$ref": "http://example.invalid/a.json"}}},
                }
            ]
        },
        "invalid_schema",
        None,
    ),
    (
        "unresolvable $ref in tool parameters",
        {
            "tools": [
                {"name": "t", "parameters": {"type": "object", "properties": {"a": {"$ref": "#/definitions/nowhere"}}}}
            ]
        },
        "invalid_schema",
        None,
    ),
    ("text 5", {"script": [{"text": 5}]}, "invalid_params", "invalid_script"),
    ("delayMs -1", {"script": [{"text": "hi", "delayMs": -1}]}, "invalid_params", "invalid_script"),
    ("a string step", {"script": ["hello"]}, "invalid_params", "invalid_script"),
    (
        "a toolCalls entry without name",
        {"script": [{"toolCalls": [{"arguments": {}}]}]},
        "invalid_params",
        "invalid_script",
    ),
    ("message 0", {"script": [{"error": "refusal", "message": 0}]}, "invalid_params", "invalid_script"),
    ("warnings [{}]", {"script": [{"text": "hi", "warnings": [{}]}]}, "invalid_params", "invalid_script"),
    ("maxTokens 1,000,001", {"options": {"maxTokens": 1_000_001}}, "invalid_params", None),
]
BAD_RESPONDS: list[tuple[str, dict[str, Any], str]] = [
    ("$schema 5 in a turn schema", {"schema": {"$schema": 5}}, "invalid_schema"),
    (
        "remote $ref in a turn schema",
        {"schema": {"type": "object", "properties": {"a": {"$ref": "http://example.invalid/a.json"}}}},
        "invalid_schema",
    ),
    ("unresolvable $ref in a turn schema", {"schema": {"$ref": "#/$defs/nowhere"}}, "invalid_schema"),
    ("toolTimeoutMs of 401 digits", {"toolTimeoutMs": int("9" * 401)}, "invalid_params"),
    ("toolTimeoutMs 86,400,001", {"toolTimeoutMs": 86_400_001}, "invalid_params"),
    ("maxToolRounds 1001", {"maxToolRounds": 1001}, "invalid_params"),
    ("maxToolCalls 1001", {"maxToolCalls": 1001}, "invalid_params"),
]


async def test_bad_input_is_refused_at_the_request_that_carries_it() -> None:
    wrong: list[str] = []
    async with bridge() as b:
        await b.send(INIT)
        await b.request(1, "npc/create", {"npcId": "ok", "tools": [INVENTORY_TOOL]})
        for k, (what, params, code, reason) in enumerate(BAD_CREATES):
            await b.send(rpc(f"c{k}", "npc/create", {"npcId": f"bad{k}", **params}))
            r = await b.response(f"c{k}")
            got = (error_code(r), r.get("error", {}).get("data", {}).get("reason"))
            if got[0] != code or (reason is not None and got[1] != reason):
                wrong.append(f"npc/create with {what}: expected {code} {reason or ''}, got {got}")
        for k, (what, params, code) in enumerate(BAD_RESPONDS):
            await b.send(rpc(f"r{k}", "npc/respond", {"npcId": "ok", "prompt": "hi", **params}))
            r = await b.response(f"r{k}")
            if error_code(r) != code:
                wrong.append(f"npc/respond with {what}: expected {code}, got {error_code(r)}")
                if "result" in r:  # a turn started: let it end before the next case
                    await b.wait_terminal(r["result"]["turnId"])
        left = [n["npcId"] for n in (await b.request("list", "npc/list"))["npcs"] if n["npcId"] != "ok"]
        if left:
            wrong.append(f"refused creates must leave no npc behind, found {left}")
        internal = [
            m
            for m in b.messages
            if isinstance(m, dict) and ("internal_error" in json.dumps(m) or "generation_failed" in json.dumps(m))
        ]
    assert wrong == [], "\n".join(wrong)
    assert internal == []


async def test_a_null_in_a_script_step_is_invalid_params_at_create_not_a_failed_turn(tmp_path: Any) -> None:
    # The recipe: create with {"toolCalls": null}, then respond: the turn failed with
    # internal_error (stream_step iterated None). {"error": null} failed it as a retryable
    # generation_failed, {"error": "busy", "message": null} sent "message": null. Decided:
    # null is refused at the request that carries the script (only "json" may be null).
    steps = [{"toolCalls": None}, {"error": None}, {"error": "busy", "message": None}]
    async with bridge() as b:
        await b.send(INIT)
        for k, step in enumerate(steps):
            await b.send(
                rpc(f"c{k}", "npc/create", {"npcId": "a", "script": [step]}),
                rpc(f"r{k}", "npc/respond", {"npcId": "a", "prompt": "hi"}),
            )
            created = await b.response(f"c{k}")
            assert error_code(created) == "invalid_params" and created["error"]["data"]["reason"] == "invalid_script", (
                step
            )
            assert error_code(await b.response(f"r{k}")) == "unknown_npc"
        assert not [m for m in b.messages if isinstance(m, dict) and "internal_error" in json.dumps(m)]
    script = tmp_path / "scene.json"
    script.write_text(json.dumps({"npcs": {"a": [{"toolCalls": None}]}}))
    r = subprocess.run(
        bridge_command("--script", str(script)),
        cwd=BRIDGE_ROOT,
        env=bridge_env(),
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2 and r.stdout == "" and "toolCalls" in r.stderr


async def test_arguments_breaking_a_format_never_reach_the_game() -> None:
    tool = {
        "name": "send_letter",
        "parameters": {
            "type": "object",
            "properties": {"to": {"type": "string", "format": "email"}, "on": {"type": "string", "format": "date"}},
            "required": ["to", "on"],
        },
    }
    script = [
        {
            "toolCalls": [
                {"id": "bad_email", "name": "send_letter", "arguments": {"to": "not-an-email", "on": "2024-05-01"}},
                {"id": "bad_date", "name": "send_letter", "arguments": {"to": "a@b.example", "on": "2024-13-45"}},
            ]
        },
        {"text": "Sent nothing."},
    ]
    async with bridge() as b:
        await b.send(INIT)
        await b.request(2, "npc/create", {"npcId": "clerk", "tools": [tool], "script": script})
        turn_id = (await b.request(3, "npc/respond", {"npcId": "clerk", "prompt": "Send it.", "toolTimeoutMs": 300}))[
            "turnId"
        ]
        done = await b.wait_terminal(turn_id)
        assert [e for e in b.turn_events(turn_id) if e["method"] == "turn/toolCallRequested"] == [], (
            "invalid arguments reached the game"
        )
        completed = {
            e["params"]["callId"]: e["params"]
            for e in b.turn_events(turn_id)
            if e["method"] == "turn/toolCallCompleted"
        }
        assert set(completed) == {"bad_email", "bad_date"} and all(c["error"] for c in completed.values())
        assert done["method"] == "turn/completed"
        for k, params in enumerate([{}, {"type": "string"}]):
            await b.send(rpc(f"p{k}", "npc/create", {"npcId": f"p{k}", "tools": [{"name": "t", "parameters": params}]}))
            assert error_code(await b.response(f"p{k}")) == "invalid_schema", (
                f"tool parameters {params} must be refused"
            )


async def test_max_npcs_reached_is_limit_reached_and_not_retryable() -> None:
    async with bridge("--max-npcs", "2") as b:
        await b.send(INIT)
        await b.request(1, "npc/create", {"npcId": "a"})
        await b.request(2, "npc/create", {"npcId": "b"})
        await b.send(rpc(3, "npc/create", {"npcId": "c"}))
        err = (await b.response(3))["error"]
        assert err["code"] == -31027 and err["data"]["code"] == "limit_reached"
        assert err["data"]["retryable"] is False and err["data"]["limit"] == "maxNpcs"


async def test_an_unsupported_protocol_version_is_refused_and_a_supported_one_then_accepted() -> None:
    async with bridge() as b:
        await b.send(rpc(1, "initialize", {"protocolVersion": 7}))
        r = await b.response(1)
        assert "error" in r, f"protocolVersion 7 was accepted: {r}"
        err = r["error"]
        assert err["code"] == -32602 and err["data"]["code"] == "invalid_params"
        assert err["data"]["reason"] == "unsupported_protocol_version" and err["data"]["supported"] == [1]
        assert (await b.request(2, "initialize", {"protocolVersion": 1}))["protocolVersion"] == 1
