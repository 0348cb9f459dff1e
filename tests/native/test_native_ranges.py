"""Numbers that would trap in Swift's Int(Double) (and so take the host process down) or that
Apple's model does not take are refused before the library is called, with the library's own
codes, and the engine keeps serving."""

from __future__ import annotations

from typing import Any

import pytest

from bridge.engines.base import GenerationOptions, Message, StepDone, StepRequest, TextChunk, ToolSpec
from bridge.engines import native
from bridge.errors import BridgeError


def req(schema: Any = None, tools: list[ToolSpec] | None = None, options: GenerationOptions | None = None) -> StepRequest:
    return StepRequest(
        npc_id="npc",
        instructions="You are a guard.",
        messages=[Message("user", "hi")],
        tools=tools or [],
        tool_mode="allowed",
        schema=schema,
        options=options or GenerationOptions(),
        step_index=0,
    )


async def run(e: native.NativeEngine, r: StepRequest) -> list[Any]:
    return [c async for c in e.stream_step(r)]


BAD_SCHEMAS = [
    {"type": "array", "items": {"type": "string"}, "minItems": 1e30},
    {"type": "object", "properties": {"xs": {"type": "array", "items": {"type": "string"}, "maxItems": 1e30}}},
    {"type": "object", "properties": {"n": {"type": "integer", "exclusiveMinimum": 1e300}}},
    {"type": "object", "properties": {"n": {"type": "integer", "exclusiveMaximum": -1e300}}},
    {"type": "object", "$defs": {"N": {"type": "integer", "maximum": 1e16}}, "properties": {"n": {"$ref": "#/$defs/N"}}},
]


@pytest.mark.trio
@pytest.mark.parametrize("schema", BAD_SCHEMAS)
async def test_out_of_range_schema_numbers_are_refused_as_invalid_schema(schema: Any) -> None:
    e = native.NativeEngine(script=[{"text": "fine"}, {"text": "fine"}])
    with pytest.raises(BridgeError) as ei:
        await run(e, req(schema=schema))
    assert ei.value.code == "invalid_schema" and "out of range" in ei.value.message
    with pytest.raises(BridgeError) as ei:
        await run(e, req(tools=[ToolSpec("count_coins", "", {"type": "object", "properties": {"coins": schema}})]))
    assert ei.value.code == "invalid_schema"
    # Refused before the call: the script step was not consumed, and the engine still serves.
    chunks = await run(e, req())
    assert "".join(c.delta for c in chunks if isinstance(c, TextChunk)) == "fine"
    assert isinstance(chunks[-1], StepDone)


@pytest.mark.trio
async def test_a_temperature_above_apples_range_is_refused_as_invalid_params() -> None:
    e = native.NativeEngine(script=[{"text": "fine"}])
    with pytest.raises(BridgeError) as ei:
        await run(e, req(options=GenerationOptions(temperature=1.5)))
    assert ei.value.code == "invalid_params" and "temperature" in ei.value.message
    chunks = await run(e, req(options=GenerationOptions(temperature=1.0, max_tokens=1_000_000)))
    assert isinstance(chunks[-1], StepDone)


def test_in_range_numbers_pass() -> None:
    native.check_schema_numbers(
        {"type": "object", "properties": {
            "n": {"type": "integer", "minimum": -9e15, "exclusiveMaximum": 9e15},
            "xs": {"type": "array", "items": {"type": "number", "maximum": 1e300}, "maxItems": 2**31 - 1},
        }}
    )
