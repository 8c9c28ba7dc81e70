"""Tasks: what an environment is asked to play or solve (stored as records: [`multiagent_rl.episodes.records`][])."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class TaskData:
    """The immutable content of one task.

    ```pycon
    >>> TaskData(prompt="What is 2 + 2?", answer="4").prompt
    'What is 2 + 2?'

    ```
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
    """An identifier of the task in its dataset, kept in the episode log and trace datasets (optional)."""


@dataclass
class Task:
    """A task plus sampling overrides for every seat that plays it.

    ```pycon
    >>> Task(TaskData(prompt="Prove it."), sampling={"max_new_tokens": 512}).sampling
    {'max_new_tokens': 512}

    ```
    """

    data: TaskData
    sampling: dict[str, Any] | None = None
    """``SamplingParams`` fields that override every seat's settings on this task (e.g. a longer
    ``max_new_tokens`` for hard problems); a seat's own per-call overrides still win."""
