"""What the tests share besides fixtures: the harness that starts and speaks to a bridge
(``harness``), the requirement rules behind the ``model`` and ``native`` markers (``needs``),
process measurements from ``/proc`` (``procfs``), the agent's fake event sink (``agent``) and
the frozen build's helpers (``dist``). Fixtures live in the ``conftest.py`` of the folder that
uses them."""
