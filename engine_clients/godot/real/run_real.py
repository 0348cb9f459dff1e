#!/usr/bin/env python3
"""Runs the Godot addon in real Godot 4 (Debian sid's `godot`, in the chroot setup_chroot.sh
caches) against the real bridge, which runs inside the chroot as the subprocess Godot starts.

1. a fresh copy of the project (no .godot/, no class cache): the shared scenario must pass;
2. `godot --headless --import`, then every check of tests/godot/runner.gd (the scenario, the
   README quick start, the README's "Shipping your game" snippet against `make dist`'s build, the
   addon's own checks);
3. export: `godot --export-release` with Debian's release template; the addon's export plugin
   must place make dist's bridge beside the executable, and the exported game must start it;
4. orphan: a game with a running bridge is killed with SIGKILL; the bridge must be gone
   within 1 s.

Exit 0: all passed; 1: something failed; 77: Godot could not be set up (run_tests.sh makes
that a SKIP, or a FAIL with CI=true). --addon DIR runs another copy of addons/oam_bridge (to
show a check failing before a fix). Needs root (chroot, mount namespaces).
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
GODOT_DIR = HERE.parent
REPO = GODOT_DIR.parent.parent
SCENARIO = GODOT_DIR.parent / "scenario.json"
IN_CHROOT_REPO = "/oam/repo"  # where setup_chroot.sh's oam-bridge wrapper finds the checkout
DIST = REPO / "dist" / "oam-bridge"  # make dist's self-contained bridge (PyInstaller, one folder)
IN_CHROOT_DIST = IN_CHROOT_REPO + "/dist/oam-bridge"
SKIP = 77


def setup() -> Path | None:
    proc = subprocess.run([str(HERE / "setup_chroot.sh")], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr[-3000:])
        print(f"godot-real: chroot setup failed (exit {proc.returncode})")
        return None
    return Path(proc.stdout.strip().splitlines()[-1])


def chroot_cmd(root: Path, *argv: str) -> list[str]:
    """argv run inside the chroot, in a private mount namespace: the mounts vanish with it."""
    script = (
        'R=$1; REPO=$2; shift 2; '
        'mount -t proc proc "$R/proc" && mount --bind /dev "$R/dev" && '
        'mount --bind "$REPO" "$R/oam/repo" && '
        'exec chroot "$R" /usr/bin/env -i PATH=/usr/local/bin:/usr/bin:/bin HOME=/root '
        'LANG=C.UTF-8 "$@"'
    )
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "sh",
            str(root), str(REPO), *argv]


def make_project(root: Path, addon: Path) -> tuple[Path, Path, str]:
    """A copy of the project inside the chroot's /tmp, laid out as the README's "Shipping your
    game" has it in the editor: BASE/game/ (the project) beside BASE/oam-bridge/dist/oam-bridge/,
    a link to the checkout's make dist build, so res://../oam-bridge/dist/oam-bridge/oam-bridge
    is that build. Returns (BASE on the host, the project on the host, the project's chroot path).
    """
    base = Path(tempfile.mkdtemp(prefix="oam-godot-", dir=root / "tmp"))
    host = base / "game"
    host.mkdir()
    (base / "oam-bridge" / "dist").mkdir(parents=True)
    # resolved inside the chroot, where the checkout is bind-mounted (read-only: not a copy)
    (base / "oam-bridge" / "dist" / "oam-bridge").symlink_to(IN_CHROOT_DIST)
    inside = "/" + str(host.relative_to(root))
    shutil.copy(GODOT_DIR / "project.godot", host)
    shutil.copytree(addon, host / "addons" / "oam_bridge")
    shutil.copytree(GODOT_DIR / "example", host / "example")
    shutil.copytree(GODOT_DIR / "tests" / "godot", host / "tests" / "godot")
    shutil.copy(SCENARIO, host / "tests" / "godot" / "scenario.json")
    (host / "tests" / "godot" / "quickstart.gd").write_text(quickstart())
    (host / "tests" / "godot" / "shipping.gd").write_text(shipping())
    return base, host, inside


def quickstart() -> str:
    """The README's quick start (its first gdscript block) as a script of its own."""
    text = (GODOT_DIR / "README.md").read_text()
    block = re.search(r"```gdscript\n(.*?)```", text, re.S)
    assert block, "README.md: no gdscript block"
    return "extends Node\n\n" + block.group(1)


def shipping() -> str:
    """The README's "Shipping your game" snippet (the gdscript block after that heading) as a
    script of its own, as printed: its editor path and its `--engine auto` included."""
    text = (GODOT_DIR / "README.md").read_text()
    section = text.split("**Shipping your game.**", 1)
    assert len(section) == 2, "README.md: no **Shipping your game.**"
    block = re.search(r"```gdscript\n(.*?)```", section[1], re.S)
    assert block and "shipped_bridge_path(" in block.group(1), "README.md: no shipping snippet"
    return "extends Node\n\n" + block.group(1)


def dist_check(root: Path) -> tuple[bool, list[str]]:
    """Whether runner.gd's shipping check can run (make dist's build is there) and what to pass
    it. No build: SKIP, or FAIL with CI=true (make test builds it before the client tests)."""
    if not (DIST / "oam-bridge").is_file():
        if os.environ.get("CI") == "true":
            print("-- shipping: FAIL: dist/oam-bridge/oam-bridge is not built (make dist; "
                  "tests/shipping/test_dist.py builds it in make test; CI=true needs it)")
            return False, ["--skip=shipping"]
        print("-- shipping: skip: dist/oam-bridge not built (make dist)")
        return True, ["--skip=shipping"]
    # built against the host's glibc, run under the chroot's (newer) one
    host_libc = os.confstr("CS_GNU_LIBC_VERSION") or "?"
    proc = subprocess.run(["chroot", str(root), "getconf", "GNU_LIBC_VERSION"],
                          capture_output=True, text=True)
    print(f"-- shipping: make dist's build (host {host_libc}) runs in the chroot "
          f"({proc.stdout.strip() or '?'}) as {IN_CHROOT_DIST}/oam-bridge")
    return True, [f"--dist={IN_CHROOT_DIST}/oam-bridge"]


EXPORT_PRESETS = """[preset.0]

name="Linux"
platform="Linux"
runnable=true
export_filter="all_resources"
include_filter="*.json"
exclude_filter=""
export_path=""

[preset.0.options]

custom_template/debug=""
custom_template/release="/usr/bin/godot-template-release"
binary_format/embed_pck=false
binary_format/architecture="x86_64"
"""


def export_game(root: Path, base: Path, host: Path, inside: str) -> bool:
    """A real export (Debian's godot-template-release): the addon's export plugin must put the
    shipped bridge beside the executable as oam-bridge/, and the exported game must start it
    from there (runner.gd's "exported" check, in the exported executable)."""
    if not (DIST / "oam-bridge").is_file():
        fail = os.environ.get("CI") == "true"
        print(f"-- export: {'FAIL' if fail else 'skip'}: dist/oam-bridge not built (make dist)")
        return not fail
    (host / "export_presets.cfg").write_text(EXPORT_PRESETS)
    # a release template takes no scene on its command line: the exported game runs the checks
    project = host / "project.godot"
    project.write_text(re.sub(r'run/main_scene="[^"]*"', 'run/main_scene="res://tests/godot/runner.tscn"',
                              project.read_text()))
    out = base / "export"
    out.mkdir()
    exe = "/" + str(out.relative_to(root)) + "/game.x86_64"
    t0 = time.monotonic()
    exported = godot(root, inside, "--export-release", "Linux", exe, timeout=300)
    took = time.monotonic() - t0
    copied = [ln for ln in exported.stdout.splitlines() if ln.startswith("[oam-bridge] copied")]
    placed = out / "oam-bridge" / "oam-bridge"
    ok = exported.returncode == 0 and (out / "game.x86_64").is_file() and placed.is_file()
    ok = ok and os.access(placed, os.X_OK) and (out / "oam-bridge" / "_internal").is_dir()
    print(f"-- export: godot --export-release (exit {exported.returncode}, {took:.0f} s): "
          f"{'ok' if ok else 'FAIL'}: {copied[0] if copied else 'the plugin copied nothing'}")
    if not ok:
        for ln in (exported.stderr + exported.stdout).splitlines()[-15:]:
            print("   | " + ln)
        return False
    cmd = chroot_cmd(root, exe, "--headless", "--", "--only=exported")
    try:
        ran = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        print("-- the exported game: FAIL (timed out)")
        return False
    return report("the exported game starts the bridge the export placed", ran)


def godot(root: Path, project: str, *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    cmd = chroot_cmd(root, "godot", "--headless", "--path", project, *args)
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return subprocess.CompletedProcess(cmd, 124, out + f"\n(timed out after {timeout} s)\n", err)


def report(title: str, proc: subprocess.CompletedProcess[str]) -> bool:
    lines = [ln for ln in proc.stdout.splitlines()
             if ln.startswith(("ok - ", "FAIL - ", "godot real:", "  ", "(timed out"))]
    print(f"-- {title} (exit {proc.returncode})")
    for ln in lines:
        print("   " + ln)
    ok = proc.returncode == 0 and any(ln.startswith("godot real:") for ln in lines)
    if not ok:
        errors = [ln for ln in (proc.stderr + proc.stdout).splitlines()
                  if "ERROR" in ln or "error" in ln.lower() or ln.startswith("   at:")]
        for ln in errors[:15]:
            print("   | " + ln)
    return ok


def orphan(root: Path, project: str) -> bool:
    """SIGKILL a Godot running a bridge; the bridge must be gone within 1 s."""
    cmd = chroot_cmd(root, "godot", "--headless", "--path", project,
                     "res://tests/godot/runner.tscn", "--", "--orphan")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    game = bridge = -1
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        m = re.match(r"ORPHAN (\d+) (\d+)", line)
        if m:
            game, bridge = int(m.group(1)), int(m.group(2))
            break
    if bridge < 0:
        proc.kill()
        print("-- orphan: FAIL (the game never reported its bridge)")
        return False
    os.kill(game, signal.SIGKILL)
    t0 = time.monotonic()
    gone = False
    while time.monotonic() - t0 < 1.0:
        if not alive(bridge):
            gone = True
            break
        time.sleep(0.005)
    took = (time.monotonic() - t0) * 1000
    proc.wait(timeout=10)
    if not gone:
        os.kill(bridge, signal.SIGKILL)
    print(f"-- orphan: {'ok' if gone else 'FAIL'}: game SIGKILLed, bridge "
          f"{'gone after %.0f ms' % took if gone else 'still running after 1 s'}")
    return gone


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except FileNotFoundError:
        return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--addon", type=Path, default=GODOT_DIR / "addons" / "oam_bridge")
    ap.add_argument("--only", default="", help="runner.gd checks to run (comma-separated)")
    ap.add_argument("--keep", action="store_true", help="keep the project copy")
    args = ap.parse_args()
    if os.geteuid() != 0 or not shutil.which("unshare"):
        print("godot-real: needs root and unshare (chroot, mount namespaces)")
        return SKIP
    root = setup()
    if root is None:
        return SKIP
    base, host, inside = make_project(root, args.addon.resolve())
    ok = True
    try:
        only = [f"--only={args.only}"] if args.only else []
        if not args.only or "shipping" in args.only.split(","):
            dist_ok, dist_args = dist_check(root)
            ok &= dist_ok
            only += dist_args
        fresh = godot(root, inside, "res://tests/godot/runner.tscn", "--", "--only=scenario",
                      timeout=90)
        ok &= report("fresh checkout, no class cache: the scenario", fresh)
        imported = godot(root, inside, "--import", timeout=180)
        print(f"-- godot --import (exit {imported.returncode})")
        ok &= imported.returncode == 0
        full = godot(root, inside, "res://tests/godot/runner.tscn", "--", *only, timeout=300)
        ok &= report("after --import: every check", full)
        if not args.only:
            ok &= export_game(root, base, host, inside)
        ok &= orphan(root, inside)
    finally:
        if not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print("godot-real: " + ("PASS" if ok else "FAIL"))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
