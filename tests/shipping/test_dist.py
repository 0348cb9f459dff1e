"""The self-contained build (``make dist``, packaging/): the shared scenario
(engine_clients/scenario.json) and a real llama turn against ``dist/oam-bridge/oam-bridge``,
run with a clean environment (``env -i`` with only PATH=/usr/bin:/bin: no venv, no
PYTHONPATH, no HOME) from a temporary directory.

The build is made by ``make dist`` when it is missing or older than what it freezes (the
build script compares a digest of its inputs; an up-to-date build costs a fraction of a
second; the ``dist_exe`` fixture, tests/shipping/conftest.py). Set OAM_SKIP_DIST=1 to skip
these tests locally; under CI=true they always run, and a build that cannot be made fails them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from tests.support.dist import DIST, foreign_libraries, frozen_bridge
from tests.support.harness import ROOT, Client, RpcError

SCENARIO = json.loads((Path(ROOT) / "engine_clients" / "scenario.json").read_text())


async def run_scenario(c: Client) -> list[str]:
    """Every step of the shared scenario, checked as its ``expect`` says; returns the names run."""
    ran: list[str] = []
    turn_of: dict[str, str] = {}
    save: Any = None
    for step in SCENARIO["steps"]:
        name = step["name"]
        if "notification" in step:
            await c.notify(step["notification"]["method"], step["notification"].get("params"))
            ran.append(name)
            continue
        method, params = step["request"]["method"], dict(step["request"].get("params", {}))
        if name == "restore":
            params["save"] = save
        if name == "unknown_npc":
            with pytest.raises(RpcError) as err:
                await c.call(method, params)
            assert err.value.error["code"] == -31020 and err.value.code == "unknown_npc"
            ran.append(name)
            continue
        result = await c.call(method, params)
        if name == "initialize":
            assert result["protocolVersion"] == 1 and isinstance(result["serverInfo"]["name"], str)
            engines = {e["name"]: e for e in result["engines"]}
            # every engine is in the build: one missing from it would say "not installed"
            assert all("not installed" not in (e["reason"] or "") for e in engines.values()), engines
            assert engines["openai"]["available"] is False and "url" in engines["openai"]["reason"].lower()
        elif name in ("create_keeper", "create_guard"):
            assert result["npcId"] == params["npcId"] and result["engine"] == "scripted"
        elif name == "respond_with_tool":
            ev = await c.wait_event("turn/toolCallRequested", turnId=result["turnId"])
            assert ev["params"]["name"] == "check_inventory" and ev["params"]["arguments"] == {"item": "ale"}
            assert (
                await c.call(
                    "npc/submit", {"npcId": "keeper", "callId": ev["params"]["callId"], "output": {"count": 3}}
                )
            ) == {"accepted": True}
            done = await c.wait_terminal(result["turnId"])
            assert done["method"] == "turn/completed", done
            assert done["params"]["text"] == "We have 3 barrels of ale."
            assert done["params"]["toolCalls"][0]["output"] == {"count": 3}
            evs = c.turn_events(result["turnId"])
            assert any(e["method"] == "turn/toolCallCompleted" and e["params"]["output"] == {"count": 3} for e in evs)
            assert (
                "".join(e["params"]["delta"] for e in evs if e["method"] == "turn/textDelta") == done["params"]["text"]
            )
            assert all(e["params"]["npcId"] == "keeper" for e in evs)
        elif name == "schema_turn":
            done = await c.wait_terminal(result["turnId"])
            assert done["method"] == "turn/completed" and done["params"]["json"] == {
                "mood": "happy",
                "line": "Welcome!",
            }
        elif name == "cancel_turn":
            await c.wait_event("turn/textDelta", turnId=result["turnId"])
            cancelled = await c.call("npc/cancel", {"npcId": "keeper"})
            assert result["turnId"] in cancelled["cancelled"]
            done = await c.wait_terminal(result["turnId"])
            assert done["method"] == "turn/failed" and done["params"]["error"]["code"] == "cancelled"
        elif name == "transcript":
            save = result
        elif name == "restore":
            assert result["npcId"] == "keeper2" and result["turns"] >= 2
        elif name == "world_set":
            assert result["revision"] == 1
        elif name == "world_set_scoped":
            assert result["revision"] == 2
        elif name == "world_get_for_npc":
            assert result["revision"] == 2
            assert [(f["key"], f["value"], f["tags"], f["npcIds"], f["lore"]) for f in result["facts"]] == [
                ("gate", "closed", ["gate"], None, False)
            ]
        elif name == "decide":
            done = await c.wait_terminal(result["turnId"])
            assert done["method"] == "turn/completed", done
            assert done["params"]["json"]["choice"] == "question" and done["params"]["worldRevision"] == 2
            assert done["params"]["json"]["reasoning"] == "It is late and I do not know them."
        elif name == "guardrail_fallback":
            done = await c.wait_terminal(result["turnId"])
            assert (
                done["params"]["text"] == "Let's talk about something else."
                and done["params"]["finishReason"] == "fallback"
            )
            assert done["params"]["warnings"][0].startswith("guardrail_violation")
        elif name == "npc_to_npc":
            done = await c.wait_terminal(result["turnId"])
            started = c.turn_events(result["turnId"])[0]
            assert started["method"] == "turn/started" and started["params"]["speaker"] == "keeper"
            assert done["params"]["text"] == "The storm is coming, friend."
        elif name == "prewarm":
            done = await c.wait_terminal(result["turnId"])
            assert (
                done["params"]["finishReason"] == "prewarmed"
                and done["params"]["steps"] == 0
                and done["params"]["text"] == ""
            )
        elif name == "set_tags":
            assert result == {}
        elif name == "world_get_after_tags":
            assert [f["key"] for f in result["facts"]] == ["gate", "weather"]
        elif name == "world_delete":
            assert result == {"revision": 3, "deleted": True}
        elif name == "shutdown":
            assert result is None
        elif isinstance(result, dict) and "turnId" in result:  # a step added to the scenario later
            assert (await c.wait_terminal(result["turnId"]))["method"] == "turn/completed"
        if isinstance(result, dict) and "turnId" in result:
            turn_of[name] = result["turnId"]
            c.assert_well_formed(result["turnId"])
        ran.append(name)
    return ran


async def test_scenario_against_the_built_binary_in_a_clean_environment(dist_exe: Path, tmp_path: Path) -> None:
    async with frozen_bridge(dist_exe, tmp_path, "--engine", "scripted") as p:
        with trio.fail_after(60):
            ran = await run_scenario(p.client)
            assert await p.process.wait() == 0, p.stderr.decode(errors="replace")
    assert ran == [s["name"] for s in SCENARIO["steps"]]
    for must in (
        "initialize",
        "respond_with_tool",
        "schema_turn",
        "cancel_turn",
        "transcript",
        "restore",
        "world_set",
        "world_delete",
        "unknown_npc",
        "shutdown",
        "exit",
    ):
        assert must in ran
    assert not list(tmp_path.iterdir()), "the bridge wrote into its working directory"


@pytest.mark.model  # the build bundles the venv's model
async def test_real_llama_turn_with_the_bundled_model(dist_exe: Path, tmp_path: Path) -> None:
    assert (DIST / "_internal" / "models").is_dir(), "built without the model (DIST_MODEL=0): rebuild with make dist"
    async with frozen_bridge(dist_exe, tmp_path, "--engine", "llama") as p:
        c = p.client
        with trio.fail_after(120):
            init = await c.initialize()
            engines = {e["name"]: e for e in init["engines"]}
            assert engines["llama"]["available"] is True, engines["llama"]
            created = await c.call(
                "npc/create",
                {
                    "npcId": "greta",
                    "persona": {"name": "Greta", "role": "tavern keeper"},
                    "options": {"temperature": 0, "maxTokens": 24, "seed": 1},
                },
            )
            assert created["engine"] == "llama" and created["contextSize"] > 0
            turn, done = await c.turn("greta", "Good evening! What is on the menu tonight?")
            assert done["method"] == "turn/completed", done
            deltas = [e["params"]["delta"] for e in c.turn_events(turn) if e["method"] == "turn/textDelta"]
            assert len(deltas) >= 2 and "".join(deltas) == done["params"]["text"] and done["params"]["text"].strip()
            c.assert_well_formed(turn)
            if engines["native"]["available"]:  # bundled with its Swift runtime (the test backend off a Mac)
                await c.call("npc/create", {"npcId": "n", "engine": "native", "script": [{"text": "From Swift."}]})
                assert (await c.turn("n", "hi"))[1]["params"]["text"] == "From Swift."
            assert foreign_libraries(p.process.pid) == []
            await c.call("shutdown")
            await c.notify("exit")
            assert await p.process.wait() == 0, p.stderr.decode(errors="replace")
