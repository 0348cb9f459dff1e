"""The self-contained build (``make dist``) on other Linux systems than the one that built it.

The folder carries every shared library it needs but glibc's, so the oldest glibc it runs on
is the highest ``GLIBC_x.y`` symbol version one of its ELF files asks for (the loader refuses
to start it on an older one: "version `GLIBC_2.36' not found"). That floor is measured here
and must be the one README.md's "Shipping the bridge" states; then the build is started in
minimal systems that have it: a Debian bookworm made by ``debootstrap --variant=minbase``
(glibc 2.36, the floor itself) and Debian sid (the newest glibc: the chroot
engine_clients/godot/real/setup_chroot.sh caches for real Godot, which ``make test`` makes
anyway). In each, the folder is bind-mounted read-only, started with an empty environment,
answers ``initialize``, streams one short llama turn on the bundled model and shuts down;
the libraries it maps come from the folder, glibc's from the chroot.

The chroots need root, debootstrap and a Debian mirror ($OAM_DEBIAN_MIRROR, default
deb.debian.org). They are made once (about a minute for bookworm, two for sid with Godot and
its venv) and cached under $OAM_CHROOT_CACHE (default /var/cache/oam-bridge), built beside
the cache and renamed under a lock, so a half-made one is never used; then a system takes
about 5 s. A missing piece skips the test with the reason; under CI=true it fails it. Mounts
are made in a private mount namespace (unshare), so they vanish with the bridge, however the
test ends.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import struct
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import trio
import trio.testing

from tests.support.dist import DIST, foreign_libraries, frozen_bridge, mapped_libraries
from tests.support.harness import ROOT
from tests.support.needs import CI

GLIBC_FLOOR = "2.36"  # what README.md's "Shipping the bridge" states; measured below
CACHE = Path(os.environ.get("OAM_CHROOT_CACHE", "/var/cache/oam-bridge"))
MIRROR = os.environ.get("OAM_DEBIAN_MIRROR", "http://deb.debian.org/debian")
GODOT_SID = Path(ROOT) / "engine_clients" / "godot" / "real" / "setup_chroot.sh"
READY = ".oam-chroot-ready"
SHT_DYNSYM, SHT_GNU_VERNEED, SHT_GNU_VERSYM = 11, 0x6FFFFFFE, 0x6FFFFFFF


def glibc_needs(path: Path) -> dict[str, set[str]]:
    """The ``GLIBC_x.y`` versions an ELF file (64-bit little-endian) needs, each with the
    undefined symbols that ask for it: readelf -V's "Version needs" joined with the dynamic
    symbols. Not an ELF file: {}."""
    data = path.read_bytes()
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return {}
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]

    def string(strtab: int, offset: int) -> str:
        start = sections[strtab][4] + offset
        return data[start : data.index(b"\0", start)].decode()

    versions: dict[int, str] = {}  # version index (vna_other) -> name
    for s in sections:
        if s[1] == SHT_GNU_VERNEED:
            entry = s[4]
            for _ in range(s[7]):  # sh_info: the number of entries
                _, count, _, aux, following = struct.unpack_from("<HHIII", data, entry)
                at = entry + aux
                for _ in range(count):
                    _, _, index, name, next_aux = struct.unpack_from("<IHHII", data, at)
                    versions[index] = string(s[6], name)
                    at += next_aux
                entry += following
    needs: dict[str, set[str]] = {v: set() for v in versions.values() if v.startswith("GLIBC_2")}
    dynsym = next((s for s in sections if s[1] == SHT_DYNSYM), None)
    versym = next((s for s in sections if s[1] == SHT_GNU_VERSYM), None)
    if dynsym is not None and versym is not None:
        for i in range(dynsym[5] // 24):
            name, _, _, shndx, _, _ = struct.unpack_from("<IBBHQQ", data, dynsym[4] + 24 * i)
            version = versions.get(struct.unpack_from("<H", data, versym[4] + 2 * i)[0] & 0x7FFF)
            if shndx == 0 and version in needs:
                needs[version].add(string(dynsym[6], name))
    return needs


def as_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in version.removeprefix("GLIBC_").split("."))


def glibc_floor(folder: Path) -> tuple[str, list[str]]:
    """The highest glibc version any ELF file in ``folder`` needs, and who needs it
    ("_internal/libstdc++.so.6: arc4random")."""
    needs: dict[str, list[str]] = {}
    for path in sorted(folder.rglob("*")):
        if path.is_file() and not path.is_symlink() and path.open("rb").read(4) == b"\x7fELF":
            for version, symbols in glibc_needs(path).items():
                needs.setdefault(version, []).append(f"{path.relative_to(folder)}: {', '.join(sorted(symbols))}")
    top = max(needs, key=as_tuple)
    return top.removeprefix("GLIBC_"), needs[top]


def missing(reason: str) -> None:
    if CI:
        pytest.fail(f"{reason} (CI=true: the chroot tests must run)")
    pytest.skip(reason)


def need_root() -> None:
    if os.geteuid() != 0:
        missing("needs root (debootstrap, chroot, mount)")
    for tool in ("unshare", "chroot", "mount"):
        if shutil.which(tool) is None:
            missing(f"{tool} not found")


def minbase_chroot(suite: str) -> Path:
    """A minimal Debian ``suite`` (debootstrap --variant=minbase: glibc, coreutils, apt and
    little else; no Python, no libstdc++ beyond apt's), made once: $OAM_CHROOT_CACHE/dist-<suite>."""
    root = CACHE / f"dist-{suite}"
    if (root / READY).is_file():
        return root
    need_root()
    if shutil.which("debootstrap") is None:
        missing("debootstrap not found (apt-get install debootstrap; make test's system-deps does)")
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(f"{root}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another test run may be making it
        if (root / READY).is_file():
            return root
        work = Path(f"{root}.partial")
        if not (work / ".oam-debootstrap-done").is_file():
            # --one-file-system: never into a /proc or /dev a killed debootstrap left mounted
            subprocess.run(["rm", "-rf", "--one-file-system", str(work)], check=False)
            done = subprocess.run(
                ["debootstrap", "--variant=minbase", suite, str(work), MIRROR],
                capture_output=True,
                text=True,
                timeout=1800,
            )
            if done.returncode != 0:
                missing(
                    f"debootstrap {suite} from {MIRROR} failed ({done.returncode}): "
                    f"{done.stdout[-1000:]}{done.stderr[-1000:]}"
                )
            (work / ".oam-debootstrap-done").touch()
        (work / READY).write_text(f"debootstrap --variant=minbase {suite} {MIRROR}\n")
        subprocess.run(["rm", "-rf", "--one-file-system", str(root)], check=True)
        work.rename(root)
    return root


def godot_sid_chroot() -> Path:
    """Debian sid: the chroot real Godot runs in (setup_chroot.sh makes it or finds it cached)."""
    need_root()
    done = subprocess.run([str(GODOT_SID)], capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        missing(f"{GODOT_SID.name} failed ({done.returncode}): {done.stderr[-1500:]}")
    return Path(done.stdout.strip().splitlines()[-1])


CHROOTS: dict[str, Callable[[], Path]] = {
    "bookworm": lambda: minbase_chroot("bookworm"),
    "sid": godot_sid_chroot,
}


@contextmanager
def mount_point(root: Path) -> Iterator[str]:
    """An empty directory in the chroot's /tmp for the folder (its path inside the chroot),
    removed afterwards. rmdir, not rmtree: the mounts are private to the bridge's namespace,
    but should one ever show here, the folder's files must not be deleted through it."""
    host = Path(tempfile.mkdtemp(prefix="oam-dist-", dir=root / "tmp"))
    try:
        yield "/" + str(host.relative_to(root))
    finally:
        host.rmdir()


def in_chroot(root: Path, inside: str) -> list[str]:
    """The wrapper that starts the bridge in ``root``, with the folder bind-mounted read-only
    at ``inside`` and /proc and /dev mounted, in a private mount namespace (the mounts go with
    the bridge), with an empty environment but PATH. Each step execs the next, so the
    process is the bridge's."""
    script = (
        "R=$1 D=$2 M=$3 CHROOT=$4; shift 4; "
        'mount -t proc proc "$R/proc" && mount --bind /dev "$R/dev" && '
        'mount --bind -o ro "$D" "$R$M" && '
        'exec "$CHROOT" "$R" /usr/bin/env -i PATH=/usr/bin:/bin "$@"'
    )
    return [
        str(shutil.which("unshare")),
        "--mount",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
        script,
        "sh",
        str(root),
        str(DIST.resolve()),
        inside,
        str(shutil.which("chroot")),
    ]


def chroot_glibc(root: Path) -> str:
    done = subprocess.run(["chroot", str(root), "/usr/bin/getconf", "GNU_LIBC_VERSION"], capture_output=True, text=True)
    return done.stdout.strip() or f"? ({done.stderr.strip()})"


def test_the_glibc_floor_is_the_one_the_readme_states(dist_exe: Path) -> None:
    floor, needed_by = glibc_floor(DIST)
    assert floor == GLIBC_FLOOR, f"the build needs glibc {floor} (GLIBC_FLOOR says {GLIBC_FLOOR}): {needed_by}"
    readme = (Path(ROOT) / "README.md").read_text()
    shipping = readme.split("## Shipping the bridge", 1)[1].split("\n## ", 1)[0]
    assert f"glibc {GLIBC_FLOOR}" in shipping, "README.md's Shipping the bridge does not state the floor"


def test_glibc_needs_reads_version_needs_as_readelf_does() -> None:
    program = Path(shutil.which("env") or "/usr/bin/env")
    needs = glibc_needs(program)
    assert needs and all(re.fullmatch(r"GLIBC_2(\.\d+)+", v) for v in needs)
    assert any(symbols for symbols in needs.values())
    if shutil.which("readelf"):
        text = subprocess.run(["readelf", "-V", str(program)], capture_output=True, text=True).stdout
        assert set(needs) == set(re.findall(r"Name: (GLIBC_2[\d.]+)", text))
    assert glibc_needs(Path(ROOT) / "README.md") == {}


@pytest.fixture(scope="module", params=sorted(CHROOTS))
def chroot(request: pytest.FixtureRequest) -> Path:
    return CHROOTS[request.param]()


@pytest.mark.model  # the build bundles the venv's model
async def test_the_built_bridge_runs_a_llama_turn_in_a_minimal_system(
    dist_exe: Path, chroot: Path, tmp_path: Path
) -> None:
    glibc = chroot_glibc(chroot)
    with mount_point(chroot) as inside:
        async with frozen_bridge(
            Path(inside) / "oam-bridge", tmp_path, "--engine", "llama", wrapper=in_chroot(chroot, inside)
        ) as p:
            c = p.client
            with trio.fail_after(180):
                try:
                    init = await c.initialize()
                except AssertionError:  # it exited: the loader's or the bootloader's message is on stderr
                    await p.process.wait()
                    await trio.testing.wait_all_tasks_blocked()
                    pytest.fail(
                        f"the build did not start on {glibc} (exit {p.process.returncode}): "
                        f"{p.stderr.decode(errors='replace')[-1500:]}"
                    )
                engines = {e["name"]: e for e in init["engines"]}
                assert engines["llama"]["available"] is True, (glibc, engines["llama"])
                await c.call(
                    "npc/create",
                    {
                        "npcId": "greta",
                        "persona": {"name": "Greta", "role": "tavern keeper"},
                        "options": {"temperature": 0, "maxTokens": 8, "seed": 1},
                    },
                )
                turn, done = await c.turn("greta", "Good evening!")
                assert done["method"] == "turn/completed", (glibc, done)
                deltas = [e["params"]["delta"] for e in c.turn_events(turn) if e["method"] == "turn/textDelta"]
                assert len(deltas) >= 2 and "".join(deltas) == done["params"]["text"] and done["params"]["text"].strip()
                assert foreign_libraries(p.process.pid, chroot / inside.lstrip("/")) == [], glibc
                libc = [m for m in mapped_libraries(p.process.pid) if os.path.basename(m).startswith("libc.so")]
                assert libc and all(m.startswith(str(chroot.resolve()) + os.sep) for m in libc), libc
                await c.call("shutdown")
                await c.notify("exit")
                assert await p.process.wait() == 0, (glibc, p.stderr.decode(errors="replace"))
