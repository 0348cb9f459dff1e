"""What every host shares: the engine options (``--engine``, ``--model``, ...) and the registry
they build, and leaving the process without waiting for a model thread."""

from __future__ import annotations

import argparse
import logging
import os
import sys

from bridge.engines import EngineRegistry
from bridge.engines.scripted import ScriptedEngine
from bridge.errors import BridgeError

log = logging.getLogger("oam_bridge")


def add_engine_arguments(ap: argparse.ArgumentParser) -> None:
    """The engine options (``--engine``, ``--script``, ``--model``, ``--llama-*``,
    ``--openai-*``), shared by every host: the bridge, ``oam`` and its server."""
    ap.add_argument(
        "--engine",
        default=os.environ.get("OAM_ENGINE", "auto"),
        choices=["auto", "scripted", "llama", "native", "openai"],
        help="default engine for npc/create's 'auto' (env OAM_ENGINE)",
    )
    ap.add_argument(
        "--script", help='scripted engine: a JSON file of steps ({"default": [...], "npcs": {id: [...]}} or a list)'
    )
    ap.add_argument(
        "--model",
        default=os.environ.get("OAM_LLAMA_MODEL"),
        help=(
            "llama engine: a GGUF file, or a catalog name once pulled (oam models list; env OAM_LLAMA_MODEL; "
            "default: the bundled SmolLM2)"
        ),
    )
    ap.add_argument(
        "--llama-ctx",
        type=int,
        default=int(os.environ.get("OAM_LLAMA_CTX", "0")),
        help="llama engine: context window in tokens (env OAM_LLAMA_CTX; default: the model's, at most 8192)",
    )
    ap.add_argument(
        "--llama-threads",
        type=int,
        default=int(os.environ.get("OAM_LLAMA_THREADS", "0")),
        help=(
            "llama engine: the threads all of llama.cpp's work runs on, so the bridge keeps to that many cores "
            "(env OAM_LLAMA_THREADS; default: the usable cores but one, which stays with the game)"
        ),
    )
    ap.add_argument(
        "--priority",
        choices=["below", "normal"],
        default=os.environ.get("OAM_PRIORITY", "below"),
        help=(
            "the bridge's scheduling priority: below (default) yields the CPU to the game's frame when both want "
            "it (nice +10; Windows: below normal), normal keeps the game's (env OAM_PRIORITY)"
        ),
    )
    ap.add_argument(
        "--native-stream",
        choices=["untooled", "never"],
        default=os.environ.get("OAM_NATIVE_STREAM", "untooled"),
        help=(
            "native engine (Apple's model): untooled streams the words of steps that offer no tool as the model "
            "writes them; never answers every step at once (env OAM_NATIVE_STREAM; default untooled)"
        ),
    )
    ap.add_argument(
        "--llama-batch-threads",
        type=int,
        default=int(os.environ.get("OAM_LLAMA_BATCH_THREADS", "0")),
        help=(
            "llama engine: threads for prompt chunks and passes of several NPCs, if not --llama-threads "
            "(env OAM_LLAMA_BATCH_THREADS)"
        ),
    )
    ap.add_argument(
        "--llama-parallel",
        type=int,
        default=int(os.environ.get("OAM_LLAMA_PARALLEL", "0")),
        help=(
            "llama engine: NPCs whose steps decode together in one batch; more wait for a place (env "
            "OAM_LLAMA_PARALLEL; default 8)"
        ),
    )
    ap.add_argument(
        "--llama-verbose",
        action="store_true",
        default=os.environ.get("OAM_LLAMA_VERBOSE", "") not in ("", "0"),
        help="llama engine: let llama.cpp log to stderr (env OAM_LLAMA_VERBOSE=1)",
    )
    ap.add_argument(
        "--openai-url",
        default=os.environ.get("OAM_OPENAI_URL"),
        help=(
            "openai engine: an OpenAI-compatible server, e.g. http://127.0.0.1:8080/v1 (env OAM_OPENAI_URL; without "
            "it the engine is unavailable)"
        ),
    )
    ap.add_argument(
        "--openai-model",
        default=os.environ.get("OAM_OPENAI_MODEL"),
        help="openai engine: the model name to ask for (env OAM_OPENAI_MODEL; default: the first the server lists)",
    )
    ap.add_argument(
        "--openai-api-key",
        default=os.environ.get("OAM_OPENAI_API_KEY"),
        help="openai engine: sent as a bearer token (env OAM_OPENAI_API_KEY, which keeps it out of the process list)",
    )
    ap.add_argument(
        "--openai-timeout",
        type=float,
        default=float(os.environ.get("OAM_OPENAI_TIMEOUT", "60")),
        help=(
            "openai engine: seconds without a byte from the server before a step fails generation_failed (env "
            "OAM_OPENAI_TIMEOUT; default 60)"
        ),
    )
    ap.add_argument(
        "--openai-step-timeout",
        type=float,
        default=float(os.environ.get("OAM_OPENAI_STEP_TIMEOUT", "120")),
        help=(
            "openai engine: seconds a whole step may take, request to last event, before it fails "
            "generation_failed (step_timeout) (env OAM_OPENAI_STEP_TIMEOUT; default 120; 0: no deadline)"
        ),
    )
    ap.add_argument(
        "--openai-connect-timeout",
        type=float,
        default=float(os.environ.get("OAM_OPENAI_CONNECT_TIMEOUT", "5")),
        help=(
            "openai engine: seconds to connect before a step fails model_unavailable (env OAM_OPENAI_CONNECT_TIMEOUT; "
            "default 5)"
        ),
    )
    ap.add_argument(
        "--openai-ctx",
        type=int,
        default=int(os.environ.get("OAM_OPENAI_CTX", "4096")),
        help="openai engine: the server's context window in tokens, for trimming (env OAM_OPENAI_CTX; default 4096)",
    )
    ap.add_argument(
        "--openai-grammar",
        action="store_true",
        default=os.environ.get("OAM_OPENAI_GRAMMAR", "") not in ("", "0"),
        help=(
            "openai engine: constrain each step with the llama engine's GBNF in the request's 'grammar' field "
            "(llama-server, llama_cpp.server) instead of sending 'tools' and 'response_format': tool calls among "
            "several tools, free text and schema answers on servers that do not constrain a choice of tools (env "
            "OAM_OPENAI_GRAMMAR=1)"
        ),
    )


PRIORITY_NICE = 10  # bench/bench_frame.py: the game loop's p99 frame time beside 8 NPCs
_lowered: list[bool] = []  # lower_priority has run (os.nice adds up: once per process)


def lower_priority(priority: str) -> None:
    """``below``: the bridge's threads yield the CPU to the game's when both want it (POSIX: nice
    +10, for the threads already running (numpy's, started at import) and those started from now
    on, which inherit it: the host calls it before it starts any of its own;
    once per process, however often it is called; Windows: the
    process's BELOW_NORMAL_PRIORITY_CLASS). A platform that refuses is said on stderr."""
    if priority != "below" or _lowered:
        return
    _lowered.append(True)
    try:
        if sys.platform == "win32":
            import ctypes

            kernel32 = ctypes.windll.kernel32  # type: ignore[attr-defined]
            if not kernel32.SetPriorityClass(kernel32.GetCurrentProcess(), 0x00004000):
                raise OSError("SetPriorityClass failed")
        else:
            now = os.nice(PRIORITY_NICE)
            if sys.platform.startswith("linux"):  # nice is per thread there: the ones already running too
                for task in os.listdir("/proc/self/task"):
                    os.setpriority(os.PRIO_PROCESS, int(task), now)
    except (OSError, AttributeError, ValueError) as e:
        log.warning("could not lower the bridge's priority: %s", e)


def build_registry(args: argparse.Namespace) -> EngineRegistry:
    """The engines ``add_engine_arguments``' options describe. A bad ``--script`` ends the
    process with one clear line on stderr (exit status 2)."""
    scripted = _scripted_engine(args.script)
    llama_kwargs: dict[str, object] = {"verbose": args.llama_verbose}
    if args.model:
        llama_kwargs["model_path"] = _model_option(args.model)
    if args.llama_ctx:
        llama_kwargs["n_ctx"] = args.llama_ctx
    if args.llama_threads:
        llama_kwargs["n_threads"] = args.llama_threads
    if args.llama_batch_threads:
        llama_kwargs["n_threads_batch"] = args.llama_batch_threads
    if args.llama_parallel:
        llama_kwargs["n_parallel"] = args.llama_parallel
    openai_kwargs: dict[str, object] = {
        "url": args.openai_url,
        "model": args.openai_model,
        "api_key": args.openai_api_key,
        "timeout_s": args.openai_timeout,
        "step_timeout_s": args.openai_step_timeout,
        "connect_timeout_s": args.openai_connect_timeout,
        "n_ctx": args.openai_ctx,
        "grammar": args.openai_grammar,
    }
    native_kwargs = {"backend": "best", "stream": args.native_stream}
    registry = EngineRegistry(
        default=args.engine, scripted=scripted, llama=llama_kwargs, openai=openai_kwargs, native=native_kwargs
    )
    if args.model:  # a file the operator chose: a wrong one is said now, not at the first create
        llama = next(e for e in registry.infos() if e.name == "llama")
        if not llama.available:
            log.warning("the llama engine is unavailable: %s", llama.reason)
    return registry


def _model_option(value: str) -> str:
    """``--model``'s file: a catalog name (``oam models``) is its downloaded file; one not
    downloaded yet ends the process with one clear line on stderr (``model_unavailable``'s
    exit status), naming the command that fetches it."""
    from bridge.engines.llama._catalog import resolve

    try:
        return resolve(value)
    except BridgeError as e:
        print(f"oam-bridge: --model {value}: {e.code}: {e.message}", file=sys.stderr)
        leave(e.exit_code)
        raise AssertionError("unreachable") from None


def _scripted_engine(path: str | None) -> ScriptedEngine:
    """The scripted engine, with ``--script``'s steps; a bad file ends the process with one
    clear line on stderr (exit status 2), not a traceback."""
    if path is None:
        return ScriptedEngine()
    try:
        return ScriptedEngine.from_file(path)
    except OSError as e:
        problem = f"cannot read it: {e.strerror or e}"
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        problem = f"not valid JSON: {e}"
    except RecursionError:
        problem = "not valid JSON: nested too deeply"
    except BridgeError as e:
        problem = e.message
    print(f"oam-bridge: --script {path}: {problem}", file=sys.stderr)
    leave(2)
    raise AssertionError("unreachable")


def leave(status: int) -> None:
    """Exit now: a model thread still generating must not hold the process past the grace
    period (serve() already wrote what could be written)."""
    logging.shutdown()
    sys.stderr.flush()
    os._exit(status)
