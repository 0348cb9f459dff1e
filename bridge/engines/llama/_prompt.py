"""Rendering a step into the model's prompt text with the GGUF file's chat template."""

from __future__ import annotations

import json
from typing import Any

from bridge.engines.base import Message, ToolSpec


def _raise(msg: str) -> None:
    import jinja2

    raise jinja2.exceptions.TemplateError(msg)


class PromptRenderer:
    """Turns (instructions, messages, tools, mode, schema) into prompt text.

    Stateless after construction and safe to use from several threads at once (a compiled
    jinja template renders without shared mutable state).
    """

    def __init__(self, template: str | None, eos_token: str, bos_token: str) -> None:
        # jinja2 comes with llama-cpp-python: imported here, so that importing the engine
        # package works (and says "not installed" through availability()) without it.
        import jinja2
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        # A GGUF file's chat template is data from the model's author: render it sandboxed.
        env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True)
        env.globals["raise_exception"] = _raise
        self._jinja = env.from_string(template) if template else None
        self._eos, self._bos = eos_token, bos_token

    @staticmethod
    def system_text(instructions: str, tools: list[ToolSpec], tool_mode: str, schema: dict[str, Any] | None) -> str:
        """The system message: the instructions, the step's tools exactly as the request gives
        them (the agent decides which a step shows; "must" on a required step) and the
        answer's schema."""
        parts = [instructions] if instructions else []
        if tools:
            lines = ["You can call these tools:"]
            for t in tools:
                lines.append(f"- {t.name}: {t.description} Arguments schema: {json.dumps(t.parameters)}")
            lines.append('To call tools, reply with only JSON: {"tool_calls":[{"name":"<tool>","arguments":{...}}]}')
            if tool_mode == "required":
                lines.append("You must call a tool now.")
            parts.append("\n".join(lines))
        if schema is not None:
            parts.append("Answer with JSON matching this schema: " + json.dumps(schema))
        return "\n\n".join(parts)

    @staticmethod
    def chat_messages(system: str, messages: list[Message]) -> list[dict[str, Any]]:
        """The transcript as chat-template messages: past calls as the JSON the model would
        write, tool outputs labelled with the call they answer."""
        msgs: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
        for m in messages:
            if m.role == "assistant" and m.tool_calls:
                calls = {"tool_calls": [{"name": c.name, "arguments": c.arguments} for c in m.tool_calls]}
                content = (m.content + "\n" if m.content else "") + json.dumps(calls)
                msgs.append({"role": "assistant", "content": content})
            elif m.role == "tool":
                label = f"[{'error from' if m.is_error else 'result of'} tool {m.name or ''} {m.tool_call_id or ''}]"
                msgs.append({"role": "tool", "content": f"{label} {m.content}"})
            else:
                msgs.append({"role": m.role, "content": m.content})
        return msgs

    def render(
        self,
        instructions: str,
        messages: list[Message],
        tools: list[ToolSpec],
        tool_mode: str = "allowed",
        schema: dict[str, Any] | None = None,
    ) -> str:
        msgs = self.chat_messages(self.system_text(instructions, tools, tool_mode, schema), messages)
        if self._jinja is None:  # no template in the file: ChatML, SmolLM2's own format
            out = "".join(f"<|im_start|>{x['role']}\n{x['content']}<|im_end|>\n" for x in msgs)
            return out + "<|im_start|>assistant\n"
        try:
            return self._jinja.render(messages=msgs, add_generation_prompt=True, eos_token=self._eos, bos_token=self._bos)
        except Exception:  # noqa: BLE001 - a template that knows no "tool" role may raise anything
            # Tool outputs then go in as user turns.
            fixed = [dict(x, role="user") if x["role"] == "tool" else x for x in msgs]
            return self._jinja.render(messages=fixed, add_generation_prompt=True, eos_token=self._eos, bos_token=self._bos)
