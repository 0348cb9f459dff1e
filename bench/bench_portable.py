"""The portable llama.cpp (issue 29) beside a native build, in the same run.

The venv's llama-cpp-python is built portably (packaging/llama_wheel.sh: no -march=native,
one CPU backend per microarchitecture, the best chosen at run time). A native build
(``GGML_NATIVE=ON``, llama.cpp's default: compiled for this CPU alone) is built once with the
same script into its own cache folder (a few minutes on 2 cores) and installed into
``build/llama-native/``, outside the venv. Each round runs both sides as fresh subprocesses,
in alternating order, on the bundled model with the same settings as the bridge's scheduler
(decode on ``cores - 1`` threads, the prompt on every core):

- prompt tokens/s: a ~250-token prompt read in one batch on a fresh context;
- decode tokens/s: 128 tokens, greedy, one at a time.

Printed: each side's median, and the median of the per-round ratios portable / native with
their range. ``--variant haswell`` runs the portable side on that variant ($OAM_LLAMA_CPU).

Usage: python bench/bench_portable.py [--rounds 7] [--variant NAME]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics as st
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NATIVE_DIR = ROOT / "build" / "llama-native"
PROMPT = (
    "The old tavern at the crossroads has stood for three hundred years. Travellers from the "
    "north bring furs and stories of the long winter; merchants from the south bring spices, "
    "silk and rumours of war. The keeper, a broad woman named Greta, knows every face and "
    "every debt. "
) * 4
DECODE = 128


def child(side: str) -> None:
    """One measurement, printed as a JSON line (runs in a fresh process per side)."""
    sys.path.insert(0, str(ROOT))
    import llama_cpp
    import numpy as np

    from bridge.engines.llama._cpu import load_backends
    from bridge.engines.llama._model import default_model_path

    variant = load_backends()
    cores = os.cpu_count() or 1
    llm = llama_cpp.Llama(
        model_path=default_model_path(),
        n_ctx=1024,
        n_batch=512,
        n_threads=max(1, cores - 1),
        n_threads_batch=cores,
        verbose=False,
    )
    tokens = llm.tokenize(PROMPT.encode(), add_bos=True)
    llm.eval(tokens[:8])  # warm-up: the first decode maps the weights
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(tokens)
    prompt_s = time.perf_counter() - t0
    ctx, n_vocab = llm._ctx.ctx, llm.n_vocab()
    t0 = time.perf_counter()
    for _ in range(DECODE):
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))
        llm.eval([int(logits.argmax())])
    decode_s = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "side": side,
                "variant": variant,
                "prompt_tps": len(tokens) / prompt_s,
                "decode_tps": DECODE / decode_s,
                "prompt_tokens": len(tokens),
            }
        )
    )


def native_build() -> Path:
    """build/llama-native/, holding a native llama-cpp-python of the venv's version."""
    import importlib.metadata

    version = importlib.metadata.version("llama-cpp-python")
    stamp = NATIVE_DIR / ".version"
    if stamp.exists() and stamp.read_text() == version:
        return NATIVE_DIR
    env = dict(os.environ, LLAMA_CPP_VERSION=version, LLAMA_CMAKE_ARGS="-DGGML_NATIVE=ON", PYTHON=sys.executable)
    wheel = (
        subprocess.run(
            [str(ROOT / "packaging" / "llama_wheel.sh")], env=env, check=True, capture_output=True, text=True
        )
        .stdout.strip()
        .splitlines()[-1]
    )
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--upgrade", "--target", str(NATIVE_DIR), wheel],
        check=True,
    )
    stamp.write_text(version)
    return NATIVE_DIR


def run(side: str, native: Path, variant: str | None) -> dict[str, float | str]:
    env = dict(os.environ)
    env.pop("OAM_LLAMA_CPU", None)
    if side == "native":
        env["PYTHONPATH"] = str(native)
    elif variant:
        env["OAM_LLAMA_CPU"] = variant
    out = subprocess.run(
        [sys.executable, __file__, "--child", side], env=env, check=True, capture_output=True, text=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--variant", help="the portable side's CPU variant ($OAM_LLAMA_CPU); default: the best")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args.child)
        return
    native = native_build()
    rows: dict[str, list[dict[str, float | str]]] = {"portable": [], "native": []}
    for r in range(args.rounds):
        order = ("portable", "native") if r % 2 == 0 else ("native", "portable")
        for side in order:
            rows[side].append(run(side, native, args.variant))
        p, n = rows["portable"][-1], rows["native"][-1]
        print(
            f"round {r + 1}: portable ({p['variant']}) prompt {p['prompt_tps']:.0f} "
            f"decode {p['decode_tps']:.1f} tok/s; "
            f"native ({n['variant']}) prompt {n['prompt_tps']:.0f} decode {n['decode_tps']:.1f} tok/s",
            flush=True,
        )
    print(
        f"\n{args.rounds} rounds, {rows['portable'][0]['prompt_tokens']}-token prompt, {DECODE} tokens decoded, "
        f"{os.cpu_count()} cores"
    )
    print(f"{'':28}{'portable':>10}{'native':>10}{'ratio (paired median, range)':>34}")
    for key, label in (("prompt_tps", "prompt tokens/s"), ("decode_tps", "decode tokens/s")):
        ps = [float(x[key]) for x in rows["portable"]]
        ns = [float(x[key]) for x in rows["native"]]
        ratios = [a / b for a, b in zip(ps, ns, strict=True)]
        print(
            f"{label:28}{st.median(ps):10.1f}{st.median(ns):10.1f}"
            f"{st.median(ratios):14.3f} [{min(ratios):.3f}-{max(ratios):.3f}]"
        )
    print(f"portable variant: {rows['portable'][0]['variant']}; native: {rows['native'][0]['variant']}")


if __name__ == "__main__":
    main()
