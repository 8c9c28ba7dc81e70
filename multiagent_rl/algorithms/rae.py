"""RAE: REINFORCE with a running baseline per (environment, role).

Traces are visited in order (episodes as given, traces in episode order); for each trained
trace with reward r, role ρ in environment e::

    A = r − b[e, ρ]
    b[e, ρ] ← d·b[e, ρ] + (1 − d)·r        (d = ``decay``, b starts at 0)

The baseline needs no group of samples, so it suits roles that run once per task (e.g. a
proposer). It is deterministic given the inputs (the trainer feeds every rank the same data)
and travels in checkpoints via ``state_dict`` (keys ``"env/role"``).
"""

from __future__ import annotations

from typing import Any, Literal

from ..episodes.episode import Episode
from ..episodes.trace import TokenStreams
from .base import Algorithm, AlgorithmConfig, on_kind, register, trained_traces


class RAEConfig(AlgorithmConfig):
    type: Literal["rae"] = "rae"
    """REINFORCE with an exponential-moving-average baseline per (env, role)."""
    decay: float = 0.95
    """Baseline decay d in b ← d·b + (1−d)·r; closer to 1 = slower-moving baseline."""


@register
class RAE(Algorithm):
    config_class = RAEConfig
    loss_types = ("rl",)
    uses_reward = True

    config: RAEConfig

    def __init__(self, config=None):
        super().__init__(config)
        self.baselines: dict[str, float] = {}
        """Running baseline per ``"env/role"``."""

    def score_group(self, episodes: list[Episode], roles: set[str] | None = None) -> None:
        d = self.config.decay
        for _, episode, trace in trained_traces(episodes, roles):
            key = f"{episode.env}/{trace.role}"
            r = trace.reward
            b = self.baselines.get(key, 0.0)
            trace.streams = TokenStreams(algorithm=self.name, advantages=on_kind(trace, "action", r - b))
            self.baselines[key] = d * b + (1 - d) * r

    def state_dict(self) -> dict[str, Any]:
        return {"baselines": dict(self.baselines)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.baselines = {str(k): float(v) for k, v in state.get("baselines", {}).items()}
