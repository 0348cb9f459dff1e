"""llama.cpp's CPU variants: the portable build loads the best CPU backend this
CPU runs, says which, and a llama turn runs on CPUs older than the one that built it.

The older CPUs are qemu-user's CPU models, run through the real bridge: Haswell (AVX2, no
AVX-512: most desktop CPUs a game meets) and Nehalem (SSE4.2, no AVX: x86-64-v2), on the
venv's bridge and on the frozen one (``make dist``). PyInstaller's bootloader restarts itself
with exec, which qemu-user would run natively; ``tests/support/qemu_exec.c`` keeps the
restarted image on the emulated CPU. Under qemu's TCG the model reads a few tokens a second,
so these turns are a short prompt and two tokens.

qemu-user (``qemu-x86_64``) comes from packaging/system_deps.sh; without it these tests skip,
and fail under CI=true.
"""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
import trio

from bridge.engines.llama import _cpu
from tests.support.harness import BRIDGE_CMD, ROOT, Proc, bridge_process
from tests.support.needs import CI

QEMU = shutil.which("qemu-x86_64")
SHIM_SRC = Path(ROOT) / "tests" / "support" / "qemu_exec.c"
# (qemu CPU model, the variant llama.cpp must pick on it)
OLD_CPUS = [("Haswell", "haswell"), ("Nehalem", "sse42")]
QEMU_DEADLINE = 900  # s: Python's start-up and the model's first read under TCG

pytestmark = [
    pytest.mark.model,
    pytest.mark.skipif(platform.machine() != "x86_64", reason="the variants tested are x86-64's"),
]


def need_qemu() -> str:
    if QEMU is None:
        if CI:
            pytest.fail("qemu-x86_64 not found (packaging/system_deps.sh installs qemu-user)")
        pytest.skip("qemu-x86_64 not found (apt-get install qemu-user)")
    return QEMU


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("qemu") / "qemu_exec.so"
    cc = shutil.which("cc") or shutil.which("gcc")
    assert cc, "a C compiler is needed to build tests/support/qemu_exec.c"
    subprocess.run([cc, "-shared", "-fPIC", "-O2", "-o", str(out), str(SHIM_SRC), "-ldl"], check=True)
    return out


def bridge_on(
    cpu: str | None, cmd: list[str], shim: Path | None, env: dict[str, str], cwd: str
) -> AbstractAsyncContextManager[Proc]:
    """``cmd`` started under qemu-user's ``cpu`` model (natively when None), its execs too."""
    argv, env = list(cmd), dict(env)
    if cpu is not None:
        assert QEMU and shim
        env.update(OAM_QEMU=QEMU, OAM_QEMU_CPU=cpu, OAM_QEMU_PRELOAD=str(shim))
        argv = [QEMU, "-cpu", cpu, "-E", f"LD_PRELOAD={shim}", *argv]
    return bridge_process(argv, cwd, env, guard=None)  # the tests set their own


async def one_turn(p: Proc, max_tokens: int) -> tuple[str, str]:
    """(the variant engine/status reports, the text of one short llama turn)."""
    c = p.client
    await c.initialize()
    # instructions rather than a persona: 12 prompt tokens instead of 40 (each costs seconds under TCG)
    await c.call(
        "npc/create",
        {
            "npcId": "ann",
            "engine": "llama",
            "instructions": "Be brief.",
            "options": {"temperature": 0, "maxTokens": max_tokens, "seed": 1},
        },
    )
    turn, done = await c.turn("ann", "Hi!")
    assert done["method"] == "turn/completed", (done, p.stderr.decode(errors="replace")[-2000:])
    c.assert_well_formed(turn)
    engines = {e["name"]: e for e in (await c.call("engine/status"))["engines"]}
    await c.call("shutdown")
    await c.notify("exit")
    assert await p.process.wait() == 0, p.stderr.decode(errors="replace")[-2000:]
    return engines["llama"]["cpuVariant"], done["params"]["text"]


def installed() -> dict[str, Path]:
    vs = _cpu.variants()
    if not vs:
        pytest.fail(
            "llama-cpp-python was built without CPU variants: make setup builds the portable wheel "
            "(packaging/llama_wheel.sh); a venv made before it needs `rm .venv/.installed && make setup`"
        )
    return vs


def test_the_portable_build_installs_a_cpu_backend_per_microarchitecture() -> None:
    vs = installed()
    assert {"x64", "sse42", "haswell", "skylakex", "icelake", "zen4"} <= set(vs), sorted(vs)


async def test_the_bridge_runs_the_best_variant_this_cpu_has_and_says_which() -> None:
    installed()
    async with bridge_on(None, [*BRIDGE_CMD, "--engine", "llama"], None, dict(os.environ), ROOT) as p:
        with trio.fail_after(120):
            variant, text = await one_turn(p, 4)
    assert text.strip()
    flags = set(Path("/proc/cpuinfo").read_text().split())
    best = "zen4" if "avx512_bf16" in flags and "AuthenticAMD" in flags else None
    if "avx512f" in flags:
        assert variant not in ("x64", "sse42", "sandybridge", "ivybridge", "haswell", "piledriver"), variant
    elif "avx2" in flags:
        assert variant in ("haswell", "alderlake", "piledriver"), variant
    if best:
        assert variant == best
    assert f"llama.cpp CPU backend: {variant}" in p.stderr.decode(errors="replace")


async def test_a_variant_asked_for_by_name_is_the_one_that_runs() -> None:
    installed()
    env = {**os.environ, _cpu.VARIANT_ENV: "haswell"}
    async with bridge_on(None, [*BRIDGE_CMD, "--engine", "llama"], None, env, ROOT) as p:
        with trio.fail_after(120):
            variant, _ = await one_turn(p, 4)
    assert variant == "haswell"


async def test_a_variant_that_is_not_installed_fails_the_create_with_a_reason() -> None:
    installed()
    env = {**os.environ, _cpu.VARIANT_ENV: "pentium3"}
    async with bridge_on(None, [*BRIDGE_CMD, "--engine", "llama"], None, env, ROOT) as p:
        c = p.client
        with trio.fail_after(120):
            await c.initialize()
            reply = await c.call_raw("npc/create", {"npcId": "ann", "engine": "llama", "persona": {"name": "Ann"}})
            assert reply["error"]["data"]["code"] == "model_unavailable", reply
            assert "pentium3" in reply["error"]["message"] and "haswell" in reply["error"]["message"], reply
            assert (await c.call("npc/list"))["npcs"] == []  # and the bridge serves on
            await c.call("shutdown")
            await c.notify("exit")
            assert await p.process.wait() == 0


@pytest.mark.parametrize(("cpu", "variant"), OLD_CPUS)
async def test_a_llama_turn_on_an_older_cpu_through_the_venv(cpu: str, variant: str, shim: Path) -> None:
    need_qemu()
    installed()
    async with bridge_on(cpu, [sys.executable, "-m", "bridge", "--engine", "llama"], shim, dict(os.environ), ROOT) as p:
        with trio.fail_after(QEMU_DEADLINE):
            got, text = await one_turn(p, 2)
    assert got == variant and text.strip(), (got, text)


@pytest.mark.parametrize(("cpu", "variant"), OLD_CPUS)
async def test_a_llama_turn_on_an_older_cpu_through_the_dist(
    cpu: str, variant: str, shim: Path, dist_exe: Path, tmp_path: Path
) -> None:
    need_qemu()
    async with bridge_on(
        cpu, [str(dist_exe), "--engine", "llama"], shim, {"PATH": "/usr/bin:/bin"}, str(tmp_path)
    ) as p:
        with trio.fail_after(QEMU_DEADLINE):
            got, text = await one_turn(p, 2)
    assert got == variant and text.strip(), (got, text)


async def test_the_dist_copied_without_its_symlinks_still_finds_its_cpu_backend(dist_exe: Path, tmp_path: Path) -> None:
    # A game's build step may copy the folder with its symlinks made into files (Unity's
    # File.Copy does): _internal/libggml.so.0, which libllama loads, is then another copy of
    # llama_cpp/lib/libggml.so.0, and a backend registered in that one left libllama none
    # ("Failed to load model from file").
    flat = tmp_path / "flat"
    shutil.copytree(dist_exe.parent, flat, symlinks=False)
    assert not [p for p in flat.rglob("*") if p.is_symlink()]
    async with bridge_on(
        None, [str(flat / dist_exe.name), "--engine", "llama"], None, {"PATH": "/usr/bin:/bin"}, str(tmp_path)
    ) as p:
        with trio.fail_after(120):
            variant, text = await one_turn(p, 4)
    assert variant in installed() and text.strip()
