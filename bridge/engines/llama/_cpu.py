"""llama.cpp's CPU backend: which build of it runs on this CPU.

The project builds llama.cpp portably (packaging/llama_wheel.sh): no ``-march=native``, the
ggml backends as loadable modules, and one CPU backend per microarchitecture
(``libggml-cpu-{x64,sse42,sandybridge,haswell,skylakex,icelake,alderlake,zen4,...}.so``).
llama.cpp itself looks for them only beside the executable and in the current directory,
so ``load_backends`` registers them from where the wheel (``site-packages/bin``) or the
frozen build (``llama_cpp/lib``) put them; llama.cpp scores each against the CPU's features
and keeps the best one it can run. ``$OAM_LLAMA_CPU=haswell`` (a variant's name) loads that
one alone instead: to test or measure another variant, or to step around a broken one.

A llama-cpp-python built the default way (its CPU backend linked in, for the CPU that
compiled it) has no variant files; then nothing is loaded and the variant reads "built in".
"""

from __future__ import annotations

import ctypes
import os
import re
import sys
import threading
from pathlib import Path

from bridge.errors import BridgeError

VARIANT_ENV = "OAM_LLAMA_CPU"
BUILT_IN = "built in"
_PREFIX = "libggml-cpu-"
_SUFFIX = ".dylib" if sys.platform == "darwin" else ".dll" if sys.platform == "win32" else ".so"
_MAPPED = re.compile(r"libggml-cpu-([A-Za-z0-9_]+)\.(?:so|dylib|dll)\b")

_lock = threading.Lock()
_variant: str | None = None  # set once the backends are loaded


def _lib_dir() -> Path:
    import llama_cpp  # loads libllama and the ggml libraries it links

    return Path(llama_cpp.__file__).resolve().parent / "lib"


def variant_dirs() -> list[Path]:
    """Where the CPU variants may be: the wheel installs them into ``site-packages/bin``; the
    frozen build (packaging/oam-bridge.spec) puts them beside the other libraries."""
    lib = _lib_dir()
    return [lib, lib.parent.parent / "bin"]


def variants() -> dict[str, Path]:
    """The CPU variants installed, by name (``haswell``: ``.../libggml-cpu-haswell.so``)."""
    found: dict[str, Path] = {}
    for d in variant_dirs():
        for p in sorted(d.glob(f"{_PREFIX}*{_SUFFIX}")) if d.is_dir() else []:
            found.setdefault(p.name[len(_PREFIX) : -len(_SUFFIX)], p)
    return found


def _ggml() -> ctypes.CDLL:
    """libggml as libllama linked it: backends registered in another copy of it stay unseen
    by libllama. The wheel holds ``libggml.so`` and ``libggml.so.0`` as separate copies, and
    a game's build step may turn the dist's symlinks into copies (Unity's File.Copy does), so
    the library is found by its soname among those already loaded (``import llama_cpp``
    loaded it with libllama), and by its path only where that fails."""
    candidates: list[tuple[str, int]] = []
    if sys.platform.startswith("linux"):
        candidates.append(("libggml.so.0", os.RTLD_NOLOAD))
    lib = _lib_dir()
    candidates += [
        (str(lib / n), ctypes.DEFAULT_MODE)
        for n in ("libggml.so.0", "libggml.so", "libggml.dylib", "ggml.dll")
        if (lib / n).exists()
    ]
    for name, mode in candidates:
        try:
            g = ctypes.CDLL(name, mode=mode)
        except OSError:
            continue
        g.ggml_backend_load.restype = ctypes.c_void_p
        g.ggml_backend_load.argtypes = [ctypes.c_char_p]
        g.ggml_backend_load_all_from_path.argtypes = [ctypes.c_char_p]
        g.ggml_backend_reg_count.restype = ctypes.c_size_t
        return g
    raise BridgeError("model_unavailable", f"llama.cpp's libggml was not found in {lib}")


def _mapped_variant() -> str | None:
    """The variant whose library this process has mapped (Linux), else None."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            names = set(_MAPPED.findall(f.read()))
    except OSError:
        return None
    return names.pop() if len(names) == 1 else None


def load_backends() -> str:
    """Registers llama.cpp's CPU backend once per process, before the first model loads, and
    returns the variant in use (``haswell``, ``zen4``, ... or ``"built in"``). Raises
    ``BridgeError("model_unavailable")`` when ``$OAM_LLAMA_CPU`` names a variant that is not
    installed or that this CPU cannot run, or when no variant runs here. Blocking (it opens
    shared libraries): call it where the model loads, off the event loop."""
    global _variant
    with _lock:
        if _variant is not None:
            return _variant
        found = variants()
        if not found:
            _variant = BUILT_IN
            return _variant
        ggml = _ggml()
        forced = os.environ.get(VARIANT_ENV, "").strip()
        if forced:
            path = found.get(forced)
            if path is None:
                raise BridgeError(
                    "model_unavailable",
                    f"${VARIANT_ENV}={forced}: no such CPU variant of llama.cpp "
                    f"(installed: {', '.join(sorted(found))})",
                )
            if not ggml.ggml_backend_load(str(path).encode()):
                raise BridgeError("model_unavailable", f"${VARIANT_ENV}={forced}: this CPU cannot run that variant")
            name = forced
        else:
            dirs = {p.parent for p in found.values()}
            for d in sorted(dirs):
                ggml.ggml_backend_load_all_from_path(str(d).encode())
                if ggml.ggml_backend_reg_count():
                    break
            if not ggml.ggml_backend_reg_count():
                raise BridgeError(
                    "model_unavailable",
                    f"no CPU variant of llama.cpp runs on this CPU (installed: {', '.join(sorted(found))})",
                )
            name = _mapped_variant() or "unknown"
        print(f"oam-bridge: llama.cpp CPU backend: {name}", file=sys.stderr, flush=True)
        _variant = name
        return _variant


def variant() -> str | None:
    """The variant ``load_backends`` chose, or None before any model loaded."""
    return _variant


def llama_cpp_server_command() -> list[str]:
    """``python -m llama_cpp.server`` (llama-cpp-python's OpenAI-compatible server, which the
    tests and benchmarks run beside the bridge) with the CPU backend loaded first: llama.cpp
    looks for it only beside the executable."""
    main = (
        "import runpy; from bridge.engines.llama._cpu import load_backends; load_backends(); "
        "runpy.run_module('llama_cpp.server', run_name='__main__', alter_sys=True)"
    )
    return [sys.executable, "-c", main]
