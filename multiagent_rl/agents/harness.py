"""Harnesses: how a seat converses. ``chat`` renders the conversation with the chat template; ``tools`` adds
tool calls whose results come back as observation tokens. Chosen per role (``[env.roles.<role>] harness``)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, Union

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field


class ChatHarnessConfig(BaseModel):
    """The chat harness: a conversation rendered with the tokenizer's chat template."""

    model_config = ConfigDict(extra="forbid")

    id: Literal["chat"] = "chat"
    """The harness: ``chat`` renders the conversation with the tokenizer's chat template."""
    max_turns: int = Field(16, ge=1)
    """Most assistant replies in one interaction; one more ``send`` raises [`TurnLimitReached`][multiagent_rl.agents.agent.TurnLimitReached]."""
    system_prompt: str | None = None
    """Used when the task has no system prompt of its own."""


class ToolHarnessConfig(ChatHarnessConfig):
    """The chat harness with tool calls: the env hands the interaction its tools (Python functions with JSON
    schemas, [`multiagent_rl.tools`][]), the template shows them in the prompt, and each reply's
    ``<tool_call>`` blocks are run and their results appended as observation tokens (role ``tool``) before the
    model goes on. A ``send`` returns the first reply without tool calls (or the last one, when a limit ends
    the round); ``max_turns`` counts sends, not tool rounds."""

    id: Literal["tools"] = "tools"
    max_tool_calls_per_reply: int = Field(4, ge=1)
    """Calls run per reply; further calls in the same reply get an error result instead."""
    max_tool_rounds: int = Field(8, ge=1)
    """Replies with tool calls answered in one ``send``; the next such reply is returned as it is, unrun."""
    max_result_chars: int = Field(4000, ge=100)
    """Characters of one tool result the model reads (the rest is cut, with a note saying how much)."""


def _default_harness_id(value: Any) -> Any:
    # {max_turns = 4} without an id means the chat harness, as before tool calls existed
    return {"id": "chat", **value} if isinstance(value, dict) and "id" not in value else value


HarnessConfig = Annotated[Union[ChatHarnessConfig, ToolHarnessConfig], Field(discriminator="id"),
                          BeforeValidator(_default_harness_id)]
