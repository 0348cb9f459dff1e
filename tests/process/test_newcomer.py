"""What a newcomer tripped on, each trap closed by a test. Behaviour on the wire is checked
through the real ``oam-bridge`` process (tests/support/harness.py); the rest through
the files a newcomer reads and runs (the README's commands, the repository's set-up)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio.testing

from tests.support.harness import BRIDGE_CMD, DEADLINE, INVENTORY_TOOL, ROOT, Proc, RpcError, initialized_bridge
from tests.support.needs import HAS_LLAMA_CPP, missing, needs_llama_cpp


@asynccontextmanager
async def initialized(*args: str) -> AsyncIterator[Proc]:
    """The bridge after ``initialize``; killed at the end if the test left it running."""
    async with initialized_bridge(*args, end_by_eof=False) as p:
        yield p


async def exit_and_read_stderr(p: Proc) -> str:
    """Close stdin (the bridge must then exit 0) and return everything it wrote to stderr."""
    await p.finish(within=5)
    await trio.testing.wait_all_tasks_blocked(0.05)  # the stderr drain reads to EOF
    return bytes(p.stderr).decode()


async def engines(p: Proc) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in (await p.client.call("engine/status"))["engines"]}


# ---- native: on Linux the library is its scripted test backend, and says so ----


def _native_test_backend() -> None:
    """Skips on a Mac that has Apple's model: there the library is no test backend (where it
    does not load, the ``native`` marker skips, and under CI fails)."""
    from bridge.engines import native

    if sys.platform == "darwin" and native.apple_model()[0]:
        pytest.skip("Apple's model is available here: native is no test backend")


@pytest.mark.native
async def test_native_without_apples_model_is_reported_as_the_test_backend_and_auto_never_picks_it(
    tmp_path: Path,
) -> None:
    _native_test_backend()
    # llama unavailable too (a model file that is not there): auto then has nothing to pick
    async with initialized("--engine", "auto", "--model", str(tmp_path / "missing.gguf")) as p:
        info = (await engines(p))["native"]
        assert info["available"] is True, "an NPC that names native still runs on it, for tests"
        assert info["reason"].startswith("test backend only") and "auto never picks it" in info["reason"]
        with pytest.raises(RpcError) as e:
            await p.client.call("npc/create", {"npcId": "auto"})
        assert e.value.code == "model_unavailable" and "native: test backend only" in e.value.error["message"]
        created = await p.client.call("npc/create", {"npcId": "t", "engine": "native", "script": [{"text": "Halt!"}]})
        assert created["engine"] == "native"
        assert (await p.client.turn("t", "Hello"))[1]["params"]["text"] == "Halt!"
        assert (await p.client.turn("t", "Hello there"))[1]["params"]["text"] == "You said: Hello there"
        started = (await engines(p))["native"]
        assert started["reason"] == info["reason"] and "scripted" in started["features"]


# ---- llama: a model file that is not one is said at start-up; no tracebacks ----


@needs_llama_cpp
async def test_a_model_file_that_is_not_gguf_is_reported_at_start_up(tmp_path: Path) -> None:
    notes = tmp_path / "notes.gguf"
    notes.write_text("root:x:0:0:root:/root:/bin/bash\n")
    async with initialized("--model", str(notes)) as p:
        llama = (await engines(p))["llama"]
        assert (
            llama["available"] is False and "not a GGUF model file" in llama["reason"] and str(notes) in llama["reason"]
        )
        with pytest.raises(RpcError) as e:
            await p.client.call("npc/create", {"npcId": "x", "engine": "llama"})
        assert e.value.code == "model_unavailable" and "not a GGUF model file" in e.value.error["message"]
        stderr = await exit_and_read_stderr(p)
    assert f"the llama engine is unavailable: not a GGUF model file (it does not start with GGUF): {notes}" in stderr
    assert "Traceback" not in stderr


@needs_llama_cpp
async def test_a_model_that_fails_to_load_is_one_line_on_stderr_not_a_traceback(tmp_path: Path) -> None:
    broken = tmp_path / "broken.gguf"
    broken.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\x00" * 64)  # the right magic, then nothing usable
    async with initialized("--model", str(broken)) as p:
        for _ in range(2):  # each create tries again, each says it in one line
            with pytest.raises(RpcError) as e:
                await p.client.call("npc/create", {"npcId": "x", "engine": "llama"})
            assert e.value.code == "model_unavailable"
        stderr = await exit_and_read_stderr(p)
    assert "Traceback" not in stderr
    assert len([line for line in stderr.splitlines() if "failed to start" in line]) == 2


# ---- a model file the game names ----


async def test_a_model_the_game_names_is_relative_to_the_working_directory_and_fails_one_way(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.txt").write_text("not for the game")
    (tmp_path / "text.gguf").write_text("hello")
    (tmp_path / "link.gguf").symlink_to(elsewhere / "secret.txt")
    names = ["missing.gguf", "text.gguf", "link.gguf"]
    if HAS_LLAMA_CPP:
        (tmp_path / "broken.gguf").write_bytes(b"GGUF" + b"\x00" * 64)  # passes the header check, fails to load
        names.append("broken.gguf")
    messages = []
    async with initialized() as p:  # started in ROOT: relative paths resolve there
        for i, name in enumerate(names):
            given = os.path.relpath(tmp_path / name, ROOT)
            assert given.startswith(".."), "a path relative to the bridge's working directory"
            with pytest.raises(RpcError) as e:
                await p.client.call("npc/create", {"npcId": f"n{i}", "engine": "llama", "model": given})
            assert e.value.code == "model_unavailable" and e.value.error["data"]["model"] == given
            message = e.value.error["message"]
            assert os.path.normpath(os.path.join(ROOT, given)) in message, "the path as given, made absolute"
            messages.append(
                message.replace(given, "<given>").replace(os.path.normpath(os.path.join(ROOT, given)), "<absolute>")
            )
        assert "working directory" in messages[0]
        assert len(set(messages)) == 1, f"missing, not a model and failing to load read the same: {messages}"
        assert not any("secret" in m or "elsewhere" in m for m in messages), "no file the game did not name"
        stderr = await exit_and_read_stderr(p)
    assert "Traceback" not in stderr


# ---- tokens/count ----


async def test_tokens_count_counts_the_text_alone_and_the_prompt_the_model_would_see(proc: Proc) -> None:
    c = proc.client
    await c.initialize()
    assert (await c.call("tokens/count", {"text": ""}))["tokens"] == 0
    assert (await c.call("tokens/count", {"text": "three little words"}))["tokens"] == 3
    # 60 turns of 120 words: far more than the 4096-token window
    turn = [
        {"role": "user", "content": "tell me more " + "word " * 60},
        {"role": "assistant", "content": "story " * 60},
    ]
    save = {
        "version": 1,
        "config": {"npcId": "sailor", "instructions": "You are an old sailor.", "engine": "scripted"},
        "turns": [turn] * 60,
    }
    await c.call("npc/restore", {"save": save})
    counted = await c.call("tokens/count", {"npcId": "sailor", "text": "And then?"})
    assert counted["tokens"] == 2
    assert counted["promptTokens"] <= counted["contextSize"] == 4096, "what the model sees: trimmed to the window"
    assert counted["promptTokens"] > 4096 // 2, "and no more trimmed than it needs to be"


@pytest.mark.native
async def test_tokens_count_of_empty_text_is_zero_on_the_native_engine() -> None:
    _native_test_backend()
    async with initialized("--engine", "native") as p:
        assert (await p.client.call("tokens/count", {"text": ""}))["tokens"] == 0
        assert (await p.client.call("tokens/count", {"text": "abcdefgh"}))["tokens"] == 2  # ~4 bytes a token


@pytest.mark.model
async def test_tokens_count_of_empty_text_is_zero_on_llama() -> None:
    async with initialized("--engine", "llama", "--llama-ctx", "512") as p:
        assert (await p.client.call("tokens/count", {"engine": "llama", "text": ""}))["tokens"] == 0
        words = (await p.client.call("tokens/count", {"engine": "llama", "text": "three little words"}))["tokens"]
        assert 3 <= words <= 6, "the words, not the words wrapped in a chat template"


# ---- isReset ----


@pytest.mark.parametrize("first_step", [{}, {"text": "Let me look."}], ids=["tools only", "text and tools"])
async def test_is_reset_marks_the_first_delta_after_every_tool_round(proc: Proc, first_step: dict[str, Any]) -> None:
    # protocol.md: true on the first delta of every step after a tool round, whether or not
    # that round's step showed text; false on every other delta
    c = proc.client
    await c.initialize()
    script = [
        {**first_step, "toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]},
        {"text": "Three barrels left."},
    ]
    await c.call("npc/create", {"npcId": "k", "tools": [INVENTORY_TOOL], "script": script})
    r = await c.call("npc/respond", {"npcId": "k", "prompt": "Ale?"})
    await c.wait_event("turn/toolCallRequested", turnId=r["turnId"])
    await c.call("npc/submit", {"npcId": "k", "callId": "c1", "output": {"count": 3}})
    await c.wait_terminal(r["turnId"])
    deltas = [e["params"] for e in c.turn_events(r["turnId"]) if e["method"] == "turn/textDelta"]
    shown_first = len(first_step.get("text", "").split())
    assert [d["isReset"] for d in deltas] == [False] * shown_first + [True, False, False]


# ---- generation options ----


@pytest.mark.parametrize(
    "options",
    [{"maxTokens": 0}, {"maxTokens": -1}, {"temperature": -3}, {"topP": 7}, {"maxTokens": 1_000_001}],
    ids=lambda o: json.dumps(o),
)
async def test_generation_options_out_of_range_are_refused_at_create(proc: Proc, options: dict[str, Any]) -> None:
    c = proc.client
    await c.initialize()
    with pytest.raises(RpcError) as e:
        await c.call("npc/create", {"npcId": "k", "options": options})
    assert e.value.code == "invalid_params"
    created = await c.call("npc/create", {"npcId": "k", "options": {"maxTokens": 1, "temperature": None, "topP": 1}})
    assert created["npcId"] == "k", "in range (and null: the engine's default) is fine"


# ---- --script ----


@pytest.mark.parametrize(
    "content, problem",
    [
        ("[" * 100_000 + "]" * 100_000, "not valid JSON: nested too deeply"),
        ('{"npcs": 5}', "npcs must map npc ids to steps"),
    ],
    ids=["nested too deeply", "npcs not an object"],
)
def test_a_bad_script_file_is_one_line_naming_the_file_once(tmp_path: Path, content: str, problem: str) -> None:
    path = tmp_path / "scene.json"
    path.write_text(content)
    r = subprocess.run(
        [*BRIDGE_CMD, "--engine", "scripted", "--script", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        stdin=subprocess.DEVNULL,
    )
    assert (r.returncode, r.stdout, r.stderr) == (2, "", f"oam-bridge: --script {path}: {problem}\n")


# ---- the repository a newcomer clones ----


def test_the_venv_and_the_native_build_are_ignored_by_git() -> None:
    r = subprocess.run(["git", "check-ignore", ".venv", "native/.build"], cwd=ROOT, capture_output=True, text=True)
    if r.returncode == 128:
        pytest.skip(f"not a git checkout: {r.stderr.strip()}")
    assert r.stdout.split() == [".venv", "native/.build"]


def test_the_install_uses_no_deprecated_or_noisy_setuptools_settings() -> None:
    # The license table made setuptools print a deprecation warning on every install; an
    # editable install of a flat layout without package-dir prints an "Editable installation"
    # notice every time (make setup runs pip install -e .).
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)
    assert isinstance(project["project"]["license"], str), "an SPDX expression, not a table (PEP 639)"
    assert any(r.replace(" ", "").startswith("setuptools>=77") for r in project["build-system"]["requires"])
    assert project["tool"]["setuptools"]["package-dir"] == {"": "."}


# ---- the README's commands, as printed ----


def test_the_readme_shows_how_to_play_the_demo_without_a_model() -> None:
    readme = Path(ROOT, "README.md").read_text()
    line = next((x for x in readme.splitlines() if "demo/scene.py --engine scripted" in x), None)
    assert line is not None, "the README names the demo's --engine scripted"
    command = line.split("#")[0].split()
    assert command[0] == ".venv/bin/python"
    r = subprocess.run(
        [sys.executable, *command[1:]], cwd=ROOT, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )
    assert r.returncode == 0, r.stderr
    assert "NPC greta on engine scripted" in r.stdout and "check_inventory" in r.stdout
    # the game layer: a world fact, a prewarm, two NPCs talking, a decision
    assert "world/set 'storm'" in r.stdout and "npc/prewarm bram -> prewarmed" in r.stdout
    assert "Greta:  A storm is coming from the north tonight, Bram." in r.stdout
    assert "Bram chose 'question': A stranger before a storm could be trouble." in r.stdout


def test_the_readme_game_layer_example_runs_as_printed() -> None:
    readme = Path(ROOT, "README.md").read_text()
    section = readme.split("## The game layer", 1)[1]
    block = _first_block(section, "sh").replace(".venv/bin/oam-bridge", f"{sys.executable} -m bridge")
    r = subprocess.run(["bash", "-c", block], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    done = [json.loads(x)["params"] for x in r.stdout.splitlines() if '"turn/completed"' in x]
    assert done[0]["text"].endswith("Facts you know now:\n- gate: barred for the storm"), (
        "what the README says the echo shows"
    )
    assert done[1]["json"] == {"reasoning": "It is late.", "choice": "question"}


def _first_block(markdown: str, lang: str) -> str:
    match = re.search(rf"^```{lang}\n(.*?)^```$", markdown, re.S | re.M)
    assert match, f"no ```{lang} block"
    return match.group(1)


def test_the_unreal_quick_start_builds_and_runs_as_printed(tmp_path: Path) -> None:
    """The README's C++ block, saved as quickstart.cpp, built and run with the README's own
    compile line from a directory laid out like the repository root."""
    have_json = (
        shutil.which("g++") is not None
        and subprocess.run(
            ["g++", "-std=c++17", "-x", "c++", "-fsyntax-only", "-"],
            input="#include <nlohmann/json.hpp>\n",
            capture_output=True,
            text=True,
        ).returncode
        == 0
    )
    if not have_json or not os.path.isdir(os.path.join(ROOT, ".venv")):
        missing("g++, the nlohmann/json headers (apt-get install -y g++ nlohmann-json3-dev) or .venv are missing")
    readme = Path(ROOT, "engine_clients", "unreal", "README.md").read_text()
    (tmp_path / "quickstart.cpp").write_text(_first_block(readme, "cpp"))
    for name in ("engine_clients", ".venv"):
        (tmp_path / name).symlink_to(os.path.join(ROOT, name))
    r = subprocess.run(
        ["bash", "-e", "-c", _first_block(readme, "sh")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "The north door is open." in r.stdout and '"output":{"opened":"north"}' in r.stdout
