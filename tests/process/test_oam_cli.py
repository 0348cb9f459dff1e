"""The ``oam`` command line, used as a person uses it: the real console script in shell
pipelines (``oam respond``) and in a real terminal (``oam chat`` in tmux: keys sent with
send-keys, the screen read with capture-pane). The scripted engine makes turns exact; one
``oam respond`` runs on the bundled model."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from bridge.core import _messages as m
from bridge.errors import EXIT_CODES
from bridge.hosts.oam import main as oam
from tests.support.harness import DEADLINE, ROOT
from tests.support.needs import missing

OAM = str(Path(sys.executable).parent / "oam")  # the console script `make setup` installs

INVENTORY = [
    {
        "name": "check_inventory",
        "description": "How many of an item the tavern has",
        "parameters": {"type": "object", "properties": {"item": {"type": "string"}}, "required": ["item"]},
    }
]
ALE_CALL = {"toolCalls": [{"id": "c1", "name": "check_inventory", "arguments": {"item": "ale"}}]}


@pytest.fixture(autouse=True)
def _console_script() -> None:
    assert os.access(OAM, os.X_OK), f"no oam console script next to {sys.executable}: run make setup"


def write(dir: Path, name: str, data: Any) -> str:
    (dir / name).write_text(json.dumps(data))
    return name


def shell(
    line: str, cwd: Path, timeout: float = DEADLINE, stdin: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``line`` run by bash as typed (``oam`` on the PATH), with pipefail: the pipeline's
    status is oam's when oam fails."""
    env = {**os.environ, "PATH": f"{Path(OAM).parent}:{os.environ['PATH']}"}
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", line],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        input=stdin,
        stdin=None if stdin is not None else subprocess.DEVNULL,
    )


# ---- oam respond in a shell pipeline ----


def test_respond_pipes_the_npcs_words_and_nothing_else(tmp_path: Path) -> None:
    write(tmp_path, "gate.json", [{"text": "Halt! Who goes there?"}])
    r = shell("oam respond --engine scripted --script gate.json 'Hello!' | tr a-z A-Z", tmp_path)
    assert r.returncode == 0, r.stderr
    assert r.stdout == "HALT! WHO GOES THERE?\n"
    assert r.stderr == ""


def test_respond_reads_the_prompt_from_stdin(tmp_path: Path) -> None:
    r = shell("echo 'Any ale left?' | oam respond --engine scripted | cat", tmp_path)
    assert (r.returncode, r.stdout) == (0, "You said: Any ale left?\n"), r.stderr


def test_respond_writes_each_word_as_it_comes_not_at_the_end(tmp_path: Path) -> None:
    write(tmp_path, "slow.json", [{"text": "one two three four five", "chunkMs": 400}])
    p = subprocess.Popen(
        [OAM, "respond", "--engine", "scripted", "--script", "slow.json", "Sing"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert p.stdout is not None
        first = os.read(p.stdout.fileno(), 1000)
        assert first.startswith(b"one"), first
        assert p.poll() is None and b"five" not in first, "the first word arrived before the turn ended"
        rest = p.stdout.read()
        assert (first + rest) == b"one two three four five\n"
        assert p.wait(DEADLINE) == 0
    finally:
        p.kill()
        p.wait()


def test_ctrl_c_cancels_the_turn_and_exits_130(tmp_path: Path) -> None:
    write(tmp_path, "slow.json", [{"text": "one two three four five six seven eight", "chunkMs": 300}])
    p = subprocess.Popen(
        [OAM, "respond", "--engine", "scripted", "--script", "slow.json", "Sing"],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    try:
        assert p.stdout is not None and p.stderr is not None
        assert os.read(p.stdout.fileno(), 1000).startswith(b"one")
        p.send_signal(signal.SIGINT)
        assert p.wait(DEADLINE) == EXIT_CODES["cancelled"] == 130
        assert b"eight" not in p.stdout.read()
        assert p.stderr.read().decode() == "oam: cancelled: turn cancelled\n"
    finally:
        p.kill()
        p.wait()


def test_a_reader_that_goes_away_ends_oam_quietly_with_141(tmp_path: Path) -> None:
    write(tmp_path, "slow.json", [{"text": "one two three four five six", "chunkMs": 100}])
    r = shell("oam respond --engine scripted --script slow.json Sing | head -c 3", tmp_path)
    assert (r.returncode, r.stdout, r.stderr) == (141, "one", "")


def test_tool_calls_are_answered_by_the_named_command(tmp_path: Path) -> None:
    write(tmp_path, "tools.json", INVENTORY)
    write(tmp_path, "ale.json", [ALE_CALL, {"text": "Three barrels."}])
    (tmp_path / "inventory.sh").write_text(
        'cat > args.json\necho "$OAM_TOOL_NAME $OAM_TOOL_CALL_ID" > env.txt\necho \'{"count": 3}\'\n'
    )
    r = shell(
        "oam respond --engine scripted --script ale.json --tools tools.json "
        "--tool-command 'sh inventory.sh' --save save.json 'Any ale?' | cat",
        tmp_path,
    )
    assert (r.returncode, r.stdout, r.stderr) == (0, "Three barrels.\n", "")
    assert json.loads((tmp_path / "args.json").read_text()) == {"item": "ale"}, (
        "the arguments as JSON on the command's stdin"
    )
    assert (tmp_path / "env.txt").read_text() == "check_inventory c1\n"
    save = msgspec.json.decode((tmp_path / "save.json").read_bytes(), type=m.Save)
    tool = [msg for msg in save.turns[0] if msg.role == "tool"]
    assert [(t.name, json.loads(t.content), t.is_error) for t in tool] == [("check_inventory", {"count": 3}, False)]


def test_a_failing_tool_command_is_an_error_the_model_sees_and_the_turn_goes_on(tmp_path: Path) -> None:
    write(tmp_path, "tools.json", INVENTORY)
    write(tmp_path, "ale.json", [ALE_CALL, {"text": "Sorry, I cannot tell."}])
    r = shell(
        "oam respond --engine scripted --script ale.json --tools tools.json "
        "--tool-command 'echo cellar locked >&2; exit 3' --save save.json 'Any ale?'",
        tmp_path,
    )
    assert (r.returncode, r.stdout) == (0, "Sorry, I cannot tell.\n"), r.stderr
    assert r.stderr == "oam: tool check_inventory: the tool command exited with status 3\n"
    save = msgspec.json.decode((tmp_path / "save.json").read_bytes(), type=m.Save)
    tool = next(msg for msg in save.turns[0] if msg.role == "tool")
    assert tool.is_error and "cellar locked" in tool.content


def test_saved_turns_go_on_in_the_next_run(tmp_path: Path) -> None:
    write(tmp_path, "gate.json", [{"text": "Halt!"}])
    first = shell("oam respond --engine scripted --script gate.json --save s.json Hello", tmp_path)
    assert first.returncode == 0, first.stderr
    again = shell("oam respond --engine scripted --load s.json --save s.json 'It is me'", tmp_path)
    assert (again.returncode, again.stdout) == (0, "You said: It is me\n"), again.stderr
    save = msgspec.json.decode((tmp_path / "s.json").read_bytes(), type=m.Save)
    assert [[msg.content for msg in t] for t in save.turns] == [["Hello", "Halt!"], ["It is me", "You said: It is me"]]


def test_schema_prints_the_json_answer_on_one_line(tmp_path: Path) -> None:
    write(tmp_path, "mood.json", {"type": "object", "properties": {"mood": {"type": "string"}}, "required": ["mood"]})
    write(tmp_path, "answer.json", [{"json": {"mood": "calm"}}])
    r = shell(
        "oam respond --engine scripted --script answer.json --schema mood.json 'How are you?' "
        "| python3 -c 'import json, sys; print(json.load(sys.stdin)[\"mood\"])'",
        tmp_path,
    )
    assert (r.returncode, r.stdout, r.stderr) == (0, "calm\n", "")


@pytest.mark.parametrize(
    ("code", "setup", "args"),
    [
        (
            "guardrail_violation",
            {"s.json": [{"error": "guardrail_violation", "message": "blocked"}]},
            ["--engine", "scripted", "--script", "s.json"],
        ),
        (
            "rate_limited",
            {"s.json": [{"error": "rate_limited", "message": "slow down"}]},
            ["--engine", "scripted", "--script", "s.json"],
        ),
        ("model_unavailable", {}, ["--engine", "openai"]),  # no --openai-url
        ("invalid_schema", {"bad.json": {"type": 5}}, ["--engine", "scripted", "--schema", "bad.json"]),
        (
            "invalid_params",
            {"tools.json": INVENTORY},
            ["--engine", "scripted", "--tools", "tools.json", "--tool-choice", "open_door"],
        ),
        (
            "generation_failed",
            {"tools.json": INVENTORY, "s.json": [{"text": "No."}]},
            ["--engine", "scripted", "--script", "s.json", "--tools", "tools.json", "--tool-choice", "required"],
        ),
    ],
)
def test_an_error_is_one_line_with_its_code_and_the_mapped_exit_status(
    tmp_path: Path, code: str, setup: dict[str, Any], args: list[str]
) -> None:
    for name, data in setup.items():
        write(tmp_path, name, data)
    r = shell(" ".join(shlex.quote(a) for a in [OAM, "respond", *args, "Hello"]) + " | cat", tmp_path)
    assert r.returncode == EXIT_CODES[code], r.stderr
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"oam: {code}: "), r.stderr
    # the words streamed before a failure stay on stdout, their line ended; the error never goes there
    assert r.stdout == ("No.\n" if code == "generation_failed" else "")


def test_a_file_on_the_command_line_that_cannot_be_used_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("[{")
    for args, says in [
        ("--tools missing.json", "--tools missing.json: cannot read it"),
        ("--persona broken.json", "--persona broken.json: not valid JSON"),
    ]:
        r = shell(f"oam respond --engine scripted {args} Hello", tmp_path)
        assert r.returncode == 2 and r.stderr.startswith(f"oam respond: {says}") and len(r.stderr.splitlines()) == 1, (
            r.stderr
        )


def test_count_tokens_prints_the_count(tmp_path: Path) -> None:
    r = shell("oam count-tokens --engine scripted 'one two three'", tmp_path)  # the scripted engine counts words
    assert (r.returncode, r.stdout) == (0, "3\n"), r.stderr
    r = shell("echo 'one two' | oam count-tokens --engine scripted --json", tmp_path)
    assert json.loads(r.stdout) == {"tokens": 2, "promptTokens": None, "contextSize": 4096}


def test_schema_checks_a_schema_as_the_bridge_does(tmp_path: Path) -> None:
    write(tmp_path, "ok.json", {"type": "object", "properties": {"open": {"type": "boolean"}}})
    write(tmp_path, "list.json", {"type": "array"})
    assert shell("oam schema ok.json", tmp_path).returncode == 0
    assert shell("oam schema list.json", tmp_path).returncode == 0, "an answer may be any JSON"
    r = shell("oam schema --tool list.json", tmp_path)
    assert r.returncode == EXIT_CODES["invalid_schema"] and r.stderr.startswith("oam: invalid_schema: "), r.stderr


@pytest.mark.model
def test_respond_on_the_bundled_model_pipes_words_only(tmp_path: Path) -> None:
    r = shell(
        "oam respond --engine llama --max-tokens 24 --temperature 0 "
        "-i 'You keep the Rusty Flagon.' 'Any ale left?' | cat",
        tmp_path,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.endswith("\n") and len(r.stdout.split()) >= 2, r.stdout
    assert "{" not in r.stdout and "llama" not in r.stdout.lower() and "ggml" not in r.stdout.lower(), (
        "llama.cpp's prints stay off stdout"
    )
    assert "Traceback" not in r.stderr


# ---- serve and replay: the rest of the command line to their modules ----


def test_serve_and_replay_hand_the_rest_of_the_command_line_to_their_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fake_host.py").write_text("seen = []\ndef main(argv):\n    seen.append(argv)\n    return 7\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(oam.DELEGATED, "serve", ("fake_host", "a fake"))
    assert oam.main(["serve", "--port", "0", "--help"]) == 7
    import fake_host  # type: ignore[import-not-found]

    assert fake_host.seen == [["--port", "0", "--help"]]


def test_a_delegated_command_whose_module_is_missing_says_so_and_exits_1(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(oam.DELEGATED, "replay", ("bridge._no_such_module", "a missing one"))
    assert oam.main(["replay", "session.jsonl"]) == 1
    assert (
        capsys.readouterr().err == "oam replay: not available: this installation has no bridge._no_such_module module\n"
    )


# ---- the README ----


@pytest.mark.model  # the README's lines use the bundled model
def test_the_readme_oam_lines_run_as_printed(tmp_path: Path) -> None:
    section = Path(ROOT, "README.md").read_text().split("## The oam command line", 1)[1]
    block = re.search(r"^```sh\n(.*?)^```$", section, re.S | re.M)
    assert block, "a ```sh block in the README's oam section"
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)  # run where .venv/bin/oam is, as from the root
    r = subprocess.run(
        ["bash", "-e", "-c", block.group(1)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout.splitlines()
    assert out[:2] == ["HALT! WHO GOES THERE?", "Three barrels left."], "what the README says the first two print"
    assert isinstance(json.loads(out[2])["open"], bool), "the bundled model's answer follows the schema"
    assert int(out[3]) > 0


def test_the_readme_exit_status_table_is_errors_exit_codes() -> None:
    section = Path(ROOT, "docs", "cli.md").read_text().split("## Exit status", 1)[1].split("\n## ", 1)[0]
    documented: dict[str, int] = {}
    for status, meaning in re.findall(r"^\| (\d+) \| (.*) \|$", section, re.M):
        for code in re.findall(r"`([a-z_]+)`", meaning):
            documented[code] = int(status)
    assert documented == EXIT_CODES


# ---- oam chat in a real terminal ----


class Terminal:
    """A tmux session on its own server socket, running one command in an 100x40 window."""

    def __init__(self, cwd: Path, command: str) -> None:
        self.socket = f"oam-test-{uuid.uuid4().hex[:8]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("TMUX")}
        # the command's exit status is shown on the screen, and the window stays to read it
        wrapped = f'{command}; echo "[exited $?]"; sleep 600'
        subprocess.run(
            [
                "tmux",
                "-L",
                self.socket,
                "new-session",
                "-d",
                "-s",
                "t",
                "-x",
                "100",
                "-y",
                "40",
                "-c",
                str(cwd),
                "bash",
                "-c",
                wrapped,
            ],
            check=True,
            env=env,
        )

    def keys(self, *keys: str) -> None:
        subprocess.run(["tmux", "-L", self.socket, "send-keys", "-t", "t", *keys], check=True)

    def type(self, text: str) -> None:
        """Types ``text`` literally, then Enter."""
        subprocess.run(["tmux", "-L", self.socket, "send-keys", "-t", "t", "-l", text], check=True)
        self.keys("Enter")

    def screen(self) -> str:
        return subprocess.run(
            ["tmux", "-L", self.socket, "capture-pane", "-p", "-J", "-S", "-200", "-t", "t"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout

    def wait_for(self, text: str, after: str = "", timeout: float = DEADLINE) -> str:
        """The screen once ``text`` shows (after the last ``after``, when given). The screen
        keeps no spaces at a line's end, so neither do ``text`` and ``after``."""
        text, after = _unpadded(text), _unpadded(after)
        deadline = time.monotonic() + timeout
        while True:
            screen = _unpadded(self.screen())
            _, seen, tail = screen.rpartition(after) if after else ("", "", screen)
            if text in tail and (seen or not after):
                return screen
            if time.monotonic() > deadline:
                pytest.fail(f"{text!r} did not show in {timeout} s; the screen:\n{screen}")
            time.sleep(0.05)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True)


def _unpadded(text: str) -> str:
    return "\n".join(line.rstrip(" ") for line in text.split("\n"))


@pytest.fixture
def terminal(tmp_path: Path) -> Iterator[Any]:
    if shutil.which("tmux") is None:
        missing("tmux is not installed (apt-get install -y tmux; .ci/run installs it)")
    opened: list[Terminal] = []

    def open_terminal(args: str) -> Terminal:
        t = Terminal(tmp_path, f"{shlex.quote(OAM)} chat {args}")
        opened.append(t)
        t.wait_for("you> ")
        return t

    yield open_terminal
    for t in opened:
        t.close()


def test_chat_streams_answers_tool_calls_at_the_prompt_and_recalls_lines(tmp_path: Path, terminal: Any) -> None:
    write(tmp_path, "bram.json", {"name": "Bram", "role": "the gate guard"})
    write(tmp_path, "tools.json", INVENTORY)
    write(
        tmp_path,
        "s.json",
        [
            {"text": "Halt! Who goes there?"},
            ALE_CALL,
            {"text": "Three barrels."},
            {"text": "one two three four five six", "chunkMs": 500},
        ],
    )
    t = terminal("--engine scripted --script s.json --persona bram.json --tools tools.json")
    t.type("Hello")
    t.wait_for("Bram: Halt! Who goes there?\nyou> ")
    t.type("Any ale?")
    t.wait_for('Bram calls check_inventory {"item": "ale"}\ncheck_inventory output (JSON, or !error)> ')
    t.type('{"count": 3}')
    t.wait_for("Bram: Three barrels.\nyou> ")
    t.type("Sing")
    screen = t.wait_for("Bram: one two", after="you> Sing")
    assert "six" not in screen.rsplit("you> Sing", 1)[1], "the words show as they come"
    t.wait_for("six\nyou> ", after="you> Sing")
    t.keys("Up")
    t.wait_for("you> Sing", after="six\n")  # the last line typed, back for editing
    t.keys("Up")
    t.wait_for("you> Any ale?", after="six\n")
    t.keys("C-u", "C-d")
    t.wait_for("[exited 0]")


def test_ctrl_c_in_chat_cancels_the_turn_not_the_program(tmp_path: Path, terminal: Any) -> None:
    write(tmp_path, "s.json", [{"text": "la " * 40, "chunkMs": 250}, {"text": "Still here."}])
    t = terminal("--engine scripted --script s.json --npc-id bard")
    t.type("Sing")
    t.wait_for("bard: la la")
    t.keys("C-c")
    t.wait_for("oam: cancelled: turn cancelled\nyou> ")
    t.type("Are you there?")
    t.wait_for("bard: Still here.\nyou> ")
    t.type("/history")
    screen = t.wait_for("you> ", after="/history\n")
    history = screen.rsplit("/history\n", 1)[1]
    assert history.startswith("you: Are you there?\nbard: Still here.\n"), "the cancelled turn rolled back"
    assert "Sing" not in history
    t.keys("C-c")  # at the prompt: the line clears, the program stays
    t.type("/quit")
    t.wait_for("[exited 0]")


def test_chat_saves_resets_and_loads_the_transcript_in_npc_transcripts_format(tmp_path: Path, terminal: Any) -> None:
    write(tmp_path, "tools.json", INVENTORY)
    write(tmp_path, "s.json", [ALE_CALL, {"text": "Three barrels."}])
    t = terminal("--engine scripted --script s.json --tools tools.json --npc-id keeper")
    t.type("Any ale?")
    t.wait_for("check_inventory output (JSON, or !error)> ")
    t.type('{"count": 3}')
    t.wait_for("keeper: Three barrels.\nyou> ")
    t.type("/save saved.json")
    t.wait_for("(saved 1 turns to saved.json)")
    save = msgspec.json.decode((tmp_path / "saved.json").read_bytes(), type=m.Save)
    assert [msg.role for msg in save.turns[0]] == ["user", "assistant", "tool", "assistant"]
    assert json.loads(save.turns[0][2].content) == {"count": 3}
    t.type("/reset")
    t.type("/history")
    t.wait_for("(no turns yet)", after="/history")
    t.type("/load saved.json")
    t.wait_for("(loaded 1 turns from saved.json)")
    t.type("/history")
    t.wait_for(
        'you: Any ale?\n  [keeper calls check_inventory {"item": "ale"}]\n'
        '  [check_inventory -> {"count":3}]\nkeeper: Three barrels.\n',
        after="/load",
    )
    t.type("/load missing.json")
    t.wait_for("oam: missing.json: cannot read it", after="/load missing.json")
    t.type("/quit")
    t.wait_for("[exited 0]")


def test_a_tool_prompt_left_unanswered_ends_at_its_timeout_and_ctrl_c_there_cancels_the_turn(
    tmp_path: Path, terminal: Any
) -> None:
    write(tmp_path, "tools.json", INVENTORY)
    wine = {"toolCalls": [{"id": "c2", "name": "check_inventory", "arguments": {"item": "wine"}}]}
    write(tmp_path, "s.json", [ALE_CALL, {"text": "Nobody answered."}, wine, {"text": "never shown"}])
    t = terminal("--engine scripted --script s.json --tools tools.json --tool-timeout-ms 1500")
    t.type("Any ale?")
    t.wait_for("check_inventory output (JSON, or !error)> ")
    t.wait_for(
        "oam: tool check_inventory: not answered in time; the model is told so\nnpc: Nobody answered.\nyou> ",
        timeout=DEADLINE,
    )
    t.type("Any wine?")
    t.wait_for("check_inventory output (JSON, or !error)> ", after="Any wine?")
    t.keys("C-c")
    t.wait_for("oam: cancelled: turn cancelled\nyou> ", after="Any wine?")
    t.type("/history")
    screen = t.wait_for("you> ", after="/history\n")
    assert "wine" not in screen.rsplit("/history\n", 1)[1], "the cancelled turn rolled back"
    t.type("/quit")
    t.wait_for("[exited 0]")


def test_respond_at_a_terminal_asks_the_person_for_a_tools_output_and_pipes_only_the_words(tmp_path: Path) -> None:
    if shutil.which("tmux") is None:
        missing("tmux is not installed (apt-get install -y tmux; .ci/run installs it)")
    write(tmp_path, "tools.json", INVENTORY)
    write(tmp_path, "s.json", [ALE_CALL, {"text": "Three barrels."}])
    t = Terminal(
        tmp_path,
        f"{shlex.quote(OAM)} respond --engine scripted --script s.json --tools tools.json 'Any ale?' | tee words.txt",
    )
    try:
        t.wait_for('npc calls check_inventory {"item": "ale"}\ncheck_inventory output (JSON, or !error)> ')
        t.type("3")
        t.wait_for("Three barrels.\n[exited 0]")
        assert (tmp_path / "words.txt").read_text() == "Three barrels.\n"
    finally:
        t.close()
