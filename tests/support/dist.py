"""The self-contained build (``make dist``, packaging/) as the shipping tests start it: from
a directory of their own, with a clean environment, and which shared libraries it maps."""

from __future__ import annotations

import os
from collections.abc import Sequence
from contextlib import AbstractAsyncContextManager
from pathlib import Path

from tests.support.harness import ROOT, Proc, bridge_process

DIST = Path(ROOT) / "dist" / "oam-bridge"
EXE = DIST / "oam-bridge"
CLEAN_ENV = {"PATH": "/usr/bin:/bin"}  # what `env -i PATH=/usr/bin:/bin` leaves
# glibc's own libraries are the platform's (PyInstaller never bundles them); any other
# shared library the frozen bridge maps must come from its folder.
SYSTEM_LIBS = (
    "libc.so",
    "libm.so",
    "ld-linux",
    "libpthread.so",
    "libdl.so",
    "librt.so",
    "libutil.so",
    "libresolv.so",
    "libnss_",
)


def frozen_bridge(exe: Path, cwd: Path, *args: str, wrapper: Sequence[str] = ()) -> AbstractAsyncContextManager[Proc]:
    """The built bridge, started from ``cwd`` with a clean environment; ``wrapper`` is a
    command that execs it (the process is still the bridge's, e.g. chroot). No hang guard:
    the tests set their own."""
    return bridge_process([*wrapper, str(exe), *args], cwd, CLEAN_ENV, guard=None)


def mapped_libraries(pid: int) -> set[str]:
    """The shared libraries ``pid`` maps, as this process sees their paths."""
    paths = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and ".so" in parts[5]:
            paths.add(parts[5].strip())
    return paths


def foreign_libraries(pid: int, folder: Path = DIST) -> list[str]:
    """Shared libraries mapped by ``pid`` from outside the dist folder (``folder``: where the
    process sees it), glibc's aside."""
    dist = str(folder.resolve())
    return sorted(
        p
        for p in mapped_libraries(pid)
        if not os.path.realpath(p).startswith(dist + os.sep) and not os.path.basename(p).startswith(SYSTEM_LIBS)
    )
