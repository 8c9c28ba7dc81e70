"""Tasks: what an environment is asked to play or solve."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TaskData:
    """The immutable content of one task.

    >>> TaskData(prompt="What is 2 + 2?", answer="4").prompt
    'What is 2 + 2?'
    """

    prompt: str = ""
    """The user-facing request (first user message of a chat harness)."""
    system_prompt: str | None = None
    """Optional system message placed before the prompt."""
    answer: str | None = None
    """Reference answer, if the task has one (used by rewards, never shown to the agent)."""
    info: dict[str, Any] = field(default_factory=dict)
    """Free-form metadata: seeds, deals, hidden goals, demonstrations..."""
    id: str | None = None
    """Stable identifier; groups of the same task share it."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> TaskData:
        return cls(**d)


@dataclass
class Task:
    """A task plus optional per-task run configuration (e.g. sampling overrides)."""

    data: TaskData
    config: dict[str, Any] | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"data": self.data.to_dict(), "config": self.config}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Task:
        return cls(TaskData.from_dict(d["data"]), d.get("config"))
