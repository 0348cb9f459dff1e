"""NativeEngine (Swift libOamNative via cffi) with the scripted backend."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path
from typing import Any

import pytest
import trio

from bridge.engines.base import GenerationOptions, Message, StepDone, StepRequest, TextChunk, ToolCallsChunk, ToolSpec
from bridge.errors import BridgeError

NATIVE = Path(__file__).resolve().parents[2] / "native"


def _swift() -> str | None:
    return shutil.which("swift") or (
        "/opt/swift/usr/bin/swift" if Path("/opt/swift/usr/bin/swift").exists() else None
    )


@pytest.fixture(scope="session", autouse=True)
def built_library():
    if os.environ.get("OAM_NATIVE_LIB"):
        return
    swift = _swift()
    if swift is None:
        if os.environ.get("CI") == "true":
            pytest.fail("CI=true but no swift toolchain found; libOamNative cannot be built")
        pytest.skip("no swift toolchain (install Swift 6.x or set OAM_NATIVE_LIB)")
    r = subprocess.run(
        [swift, "build", "-c", "release", "--package-path", str(NATIVE)], capture_output=True, text=True, timeout=900
    )
    assert r.returncode == 0, r.stdout + r.stderr


from bridge.engines import native  # noqa: E402


def req(text: str = "hi", mode: str = "allowed", tools: list[ToolSpec] | None = None, npc: str = "npc") -> StepRequest:
    return StepRequest(
        npc_id=npc,
        instructions="You are a guard.",
        messages=[Message("user", text)],
        tools=tools if tools is not None else [ToolSpec("open_gate")],
        tool_mode=mode,  # type: ignore[arg-type]
        schema=None,
        options=GenerationOptions(),
        step_index=0,
    )


async def collect(engine, request):
    return [c async for c in engine.stream_step(request)]


def test_header_is_the_cdef_source_and_the_packaged_copy_matches_it():
    cdef = native.read_cdef()
    assert "oam_step_pull" in cdef and "oam_batch" in cdef and "#" not in cdef and 'extern "C"' not in cdef
    from bridge.engines import _native_cdef

    assert _native_cdef.CDEF == cdef, (
        "bridge/engines/_native_cdef.py differs from native/include/oam_native.h: run python -m bridge.engines.native"
    )
    assert native.CDEF_MODULE.read_text() == native.cdef_module_text(cdef)
    ffi, lib = native.load()
    assert lib.oam_abi_version() == native.ABI_VERSION == 2
    assert (lib.OAM_EVENT_TEXT, lib.OAM_EVENT_TOOL_CALLS, lib.OAM_EVENT_DONE, lib.OAM_EVENT_ERROR) == (1, 2, 3, 4)


def pull_all(ffi, lib, step, timeout_ms=1000):
    """Raw-ABI helper: [(kind, payload str)] of every event, then the final rc (-1)."""
    out = ffi.new("oam_batch **")
    events = []
    while (rc := lib.oam_step_pull(step, timeout_ms, out)) == 1:
        b = out[0]
        data = ffi.unpack(b.data, b.size)
        ends = ffi.unpack(b.ends, b.count)
        char_ends = ffi.unpack(b.char_ends, b.count)
        kinds = ffi.unpack(b.kinds, b.count)
        assert b.count >= 1 and ends[-1] == b.size and char_ends[-1] == b.chars
        assert b.text_count == sum(k == 1 for k in kinds)
        text = data.decode()
        s = cs = 0
        for k, e, ce in zip(kinds, ends, char_ends):
            assert data[s:e].decode() == text[cs:ce]  # byte and code-point offsets agree
            events.append((k, data[s:e].decode()))
            s, cs = e, ce
    assert out[0].count == 0
    return events, rc


def test_availability_and_info():
    ok, reason = native.availability()
    assert ok, reason
    e = native.NativeEngine()
    info = e.info()
    assert info.name == "native" and info.available and info.context_size == 4096
    assert e.count_tokens("abc", [Message("user", "hello")], []) > 0


@pytest.mark.trio
async def test_stream_text_word_by_word():
    e = native.NativeEngine(script=[{"text": "Halt, who goes there?"}])
    chunks = await collect(e, req())
    texts = [c.delta for c in chunks if isinstance(c, TextChunk)]
    assert texts == ["Halt, ", "who ", "goes ", "there?"]  # the Python scripted engine's chunks
    assert isinstance(chunks[-1], StepDone) and chunks[-1].finish_reason == "stop"
    assert chunks[-1].usage.input_tokens > 0 and chunks[-1].usage.output_tokens == 4
    # script exhausted: echo
    chunks = await collect(e, req("open up"))
    assert "".join(c.delta for c in chunks if isinstance(c, TextChunk)) == "You said: open up"
    await e.aclose()


@pytest.mark.trio
@pytest.mark.parametrize("extra", [{}, {"delayMs": 1}])
async def test_long_step_matches_python_chunking(extra):
    from bridge.engines.scripted import ScriptedEngine

    text = " lead " + "".join(f"wörd{i}\u3000 " if i % 7 == 0 else f"w{i} " for i in range(10_000)) + "end"
    e = native.NativeEngine(script=[{"text": text, **extra}])
    got = [c.delta for c in await collect(e, req()) if isinstance(c, TextChunk)]
    want = [c.delta for c in await collect(ScriptedEngine(script=[{"text": text}]), req()) if isinstance(c, TextChunk)]
    assert got == want and len(got) == 10_003  # crosses the 4096-delta push slices
    await e.aclose()


@pytest.mark.trio
async def test_tool_call_step_and_json():
    e = native.NativeEngine(
        script=[{"toolCalls": [{"name": "open_gate", "arguments": {"force": True, "n": 2}}]}, {"json": {"mood": "calm"}}]
    )
    chunks = await collect(e, req())
    assert isinstance(chunks[0], ToolCallsChunk)
    call = chunks[0].calls[0]
    assert call.name == "open_gate" and call.arguments == {"force": True, "n": 2} and call.id
    assert isinstance(chunks[1], StepDone) and chunks[1].finish_reason == "tool_calls"
    chunks = await collect(e, req())
    assert chunks[0] == TextChunk('{"mood":"calm"}')


@pytest.mark.trio
@pytest.mark.parametrize(
    "code", ["guardrail_violation", "refusal", "context_size_exceeded", "rate_limited", "model_unavailable"]
)
async def test_error_codes(code):
    e = native.NativeEngine(script=[{"error": code, "message": "nope"}])
    with pytest.raises(BridgeError) as ei:
        await collect(e, req())
    assert ei.value.code == code and ei.value.message == "nope"


@pytest.mark.trio
async def test_tool_calls_on_a_disallowed_step_are_reported_as_made():
    # The engine says what the model did; the agent decides (it ignores such calls with a
    # warning). The request's tools go to the library as given.
    e = native.NativeEngine(script=[{"toolCalls": [{"name": "x"}]}])
    chunks = await collect(e, req(mode="disallowed", tools=[]))
    assert isinstance(chunks[0], ToolCallsChunk) and chunks[0].calls[0].name == "x"
    assert isinstance(chunks[-1], StepDone) and chunks[-1].finish_reason == "tool_calls"
    import json

    shown = json.loads(native._request_json(req(mode="disallowed", tools=[ToolSpec("open_gate")])))
    assert [t["name"] for t in shown["tools"]] == ["open_gate"] and shown["toolMode"] == "disallowed"


def test_an_unknown_backend_is_refused():
    with pytest.raises(BridgeError) as ei:
        native.NativeEngine(backend="nope")
    assert ei.value.code == "invalid_request"


@pytest.mark.trio
async def test_cancel_mid_step():
    # How fast a cancel reaches the step is measured in bench/bench_native.py.
    e = native.NativeEngine(script=[{"text": "one two three four five six seven eight", "chunkMs": 200}])
    got: list[str] = []
    with trio.fail_after(30):
        with trio.CancelScope() as scope:
            async for c in e.stream_step(req()):
                if isinstance(c, TextChunk):
                    got.append(c.delta)
                    scope.cancel()  # cancelled while the step is waiting in its next pull
    assert scope.cancelled_caught and got == ["one "]
    # the engine is still usable; the script is exhausted, so the next step echoes
    chunks = await collect(e, req("again"))
    assert "".join(c.delta for c in chunks if isinstance(c, TextChunk)) == "You said: again"


def test_native_cancel_wakes_blocked_pull():
    ffi, lib = native.load()
    eng = lib.oam_engine_create(b'{"script":[{"text":"slow","delayMs":5000}]}', ffi.NULL)
    step = lib.oam_step_start(eng, b'{"messages":[]}', ffi.NULL)
    out = ffi.new("oam_batch **")
    assert lib.oam_step_pull(step, 0, out) == 0 and out[0].count == 0  # never waits
    threading.Timer(0.1, lib.oam_step_cancel, (step,)).start()
    assert lib.oam_step_pull(step, -1, out) == 1  # woken by the cancel: the script would say "slow"
    b = out[0]
    assert b.count == 1 and b.text_count == 0 and ffi.unpack(b.kinds, 1) == [lib.OAM_EVENT_ERROR]
    ev = ffi.unpack(b.data, b.size).decode()
    assert '"cancelled"' in ev
    assert lib.oam_step_pull(step, 10, out) == -1 and out[0].count == 0
    lib.oam_engine_destroy(eng)  # engine destroyed before the step: still safe
    lib.oam_step_free(step)


def test_raw_batch_layout_unicode_and_json_events():
    ffi, lib = native.load()
    script = '[{"text":"héllo wörld 😀 ok\u00a0x"},{"toolCalls":[{"name":"n","arguments":{"a":"é"}}],"text":"pre amble"}]'
    eng = lib.oam_engine_create(('{"script":%s}' % script).encode(), ffi.NULL)
    step = lib.oam_step_start(eng, b'{"messages":[]}', ffi.NULL)
    events, rc = pull_all(ffi, lib, step)
    assert rc == -1
    assert events[:-1] == [(1, "héllo "), (1, "wörld "), (1, "😀 "), (1, "ok\u00a0"), (1, "x")]
    assert events[-1][0] == 3 and '"finishReason":"stop"' in events[-1][1]
    lib.oam_step_free(step)
    step = lib.oam_step_start(eng, b'{"messages":[]}', ffi.NULL)
    events, rc = pull_all(ffi, lib, step)
    assert [k for k, _ in events] == [1, 1, 2, 3] and events[1][1] == "amble"
    assert '"arguments":{"a":"é"}' in events[2][1]
    lib.oam_step_free(step)
    lib.oam_engine_destroy(eng)


def test_pull_null_and_batch_survives_cancel():
    ffi, lib = native.load()
    out = ffi.new("oam_batch **")
    assert lib.oam_step_pull(ffi.NULL, 0, out) == -1 and out[0] == ffi.NULL
    eng = lib.oam_engine_create(b'{"script":[{"text":"a b c d","chunkMs":20}]}', ffi.NULL)
    step = lib.oam_step_start(eng, b'{"messages":[]}', ffi.NULL)
    assert lib.oam_step_pull(step, 1000, out) == 1
    b = out[0]
    first = ffi.unpack(b.data, b.size)
    lib.oam_step_cancel(step)  # the delivered batch stays valid until the next pull
    assert ffi.unpack(b.data, b.size) == first == b"a "
    events, rc = pull_all(ffi, lib, step)
    assert rc == -1 and events[-1][0] == 4 and '"cancelled"' in events[-1][1]
    lib.oam_step_free(step)
    lib.oam_engine_destroy(eng)


@pytest.mark.trio
async def test_many_concurrent_steps():
    engines = [native.NativeEngine(script=[{"text": f"npc {i} says hello there", "chunkMs": 5}]) for i in range(16)]
    results: dict[tuple[int, int], str] = {}

    async def run(i: int, j: int) -> None:
        chunks = await collect(engines[i], req(f"{i}-{j}", npc=f"npc{j}"))  # 4 NPCs on each engine
        results[(i, j)] = "".join(c.delta for c in chunks if isinstance(c, TextChunk))

    async with trio.open_nursery() as n:
        for i in range(16):
            for j in range(4):
                n.start_soon(run, i, j)
    assert len(results) == 64
    for i in range(16):
        texts = sorted(results[(i, j)] for j in range(4))
        assert f"npc {i} says hello there" in texts  # exactly one step got the script
        assert sum(t.startswith("You said:") for t in texts) == 3


@pytest.mark.trio
async def test_two_npcs_step_together_and_one_npcs_second_step_is_busy():
    """One step per NPC, NPCs together (PlanStepGate, the Apple backend's rule: issue 34 found
    NPC b's turn failing busy while NPC a spoke); the NPC's next step starts as soon as the
    host has seen its previous one end (the gate opens before the terminal event is pulled)."""
    e = native.NativeEngine(script=[{"text": "a long line " * 10, "chunkMs": 20}, {"text": "b line", "delayMs": 50}])
    got: dict[str, Any] = {}

    async def run(key: str, npc: str, delay: float) -> None:
        await trio.sleep(delay)
        try:
            got[key] = "".join(c.delta for c in await collect(e, req(npc=npc)) if isinstance(c, TextChunk))
        except BridgeError as err:
            got[key] = err.code

    async with trio.open_nursery() as n:
        n.start_soon(run, "a", "alice", 0)
        n.start_soon(run, "b", "bob", 0.05)
        n.start_soon(run, "a again", "alice", 0.1)
    assert got["a"].startswith("a long line") and got["b"] == "b line"
    assert got["a again"] == "busy", "a second step of the same NPC while its first runs"
    for i in range(20):  # back to back: never busy
        assert "".join(c.delta for c in await collect(e, req(f"{i}", npc="alice")) if isinstance(c, TextChunk))


@pytest.mark.trio
async def test_eight_npcs_sent_at_once_all_complete_on_one_engine():
    """Issue 34's done-when: 8 NPCs' steps at once on one engine (one library handle, the
    Apple backend's rule: one step per NPC), each streamed in timed chunks, all answer."""
    e = native.NativeEngine(script=[{"text": f"npc says line {i} slowly", "chunkMs": 10} for i in range(8)])
    got: dict[int, str] = {}

    async def run(i: int) -> None:
        got[i] = "".join(c.delta for c in await collect(e, req(f"{i}", npc=f"npc{i}")) if isinstance(c, TextChunk))

    async with trio.open_nursery() as n:
        for i in range(8):
            n.start_soon(run, i)
    assert sorted(got.values()) == sorted(f"npc says line {i} slowly" for i in range(8))


@pytest.mark.trio
async def test_an_error_steps_figures_cross_the_c_abi_as_data():
    """The library's error event carries ``data`` (Apple's rate limit reset, context sizes on
    macOS 27): the figures reach the BridgeError, and nothing else does."""
    e = native.NativeEngine(
        script=[
            {"error": "rate_limited", "message": "slow", "data": {"retryAfterMs": 1500, "other": 3}},
            {"error": "context_size_exceeded", "data": {"promptTokens": 5000, "contextSize": 4096}},
        ]
    )
    with pytest.raises(BridgeError) as first:
        await collect(e, req())
    assert (first.value.code, first.value.data) == ("rate_limited", {"retryAfterMs": 1500})
    with pytest.raises(BridgeError) as second:
        await collect(e, req())
    assert second.value.data == {"promptTokens": 5000, "contextSize": 4096}


@pytest.mark.trio
async def test_count_tokens_from_threads_while_steps_stream():
    # blocking_count: the agent counts in worker threads, beside running steps.
    e = native.NativeEngine(script=[{"text": "la " * 200, "chunkMs": 1}])
    assert e.blocking_count is True
    prompts = [[Message("user", "x" * (40 * i))] for i in range(1, 9)]
    expected = [e.count_tokens("", p, []) for p in prompts]
    e._counts.clear()
    counts: list[int] = []

    async def count(p: list[Message]) -> None:
        counts.append(await trio.to_thread.run_sync(e.count_tokens, "", p, []))

    with trio.fail_after(30):
        async with trio.open_nursery() as n:
            n.start_soon(collect, e, req())
            for p in prompts:
                n.start_soon(count, p)
    assert sorted(counts) == expected == sorted(set(expected))
    await e.aclose()
    with pytest.raises(BridgeError) as ei:
        e.count_tokens("", prompts[0], [])
    assert ei.value.code == "model_unavailable"


def test_many_os_threads_raw_abi():
    ffi, lib = native.load()
    errors: list[str] = []

    def worker(k: int) -> None:
        try:
            for _ in range(50):
                eng = lib.oam_engine_create(b'{"script":[{"text":"a b c"}]}', ffi.NULL)
                step = lib.oam_step_start(eng, b'{"messages":[{"role":"user","content":"x"}]}', ffi.NULL)
                events, rc = pull_all(ffi, lib, step)
                assert rc == -1 and [k for k, _ in events] == [1, 1, 1, 3], (rc, events)
                lib.oam_step_free(step)
                lib.oam_engine_destroy(eng)
        except Exception as e:  # pragma: no cover
            errors.append(repr(e))

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def _rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


@pytest.mark.trio
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="needs /proc")
async def test_no_leak_over_2000_cycles():
    async def cycle() -> None:
        e = native.NativeEngine(script=[{"text": "hello there friend"}])
        await collect(e, req())
        await e.aclose()

    for _ in range(200):  # warm up allocator and thread caches
        await cycle()
    before = _rss_kb()
    for _ in range(2000):
        await cycle()
    grown = _rss_kb() - before
    print(f"RSS growth over 2000 cycles: {grown} KiB")
    assert grown < 4096, grown


@pytest.mark.trio
@pytest.mark.skipif(os.environ.get("OAM_LIVE_TESTS") != "1", reason="live Apple model test: set OAM_LIVE_TESTS=1 on a Mac")
async def test_live_apple_backend():
    e = native.NativeEngine(backend="apple")
    if not e.info().available:
        pytest.skip(f"Apple model unavailable: {e.info().reason}")
    chunks = await collect(e, req("Say hello in one word.", mode="disallowed", tools=[]))
    assert isinstance(chunks[-1], StepDone)
    assert "".join(c.delta for c in chunks if isinstance(c, TextChunk)).strip()


def test_schema_property_order_crosses_the_abi_as_x_order():
    # The library's JSON objects are unordered; the order the model generates in must not be.
    import json

    from bridge.engines.base import GenerationOptions, Message, StepRequest, ToolSpec
    from bridge.engines.native import _request_json

    schema = {"type": "object", "properties": {"reasoning": {"type": "string"}, "choice": {"type": "object", "properties": {"z": {}, "a": {}}}}}
    tool = ToolSpec("t", "", {"type": "object", "properties": {"b": {}, "a": {}}})
    req = StepRequest("n", "", [Message("user", "x")], [tool], "allowed", schema, GenerationOptions(), 0)
    out = json.loads(_request_json(req))
    assert out["schema"]["x-order"] == ["reasoning", "choice"]
    assert out["schema"]["properties"]["choice"]["x-order"] == ["z", "a"]
    assert out["tools"][0]["parameters"]["x-order"] == ["b", "a"]
    assert "x-order" not in schema, "the caller's schema is not modified"


def test_every_bridge_package_and_the_generated_cdef_ship_in_the_wheel():
    # A non-editable install has no source tree: every package must be listed for
    # setuptools, and the cdef must be a module of the package (not read from native/).
    import tomllib

    root = Path(__file__).resolve().parents[2]
    listed = set(tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(root).parts) for p in (root / "bridge").rglob("__init__.py")}
    assert found == listed, f"packages missing from pyproject.toml: {found - listed}, listed but absent: {listed - found}"
    assert (root / "bridge" / "engines" / "_native_cdef.py").is_file()


@pytest.mark.trio
async def test_a_line_another_npc_said_crosses_the_abi_as_name_colon_line():
    # The library's messages have no speaker: the content carries it, as every engine reads it.
    import json

    from bridge.engines.native import _request_json

    e = native.NativeEngine()  # no script: the step echoes the last user line
    r = StepRequest("npc", "You are a guard.", [Message("user", "Evening."), Message("assistant", "Halt."),
                                                Message("user", "Open up, friend.", name="Brom")],
                    [], "disallowed", None, GenerationOptions(), 0)
    chunks = await collect(e, r)
    assert "".join(c.delta for c in chunks if isinstance(c, TextChunk)) == "You said: Brom: Open up, friend."
    sent = json.loads(_request_json(r))["messages"]
    assert sent[0] == {"role": "user", "content": "Evening."}
    assert sent[2] == {"role": "user", "content": "Brom: Open up, friend."}, "no name field: the ABI's shape is unchanged"
    named = e.count_tokens("x", [Message("user", "Open up, friend.", name="Brom Ironfoot")], [])
    assert named > e.count_tokens("x", [Message("user", "Open up, friend.")], [])
    await e.aclose()


def history_request(npc: str = "npc", messages: list[Message] | None = None) -> StepRequest:
    """What the agent sends for npc/prewarm: the history, no new line, schema None."""
    return StepRequest(npc, "You are a guard.", messages or [], [ToolSpec("open_gate")], "allowed", None,
                       GenerationOptions(), 0)


@pytest.mark.trio
async def test_a_prewarm_generates_nothing_and_consumes_no_script_step():
    import json

    from bridge.engines.native import _request_json

    assert json.loads(_request_json(history_request(), prewarm=True))["prewarm"] is True
    assert "prewarm" not in json.loads(_request_json(history_request()))
    e = native.NativeEngine(script=[{"text": "first"}, {"text": "second"}])
    with trio.fail_after(10):
        usage = await e.prewarm(history_request())
        assert usage.input_tokens > 0 and (usage.output_tokens, usage.cached_tokens) == (0, 0)
        assert "".join(c.delta for c in await collect(e, req()) if isinstance(c, TextChunk)) == "first"
        # a history that ends with the NPC's own line, as after a turn
        await e.prewarm(history_request(messages=[Message("user", "hi"), Message("assistant", "first")]))
        assert "".join(c.delta for c in await collect(e, req()) if isinstance(c, TextChunk)) == "second"
        # an NPC with its own script is prewarmed on its own model, which keeps its script too
        e.set_script("scripted-npc", [{"text": "mine"}])
        await e.prewarm(history_request("scripted-npc"))
        mine = StepRequest("scripted-npc", "", [Message("user", "hi")], [], "disallowed", None, GenerationOptions(), 0)
        assert "".join(c.delta for c in await collect(e, mine) if isinstance(c, TextChunk)) == "mine"
    await e.aclose()
    with pytest.raises(BridgeError) as err:
        await e.prewarm(history_request())
    assert err.value.code == "model_unavailable"


@pytest.mark.trio
async def test_a_prewarm_with_the_next_lines_lead_in_prepares_it_too():
    """npc/prewarm's speaker / promptPrefix reach the library as the request's promptPrefix
    (the Apple backend's prewarm(promptPrefix:)); the scripted backend counts it in what the
    prewarm prepared, and refuses one that is not a string."""
    import json

    import msgspec

    from bridge.engines.native import _request_json

    led = msgspec.structs.replace(history_request(), prompt_prefix="Bram: ")
    assert json.loads(_request_json(led, prewarm=True))["promptPrefix"] == "Bram: "
    assert "promptPrefix" not in json.loads(_request_json(history_request(), prewarm=True))
    assert "promptPrefix" not in json.loads(_request_json(led)), "a step's prompt is its line"
    e = native.NativeEngine()
    with trio.fail_after(10):
        plain = await e.prewarm(history_request())
        more = await e.prewarm(led)
    assert more.input_tokens > plain.input_tokens > 0
    body = json.loads(_request_json(history_request(), prewarm=True))
    body["promptPrefix"] = 5
    err = e._ffi.new("char **")
    assert e._lib.oam_step_start(e._h, json.dumps(body).encode(), err) == e._ffi.NULL
    assert json.loads(e._ffi.string(err[0]))["code"] == "invalid_request"
    e._lib.oam_string_free(err[0])
    await e.aclose()


def test_an_apple_adapter_file_is_the_native_engines_model(tmp_path, monkeypatch):
    """npc/create's model on the native engine: an adapter file, one engine per file (the
    library's config "adapter"); a missing one is model_unavailable naming the file as given."""
    from bridge.engines import EngineRegistry

    monkeypatch.chdir(tmp_path)
    reg = EngineRegistry()
    with pytest.raises(BridgeError) as e:
        reg.get("native", "missing.fmadapter")
    assert e.value.code == "model_unavailable" and e.value.data["model"] == "missing.fmadapter"
    assert str(tmp_path / "missing.fmadapter") in e.value.message and "adapter" in e.value.message
    (tmp_path / "guard.fmadapter").mkdir()  # Apple's adapters are packages (folders)
    eng = reg.get("native", "guard.fmadapter")
    assert isinstance(eng, native.NativeEngine)
    assert eng is reg.get("native", str(tmp_path / "guard.fmadapter")), "one engine per file"
    assert eng is not reg.get("native"), "the system model's engine is another"
    assert eng._info["adapter"] == os.path.abspath(tmp_path / "guard.fmadapter")
    (tmp_path / "link.fmadapter").symlink_to(tmp_path / "guard.fmadapter")
    assert reg.get("native", "link.fmadapter") is eng, "a link to the same file is the same engine"
    assert reg.get("native")._info["adapter"] is None


def test_the_library_refuses_an_adapter_that_is_not_there():
    with pytest.raises(BridgeError) as e:
        native.NativeEngine(adapter="/nonexistent/guard.fmadapter")
    assert e.value.code == "model_unavailable" and "/nonexistent/guard.fmadapter" in e.value.message


def test_a_decision_schema_crosses_the_abi_with_each_alternatives_order():
    import json

    from bridge.engines.native import _request_json

    schema = {"anyOf": [
        {"type": "object", "properties": {"reasoning": {"type": "string"}, "choice": {"enum": ["let_in", "question"]}},
         "required": ["reasoning", "choice"]},
        {"type": "object", "properties": {"reasoning": {"type": "string"}, "choice": {"const": "call_help"},
                                          "arguments": {"type": "object", "properties": {"urgency": {"enum": ["low", "high"]}}}},
         "required": ["reasoning", "choice", "arguments"]},
    ]}
    r = StepRequest("n", "", [Message("user", "x")], [], "disallowed", schema, GenerationOptions(), 0)
    sent = json.loads(_request_json(r))["schema"]["anyOf"]
    assert [m["x-order"] for m in sent] == [["reasoning", "choice"], ["reasoning", "choice", "arguments"]]


def test_native_stream_reaches_the_library_from_the_command_line():
    """``--native-stream`` (``OAM_NATIVE_STREAM``) is the library's ``stream`` config; the
    scripted backend ignores it, Apple's backend streams untooled steps unless ``never``."""
    import argparse

    from bridge.hosts._common import add_engine_arguments, build_registry

    ap = argparse.ArgumentParser()
    add_engine_arguments(ap)
    for argv, want in (([], "untooled"), (["--native-stream", "never"], "never")):
        registry = build_registry(ap.parse_args(["--engine", "scripted", *argv]))
        engine = registry.get("native")
        assert engine._config["stream"] == want
    with pytest.raises(SystemExit):
        ap.parse_args(["--native-stream", "sometimes"])


def test_the_languages_the_model_speaks_reach_engine_info():
    """Apple's backend lists ``supportedLanguages`` (BCP 47); the scripted one says what its
    config names, else nothing (null: not known)."""
    assert native.NativeEngine(languages=["en", "de"]).info().languages == ["en", "de"]
    assert native.NativeEngine().info().languages is None
    with pytest.raises(BridgeError) as e:
        native.NativeEngine(languages="en")
    assert e.value.code == "invalid_request"


@pytest.mark.trio
async def test_npc_create_takes_an_adapter_on_the_native_engine_only(tmp_path):
    """Through the real bridge: npc/create's ``model`` on the native engine is an adapter file;
    NPCs on one file share its engine, a missing file is model_unavailable with data.model, and
    the scripted engine refuses ``model`` by name."""
    from tests.support.harness import RpcError, initialized_bridge

    adapter = tmp_path / "guard.fmadapter"
    adapter.mkdir()
    async with initialized_bridge() as p:
        for npc in ("a", "b"):
            await p.call("npc/create", {"npcId": npc, "engine": "native", "model": str(adapter)})
            _, done = await p.turn(npc, "hi")
            assert done["params"]["text"] == "You said: hi"
        with pytest.raises(RpcError) as e:
            await p.call("npc/create", {"npcId": "c", "engine": "native", "model": str(tmp_path / "gone.fmadapter")})
        assert e.value.code == "model_unavailable" and e.value.data["model"] == str(tmp_path / "gone.fmadapter")
        with pytest.raises(RpcError) as e:
            await p.call("npc/create", {"npcId": "d", "engine": "scripted", "model": str(adapter)})
        assert e.value.code == "invalid_params" and "llama and native" in str(e.value)
