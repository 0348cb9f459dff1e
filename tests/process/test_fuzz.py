"""A short, deterministic run of the protocol fuzzer (``bench/fuzz_protocol.py``) through the
real subprocess: random and mutated JSON-RPC lines of every method, garbage bytes, huge ids,
deep nesting, invalid UTF-8, Unicode line separators and batches. The long run (1,000,000
inputs) is ``python bench/fuzz_protocol.py --inputs 1000000``.

``OAM_BRIDGE_ROOT`` names the source tree whose bridge is started (default: this repository).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

import pytest

from tests.support.harness import BRIDGE_ROOT, ROOT


def load_fuzzer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fuzz_protocol", os.path.join(ROOT, "bench", "fuzz_protocol.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it loads
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("seed", [1, 2])
def test_fuzzed_input_never_crashes_the_bridge_nor_breaks_its_output(seed: int) -> None:
    fuzz = load_fuzzer()
    report = fuzz.run(inputs=6000, seed=seed, per_process=3000, root=BRIDGE_ROOT)
    stats = report.stats
    assert stats.inputs == 6000 and stats.processes == 2
    assert stats.responses > 3000 and stats.events > 0, "the fuzz reached the bridge's handlers and turns"
    assert report.failures == [], "\n".join(report.failures[:20])
