"""Episodes: every finished agent run of one environment run on one task."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..tasks.task import Task
from .trace import Trace


@dataclass
class Episode:
    """One environment run.

    ``group`` names the task group (the G episodes of one task) the episode belongs to;
    ``ok`` is False when the run raised or timed out (``errors`` says why), in which case
    the episode is kept for inspection but never trained on.
    """

    id: str
    task: Task
    group: str = ""
    env: str = ""
    traces: list[Trace] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    ok: bool = True
    info: dict[str, Any] = field(default_factory=dict)

    def by_role(self, name: str) -> list[Trace]:
        """All traces of the seat ``name`` (a seat may run several times in one episode)."""
        return [t for t in self.traces if t.role == name]

    @property
    def roles(self) -> list[str]:
        return sorted({t.role for t in self.traces})
