"""The llama engine's saved-state lookups against the number of states held (issue 12).

Each NPC admitted to the llama engine's scheduler looks its prompt up among the saved KV
states in RAM (``StateCache.start_of``) and, taking a slot of no one, saves that slot's
tokens as a prefix (``StateCache.put_prefix``); both run on the scheduler's thread between
two decodes of every NPC speaking. This times that pair per admission with 20, 160 and 500
states held (160 is what the cache held after 20 rounds of ``bench_batch`` at 8 NPCs),
against the same code of another revision (``--baseline REV``, read with ``git show``) in
the same run; medians of 200 admissions. Prompts of 100 tokens, states of 160 sharing the
chat template's first 4 tokens, as in ``bench_batch``.

Usage: python bench/bench_states.py [--baseline REV]
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from types import ModuleType

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
PATH = "bridge/engines/llama/_states.py"


def load(rev: str | None) -> ModuleType:
    src = (
        open(os.path.join(ROOT, PATH)).read()
        if rev is None
        else subprocess.run(
            ["git", "show", f"{rev}:{PATH}"], cwd=ROOT, check=True, capture_output=True, text=True
        ).stdout
    )
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(src)
    spec = importlib.util.spec_from_file_location(f"states_{rev or 'here'}", f.name)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    os.unlink(f.name)
    return mod


def admission_ms(mod: ModuleType, held: int) -> float:
    import numpy as np

    rnd = random.Random(held)

    def tokens(n: int) -> list[int]:
        return [1, 2, 3, 4] + [rnd.randrange(49152) for _ in range(n - 4)]

    def state(toks: list[int]) -> object:
        return mod.SavedState(np.asarray(toks, dtype=np.intc), len(toks), bytearray(1))

    cache = mod.StateCache(1 << 40)
    for i in range(held):  # half NPCs' own states, half prefixes of no one
        (cache.put(f"npc{i}", state(tokens(160))) if i % 2 else cache.put_prefix(state(tokens(160))))
    times = []
    for _ in range(200):
        prompt, slot = tokens(100), tokens(160)
        t = time.perf_counter()
        cache.start_of("new", prompt)
        cache.put_prefix(state(slot))
        times.append(time.perf_counter() - t)
        cache.take(next(k for k in reversed(cache._states) if isinstance(k, int)))  # as many held
    return statistics.median(times) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", metavar="REV", default="3c3fc67", help="the revision to compare with")
    args = ap.parse_args()
    here, base = load(None), load(args.baseline)
    print(f"start_of + put_prefix per admission, median of 200 (ms); baseline {args.baseline}")
    print(f"{'states held':>12}{'baseline':>10}{'this':>8}{'ratio':>8}")
    for held in (20, 160, 500):
        b, h = admission_ms(base, held), admission_ms(here, held)
        print(f"{held:>12}{b:>10.3f}{h:>8.3f}{h / b:>8.2f}")


if __name__ == "__main__":
    main()
