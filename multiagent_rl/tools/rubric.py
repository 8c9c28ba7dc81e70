"""Rubrics and verdicts: how a judge's written verdict becomes a reward in [0, 1].

A [`Rubric`][multiagent_rl.tools.rubric.Rubric] is a list of criteria, each with a question and its allowed verdicts listed
worst → best. The judge answers with one JSON object (code fences and text before it are tolerated)::

    {"verdicts": [{"name": "correctness", "reason": "fails clamp(5, 0, 3)", "verdict": "incorrect"}]}

A criterion's verdict maps onto [0, 1] by its position in the list (worst 0, best 1, evenly spaced), and
the reward is the weighted mean over criteria.

```pycon
>>> rubric = Rubric.default()
>>> verdicts = rubric.parse('{"verdicts": [{"name": "correctness", "reason": "ok", "verdict": "correct"}]}')
>>> rubric.score(verdicts)
1.0

```
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field, field_validator

from .text import last_json_object


class VerdictError(ValueError):
    """A judge reply that holds no usable verdict (no JSON, a missing criterion, a verdict not on the list)."""


class Criterion(BaseModel):
    """One question of a rubric."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    question: str
    choices: tuple[str, ...] = Field(min_length=2)
    """The allowed verdicts, worst first."""
    weight: float = Field(1.0, gt=0)

    @field_validator("choices")
    @classmethod
    def _distinct(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if len({c.lower() for c in v}) != len(v):
            raise ValueError(f"choices {v} repeat a verdict")
        return v

    def value(self, verdict: str) -> float:
        """The verdict's place on [0, 1]: worst 0, best 1."""
        return [c.lower() for c in self.choices].index(verdict.lower()) / (len(self.choices) - 1)


@dataclass(frozen=True)
class Verdict:
    name: str
    verdict: str
    reason: str


class Rubric(BaseModel):
    """Criteria a judge answers; [`parse`][multiagent_rl.tools.rubric.Rubric.parse] reads its reply and
    [`score`][multiagent_rl.tools.rubric.Rubric.score] turns it into a reward."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    criteria: tuple[Criterion, ...] = Field(min_length=1)

    @classmethod
    def default(cls) -> Rubric:
        """The code rubric: does the solution meet the spec and its examples (whatever the unit tests say)?"""
        return cls(criteria=(Criterion(
            name="correctness",
            question="Does solution.py meet the spec and every one of its examples? The unit tests may be wrong "
                     "or demand more than the spec; the spec and its examples decide.",
            choices=("incorrect", "partially correct", "correct"),
        ),))

    def instructions(self) -> str:
        """The part of the judge's prompt that asks for the verdict, naming every criterion and its choices."""
        lines = ["Answer each question:"]
        for c in self.criteria:
            lines.append(f'- "{c.name}": {c.question} Verdict, worst to best: {json.dumps(list(c.choices))}.')
        example = {"verdicts": [{"name": c.name, "reason": "...", "verdict": c.choices[-1]} for c in self.criteria]}
        lines.append(f"End your reply with one JSON object like {json.dumps(example)}")
        return "\n".join(lines)

    def parse(self, reply: str) -> dict[str, Verdict]:
        """The verdicts in ``reply``, by criterion name; raises [`VerdictError`][multiagent_rl.tools.rubric.VerdictError]
        saying what is wrong."""
        obj = last_json_object(reply)
        if not isinstance(obj, dict) or not isinstance(obj.get("verdicts"), list):
            raise VerdictError(f'no JSON object with a "verdicts" list in the judge\'s reply: {reply[-300:]!r}')
        by_name = {c.name: c for c in self.criteria}
        out: dict[str, Verdict] = {}
        for item in obj["verdicts"]:
            if not isinstance(item, dict) or item.get("name") not in by_name:
                continue  # an extra criterion is ignored; a missing one is the error below
            choice = str(item.get("verdict", "")).strip()
            allowed = by_name[item["name"]].choices
            if choice.lower() not in [c.lower() for c in allowed]:
                raise VerdictError(f"verdict {choice!r} for {item['name']!r} is not one of {list(allowed)}")
            out[item["name"]] = Verdict(item["name"], choice, str(item.get("reason", "")))
        missing = [name for name in by_name if name not in out]
        if missing:
            raise VerdictError(f"the judge gave no verdict for {missing}")
        return out

    def score(self, verdicts: dict[str, Verdict]) -> float:
        """The weighted mean of the verdicts' places on [0, 1]."""
        total = sum(c.weight for c in self.criteria)
        return sum(c.weight * c.value(verdicts[c.name].verdict) for c in self.criteria) / total

    def verdict_text(self, choices: dict[str, str], reason: str = "") -> str:
        """A verdict as a judge writes it (for scripted judges, docs and warm-up data)."""
        return json.dumps({"verdicts": [{"name": c.name, "reason": reason, "verdict": choices[c.name]}
                                        for c in self.criteria]})
