"""The steering rules, once for every engine: which tools a step shows and in which mode,
what becomes of the calls the model made, and when a turn's answer is acceptable.

The rules are plain functions with no I/O and no checkpoints: they read the turn's
parameters and its ``TurnProgress`` (everything a turn carries from one step to the next)
and update that progress, or raise ``BridgeError``. The NPC runs them around each step.

The engine contract (every engine gets the same treatment, whatever it produced):

- tool calls on a step whose mode is ``disallowed`` are ignored with a warning in
  ``turn/completed``, and the turn completes with the step's text;
- a ``required`` (or named) step answered without a tool call fails the turn with
  ``generation_failed`` (retryable);
- a call to a tool not shown on that step gets an error output the model sees, and the turn
  goes on;
- a structured answer that is not valid JSON fails with ``generation_failed``, saying so when
  the step was cut off by ``maxTokens`` (finish reason ``length``);
- engines never re-filter: they get the tools and the mode to use;
- a step may make at most the turn's remaining ``maxToolCalls`` calls (``StepRequest.max_calls``:
  the llama grammar holds a batch to it); calls past it on an engine that made them anyway
  get an error output;
- on the player's line (a turn's first step) an argument the line names is the call's value
  (``_arguments``: held by the grammar where an engine has one, replaced with a warning after
  the step on every engine).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Container, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import msgspec

from bridge.core import _messages as m
from bridge.core._world import RECALL, RESPOND_DIRECTLY, RESPOND_DIRECTLY_TOOL, View
from bridge.core.agent._arguments import enum_pins, pin_calls
from bridge.core.agent._schema import first_error, make_validator, reorder_to_schema
from bridge.engines.base import Message, ToolCall, ToolMode, ToolSpec, Usage
from bridge.errors import BridgeError

log = logging.getLogger("oam_bridge.agent")

# Step failures a turn's ``guardrail`` policy may turn into a fallback line or a retry.
GUARDRAIL_CODES = frozenset({"guardrail_violation", "refusal"})

# After a step: its text is the answer, the model chose to answer in words (another step),
# or its calls make a tool round.
StepOutcome = Literal["answer", "direct", "calls"]
GuardrailAction = Literal["raise", "retry", "fallback"]


@dataclass(slots=True)
class TurnProgress:
    """Where a turn is between its steps. Nothing here is in the history until the turn
    commits ``working`` (rollback is dropping this object)."""

    working: list[Message]  # the turn's own messages so far: its line, then each tool round
    working_tokens: int = 0
    schema: dict[str, Any] | None = None  # the structured answer's, until a retry as text
    step: int = 0  # steps run; the next step's index
    rounds: int = 0  # tool rounds run
    calls_made: int = 0
    direct: bool = False  # the model chose respond_directly, or a retry as text: words only
    retried: bool = False  # the guardrail policy's one retry is spent
    announced_drop: int = 0  # dropped turns the game was last told of (turn/contextTrimmed)
    records: list[m.ToolRecord] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    warnings: list[str] = field(default_factory=list)
    routing: m.RoutingInfo | None = None  # how the first step chose its tool (_routing.py)
    lead: str | None = None  # the lore sentence the line opens with (_routing.lore_lead)
    weak: bool = False  # the turn's policy is semantic: its model chooses (and fills arguments) badly
    meant: dict[str, dict[str, str]] = field(default_factory=dict)  # _routing.meaning_pins, when weak

    def warn(self, warning: str) -> None:
        """Add a warning for turn/completed, once however often it happens."""
        if warning not in self.warnings:
            self.warnings.append(warning)


def offered_tools(npc_tools: Collection[ToolSpec], view: View, recall: bool = True) -> list[ToolSpec]:
    """The NPC's tools, and the world's ``recall`` while the NPC can see lore, unless the turn
    routes semantically (``recall=False``: the bridge put the lore the line calls for with the facts)."""
    tools = list(npc_tools)
    if recall and view.recall_tool is not None:
        tools.append(view.recall_tool)
    return tools


def steer(p: m.RespondParams, progress: TurnProgress, tools: list[ToolSpec]) -> tuple[list[ToolSpec], ToolMode]:
    """Tool mode and visible tools for the next step: ``required``/named/``tool_or_answer``
    apply to step 0 only; a spent budget, ``none`` or a direct answer disallows, and
    disallowed steps show no tools at all. ``tools``: what the NPC has (``offered_tools``)."""
    choice = p.tool_choice
    if progress.direct or not tools or choice == "none":
        return [], "disallowed"
    if progress.rounds >= p.max_tool_rounds or progress.calls_made >= p.max_tool_calls:
        return [], "disallowed"
    first = progress.step == 0
    routed = progress.routing
    if first and routed is not None and routed.policy == "semantic" and choice in ("auto", "tool_or_answer"):
        # The bridge chose (routing "semantic"): that tool, forced, or words only.
        picked = [t for t in tools if t.name == routed.picked]
        return (picked, "required") if picked else ([], "disallowed")
    if first and isinstance(choice, m.NamedTool):
        named = [t for t in tools if t.name == choice.tool]
        if not named:
            raise BridgeError(
                "invalid_params", f"toolChoice names tool {choice.tool!r}, which the npc does not have now"
            )
        return named, "required"
    if first and choice == "required":
        return tools, "required"
    if first and choice == "tool_or_answer":
        return [*tools, RESPOND_DIRECTLY_TOOL], "required"
    return tools, "allowed"


def call_room(p: m.RespondParams, progress: TurnProgress) -> int:
    """Calls the next step may make: what is left of the turn's ``maxToolCalls``; one on a
    first step the bridge routed to a tool (it picked one action for the line, not a batch)."""
    room = max(0, p.max_tool_calls - progress.calls_made)
    routed = progress.routing
    if progress.step == 0 and routed is not None and routed.policy == "semantic" and routed.picked is not None:
        return min(room, 1)
    return room


def player_line(p: m.RespondParams, step: int, working: list[Message]) -> str | None:
    """The line whose words pin tool arguments on this step: the player's line, on a turn's
    first step only (not on a step after a tool round, nor on a resumed turn that has one),
    unless the turn says ``pinArguments: false``."""
    if not p.pin_arguments or step != 0 or not working or working[-1].role != "user":
        return None
    return working[-1].content


def step_pins(p: m.RespondParams, progress: TurnProgress, tools: list[ToolSpec]) -> dict[str, dict[str, str]]:
    """For the step's request: per tool, the closed argument values the player's line names,
    and under semantic routing those it means (``TurnProgress.meant``)."""
    line = player_line(p, progress.step, progress.working)
    if line is None:
        return {}
    named = enum_pins(line, tools)
    offered = {t.name for t in tools}
    return {
        name: {**progress.meant.get(name, {}), **named.get(name, {})}
        for name in offered
        if name in named or name in progress.meant
    }


def pin_arguments(
    calls: list[ToolCall], step: int, tools: list[ToolSpec], p: m.RespondParams, progress: TurnProgress
) -> list[ToolCall]:
    """The step's calls with the arguments the player's line names (``_arguments.pin_calls``),
    each value replaced with a warning; unchanged on any step but the player's line."""
    line = player_line(p, step, progress.working)
    if line is None or not calls:
        return calls
    pinned, warnings = pin_calls(calls, {t.name: t for t in tools}, line, progress.meant, progress.weak)
    for warning in warnings:
        progress.warn(warning)
    return pinned


def judge_step(
    calls: list[ToolCall], mode: ToolMode, tools: list[ToolSpec], progress: TurnProgress
) -> tuple[StepOutcome, list[ToolCall]]:
    """What a finished step leads to, and the calls a tool round runs."""
    if calls and mode != "disallowed":
        if any(c.name == RESPOND_DIRECTLY for c in calls) and any(t is RESPOND_DIRECTLY_TOOL for t in tools):
            # The bridge's no-op: never the game's, never in the history.
            calls = [c for c in calls if c.name != RESPOND_DIRECTLY]
            if not calls:
                progress.direct = True
                return "direct", []
        return "calls", calls
    if calls:
        progress.warn(f"the model made {len(calls)} tool call(s) on a step where tools were disallowed; ignored")
    elif mode == "required":
        raise BridgeError("generation_failed", "the model answered without calling a tool on a step that required one")
    return "answer", []


def repeats(calls: list[ToolCall]) -> list[bool]:
    """For each call of a batch, whether an earlier call of the batch has its id."""
    seen: set[str] = set()
    out = []
    for call in calls:
        out.append(call.id in seen)
        seen.add(call.id)
    return out


def call_problem(
    call: ToolCall,
    known: Container[str],
    shown: Mapping[str, ToolSpec],
    pending: Container[str],
    check_arguments: Callable[[ToolCall], str | None],
    *,
    over_budget: bool,
    duplicate: bool,
) -> str | None:
    """Why the game must not get this call (the model gets the reason as its output), or
    None. ``known``: the tools the NPC has (with ``recall`` while it sees lore); ``shown``:
    those offered on this step; ``pending``: ids of calls the game is running;
    ``check_arguments``: the first schema error of the call's arguments."""
    if over_budget:
        return "tool call budget exceeded for this turn; answer without more tool calls"
    if duplicate or call.id in pending:
        return f"duplicate tool call id {call.id!r}"
    if call.name not in known:
        return f"unknown tool {call.name!r}"
    if call.name not in shown:
        return f"tool {call.name!r} is not offered on this step; call one of: {', '.join(shown)}"
    try:
        problem = check_arguments(call)
    except Exception:  # a schema check_schema let through but jsonschema cannot apply
        log.exception("validating the arguments of %s", call.name)
        return "invalid arguments: they could not be checked against the tool's schema"
    return None if problem is None else f"invalid arguments: {problem}"


def call_problems(
    calls: list[ToolCall],
    p: m.RespondParams,
    progress: TurnProgress,
    known: Container[str],
    shown: Mapping[str, ToolSpec],
    pending: Container[str],
    check_arguments: Callable[[ToolCall], str | None],
) -> list[str | None]:
    """``call_problem`` for each call of a step's batch: past the turn's call budget, or
    repeating an id of the batch, a call is refused whatever else it is."""
    room = p.max_tool_calls - progress.calls_made
    return [
        call_problem(call, known, shown, pending, check_arguments, over_budget=i >= room, duplicate=dup)
        for i, (call, dup) in enumerate(zip(calls, repeats(calls), strict=True))
    ]


def hand_back(calls: list[ToolCall], problems: list[str | None], progress: TurnProgress) -> list[ToolCall]:
    """For ``return_calls`` turns: the calls handed back to the host, each recorded with no
    output. Refused calls beside them are dropped with a warning, and so is ``recall`` (the
    bridge answers it only within a turn). Empty when every call was refused: then nothing
    is recorded, and each refused call gets its error output in a tool round as usual."""
    handed = [c for c, why in zip(calls, problems, strict=True) if why is None and c.name != RECALL]
    if handed:
        for c, why in zip(calls, problems, strict=True):
            if why is not None or c.name == RECALL:
                reason = why or "the bridge answers it only within a turn"
                progress.warnings.append(f"tool call {c.id} ({c.name}) dropped: {reason}")
        progress.records.extend(m.ToolRecord(c.id, c.name, c.arguments, None, None) for c in handed)
    return handed


def round_messages(
    text: str, calls: list[ToolCall], results: list[tuple[Any, str | None]], progress: TurnProgress
) -> list[Message]:
    """A tool round as the model sees it next: its calls, then one tool message per call,
    where an error is an output like any other (``Error: ...``). Records each call."""
    new = [Message(role="assistant", content=text, tool_calls=calls)]
    for call, (output, err) in zip(calls, results, strict=True):
        progress.records.append(m.ToolRecord(call.id, call.name, call.arguments, output, err))
        if err is not None:
            content = err
        else:
            content = output if isinstance(output, str) else msgspec.json.encode(output).decode()
        new.append(
            Message(
                role="tool",
                content=f"Error: {content}" if err else content,
                tool_call_id=call.id,
                name=call.name,
                is_error=err is not None,
            )
        )
    return new


def guardrail_action(e: BridgeError, p: m.RespondParams, progress: TurnProgress) -> GuardrailAction:
    """What a failed step leads to under the turn's ``guardrail`` policy: the failure
    (``raise``), one more step as plain text (``retry``: guided generation trips guardrails
    far more often), or the NPC's fallback line (``fallback``)."""
    if e.code not in GUARDRAIL_CODES or p.guardrail == "fail":
        return "raise"
    progress.warn(f"{e.code}: {e.message}")
    if p.guardrail == "retry" and not progress.retried:
        progress.retried = progress.direct = True
        progress.schema = None
        progress.step += 1
        return "retry"
    return "fallback"


def structured_answer(text: str, schema: dict[str, Any], finish: str) -> Any:
    """The step's text as the structured answer: JSON matching ``schema``, keys in the
    schema's order, or ``generation_failed`` saying why not."""
    try:
        answer = msgspec.json.decode(text)
    except msgspec.DecodeError:
        why = ' (cut off by maxTokens: finish_reason "length")' if finish == "length" else ""
        raise BridgeError(
            "generation_failed", f"the structured answer is not valid JSON{why}", text=text[:200]
        ) from None
    problem = first_error(make_validator(schema), answer)
    if problem is not None:
        raise BridgeError("generation_failed", f"the structured answer does not match the schema: {problem}")
    return reorder_to_schema(answer, schema)


def finish_reason(finish: str, progress: TurnProgress) -> str:
    """turn/completed's finish reason: the last step's, unless the turn was retried as text."""
    return "retried_as_text" if progress.retried else finish
