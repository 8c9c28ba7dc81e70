"""Tools an agent can call: Python functions with JSON schemas, called in the chat template's tool format.

This package also holds what tools are built from: the [`sandbox`][multiagent_rl.tools.sandbox] every command runs
in, the [`rubric`][multiagent_rl.tools.rubric] a judge's verdict is read with, and
[`text`][multiagent_rl.tools.text] (structured answers read out of replies, shared by the rubric and the envs'
parsers).

A tool is a plain (sync or async) function with type hints and a Google-style docstring; its JSON schema
comes from ``transformers.utils.get_json_schema``, the same schema ``tokenizer.apply_chat_template(tools=...)``
renders into the prompt. A model calls tools in the Hermes / Qwen2.5 / Qwen3 format, one JSON object per
call between ``<tool_call>`` tags::

    <tool_call>
    {"name": "read_file", "arguments": {"path": "solution.py"}}
    </tool_call>

The tool harness ([`multiagent_rl.agents.agent.ToolHarnessConfig`][]) parses the calls out of each reply,
runs them, and appends their results as observation tokens before the model continues. A call that does
not parse, names no known tool, has bad arguments or raises becomes an error result the model reads,
never an exception in the episode.

```pycon
>>> parse_tool_calls(tool_call_text("read_file", path="a.py"))
[ToolCall(name='read_file', arguments={'path': 'a.py'}, error=None)]

```
"""

from __future__ import annotations

import inspect
import json
import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .sandbox import CommandResult

CALL_PATTERN = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.DOTALL)


@dataclass
class Tool:
    """A callable with its JSON schema (``{"type": "function", "function": {name, description, parameters}}``)."""

    function: Callable[..., Any]
    schema: dict[str, Any]

    @classmethod
    def from_function(cls, function: Callable[..., Any], name: str | None = None) -> Tool:
        """The schema read from the function's type hints and docstring (every argument needs an ``Args:`` line)."""
        from transformers.utils import get_json_schema

        try:
            schema = get_json_schema(function)
        except Exception as exc:  # noqa: BLE001 - transformers raises several types for undocumented functions
            raise ValueError(
                f"cannot build a tool schema for {getattr(function, '__name__', function)!r}: {exc}. A tool needs "
                "type hints on every argument and a Google-style docstring with a description and an `Args:` section"
            ) from exc
        schema["function"].pop("return", None)
        if name is not None:
            schema["function"]["name"] = name
        return cls(function, schema)

    @property
    def name(self) -> str:
        return self.schema["function"]["name"]

    def check_arguments(self, arguments: dict[str, Any]) -> str | None:
        """What is wrong with ``arguments`` for this tool (unknown or missing names), or None."""
        params = self.schema["function"].get("parameters", {})
        known, required = set(params.get("properties", {})), set(params.get("required", []))
        if unknown := sorted(set(arguments) - known):
            return f"unknown argument(s) {unknown}; {self.name} takes {sorted(known)}"
        if missing := sorted(required - set(arguments)):
            return f"missing required argument(s) {missing}"
        return None


def as_tools(tools: Sequence[Callable[..., Any] | Tool] | None) -> dict[str, Tool]:
    """Tools by name, building each plain function's schema; names must be unique."""
    out: dict[str, Tool] = {}
    for t in tools or ():
        tool = t if isinstance(t, Tool) else Tool.from_function(t)
        if tool.name in out:
            raise ValueError(f"two tools are named {tool.name!r}")
        out[tool.name] = tool
    return out


@dataclass
class ToolCall:
    """One parsed call. ``error`` says why it cannot run (then ``name`` / ``arguments`` may be empty)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None


def parse_tool_calls(text: str) -> list[ToolCall]:
    """Every ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` in ``text``, in order.

    A block that is not such a JSON object (or is left unclosed) comes back as a call with ``error`` set, so the
    model is told what was wrong. ``arguments`` may also be a JSON string holding the object (some models write it so),
    and a block may hold a JSON list of such objects, one call each (the format of the APIGen function-calling data
    SmolLM2 was tuned on).
    """
    calls = []
    for body, close in CALL_PATTERN.findall(text):
        if not close:
            calls.append(ToolCall("", error="a <tool_call> block was not closed with </tool_call>"))
            continue
        try:
            obj = json.loads(body.strip())
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            calls.append(ToolCall("", error=f"the tool call is not valid JSON: {exc}"))
            continue
        calls.extend(_call_of(item) for item in (obj if isinstance(obj, list) and obj else [obj]))
    return calls


def _call_of(obj: Any) -> ToolCall:
    try:
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            raise ValueError('expected an object {"name": <tool name>, "arguments": {...}}')
        args = obj.get("arguments", {})
        if isinstance(args, str):
            args = json.loads(args) if args.strip() else {}
        if not isinstance(args, dict):
            raise ValueError("`arguments` must be a JSON object")
    except ValueError as exc:
        return ToolCall("", error=f"the tool call is not valid JSON of the right shape: {exc}")
    return ToolCall(obj["name"], args)


def tool_call_text(name: str, **arguments: Any) -> str:
    """One call in the format the harness parses (for scripted agents, docs and warm-up data)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


async def run_tool_call(tools: dict[str, Tool], call: ToolCall, max_chars: int) -> tuple[str, dict[str, Any]]:
    """Run one call: its result as the model will read it (cut to ``max_chars``) and a record for the trace.

    Never raises for what the call or the tool does: every failure is an ``Error: ...`` result.
    """
    record: dict[str, Any] = {"name": call.name, "arguments": call.arguments, "ok": False}
    started = time.perf_counter()
    if call.error is not None:
        content = f"Error: {call.error}"
    elif call.name not in tools:
        content = f"Error: there is no tool named {call.name!r}; the tools are {sorted(tools)}"
    elif problem := tools[call.name].check_arguments(call.arguments):
        content = f"Error: {problem}"
    else:
        try:
            result = tools[call.name].function(**call.arguments)
            if inspect.isawaitable(result):
                result = await result
            content, record["ok"] = _as_text(result, max_chars), True
            if isinstance(result, CommandResult):
                record.update(returncode=result.returncode, killed=result.killed, isolated=result.isolated)
                record["ok"] = result.killed is None
        except Exception as exc:  # noqa: BLE001 - a failing tool is the model's observation, never the episode's crash
            content = f"Error: {call.name} raised {type(exc).__name__}: {exc}"
    record["seconds"] = round(time.perf_counter() - started, 4)
    content = content.encode("utf-8", errors="replace").decode("utf-8")  # a tool's lone surrogates cannot be tokenised
    if len(content) > max_chars:
        content = content[:max_chars] + f"\n[... {len(content) - max_chars} more characters cut]"
    record["error"] = None if record["ok"] else content[:500]
    return content, record


def _as_text(result: Any, max_chars: int) -> str:
    if isinstance(result, CommandResult):
        return result.summary(max_chars)
    if isinstance(result, str):
        return result
    try:
        return json.dumps(result)
    except TypeError:
        return str(result)
