"""MaxRL credit (binary rewards).

For a trained trace with reward r and p̄ the mean reward of its same-role peers in the task
group (the trace included)::

    A = (r − p̄) / p̄      if p̄ ≠ 0
    A = 0                 if p̄ = 0   (nobody in the group solved it: no signal)

Dividing by the solve rate p̄ instead of the std weights hard tasks (small p̄) up, which is what
maximising log p(success) rather than p(success) asks for. The rl stream is A on action tokens.
"""

from __future__ import annotations

from typing import Literal

from ..episodes.episode import Episode
from ..episodes.trace import TokenStreams
from .base import Algorithm, AlgorithmConfig, on_kind, peer_groups, register


class MaxRLConfig(AlgorithmConfig):
    type: Literal["max_rl"] = "max_rl"
    """Maximum-likelihood RL: advantage (r − p̄)/p̄ over same-role peers; rewards expected in {0, 1}."""


@register
class MaxRL(Algorithm):
    config_class = MaxRLConfig
    loss_types = ("rl",)
    uses_reward = True
    reward_range = (0.0, 1.0)

    @classmethod
    def needs_group(cls, config, role) -> bool:
        return True

    def score_group(self, episodes: list[Episode], roles: set[str] | None = None) -> None:
        for members in peer_groups(episodes, roles).values():
            p_bar = sum(t.reward for t in members) / len(members)
            for trace in members:
                advantage = 0.0 if p_bar == 0 else (trace.reward - p_bar) / p_bar
                trace.streams = TokenStreams(algorithm=self.name, advantages=on_kind(trace, "action", advantage))
