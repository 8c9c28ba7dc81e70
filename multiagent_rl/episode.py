"""Episodes: every finished agent run of one environment run on one task."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from .task import Task
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "task": self.task.to_dict(),
            "group": self.group,
            "env": self.env,
            "traces": [t.to_dict() for t in self.traces],
            "errors": self.errors,
            "ok": self.ok,
            "info": self.info,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Episode:
        return cls(
            id=d["id"],
            task=Task.from_dict(d["task"]),
            group=d["group"],
            env=d["env"],
            traces=[Trace.from_dict(t) for t in d["traces"]],
            errors=d["errors"],
            ok=d["ok"],
            info=d["info"],
        )

    def to_json(self) -> str:
        return json.dumps(self.to_dict())

    @classmethod
    def from_json(cls, s: str) -> Episode:
        return cls.from_dict(json.loads(s))
