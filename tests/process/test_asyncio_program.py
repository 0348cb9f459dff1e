"""An asyncio program uses the bridge in process: the README's asyncio example, as printed
(on the scripted engine instead of the bundled model), run by ``python`` in a process of its
own.

Failed on commit a76effb, before ``bridge.aio``: the README said nothing of asyncio, and
``Service`` under ``asyncio.run`` died at once (``AttributeError: 'RunContext' object has no
attribute 'runner'``). ``OAM_BRIDGE_ROOT=<a checkout of it>`` runs the example on that tree
(tests/support/harness.py).
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from tests.support.harness import BRIDGE_ROOT, ROOT, bridge_env


def readme_asyncio_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", Path(ROOT, "README.md").read_text(encoding="utf-8"), re.S)
    (example,) = [b for b in blocks if "asyncio.run(" in b]
    return example


def test_the_readmes_asyncio_example_runs_under_asyncio_run(tmp_path: Path) -> None:
    example = readme_asyncio_example()
    assert 'EngineRegistry(default="llama")' in example
    script = tmp_path / "tavern.py"
    script.write_text(example.replace('default="llama"', 'default="scripted"'), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-X", "dev", str(script)],
        cwd=tmp_path,
        env=bridge_env({"PYTHONPATH": BRIDGE_ROOT}),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout == "You said: Any ale left?"
    assert "Traceback" not in done.stderr and "never awaited" not in done.stderr, done.stderr[-2000:]
