"""The game crashing never orphans the bridge: a game killed with SIGKILL takes
its bridge with it within a second, even when the game's end does not close the bridge's
stdin (another child of the game inherited the pipe, so no EOF ever comes)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tests.support.harness import ROOT

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals and process ids")

# The "game": starts the bridge on pipes, then a second child that inherits the write end of
# the bridge's stdin and the read end of its stdout (as a game's other subprocesses may), so
# neither pipe closes when the game dies; prints the bridge's pid and waits.
GAME = textwrap.dedent(
    """
    import subprocess, sys, time
    bridge = subprocess.Popen([sys.executable, "-m", "bridge", "--engine", "scripted", *sys.argv[1:]],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    keeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                              pass_fds=(bridge.stdin.fileno(), bridge.stdout.fileno()))
    bridge.stdin.write(b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}\\n')
    bridge.stdin.flush()
    bridge.stdout.readline()
    print(bridge.pid, keeper.pid, flush=True)
    time.sleep(60)
    """
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is gone for our purpose
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def kill_game(*bridge_args: str) -> tuple[float | None, int]:
    """Kills the game with SIGKILL; returns the seconds until its bridge was gone (None if
    it was still there after 3 s) and the bridge's pid."""
    game = subprocess.Popen([sys.executable, "-c", GAME, *bridge_args], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert game.stdout is not None
    bridge_pid, keeper_pid = map(int, game.stdout.readline().split())
    try:
        game.send_signal(signal.SIGKILL)
        game.wait()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3:
            if not alive(bridge_pid):
                return time.monotonic() - t0, bridge_pid
            time.sleep(0.01)
        return None, bridge_pid
    finally:
        for pid in (bridge_pid, keeper_pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def test_a_killed_game_takes_its_bridge_within_a_second_even_without_stdin_eof() -> None:
    gone, _ = kill_game()
    assert gone is not None and gone < 1.0, f"the bridge outlived its game: {gone}"


def test_the_parent_watch_is_what_ends_it_when_stdin_stays_open() -> None:
    # With the watch off, nothing tells the bridge: this is the orphan the watch prevents.
    gone, _ = kill_game("--parent-watch-ms", "0")
    assert gone is None, "without the watch the bridge stays (its stdin never ends)"
