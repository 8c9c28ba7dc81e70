"""GRPO credit, per role.

For a trained trace with reward r::

    A = r − mean(peers)                       (scale_rewards=False, the default)
    A = (r − mean(peers)) / (std(peers) + 1e-4)   (scale_rewards=True)

Peers are the trained traces of the **same role** (``trace.role``) across the episodes of the
task group, the trace itself included; roles are never pooled, so in a proposer/solver or
player_0/player_1 game each seat gets its own baseline and its advantages sum to zero. A role
that runs several times per episode has all of those runs as peers. ``std`` is the unbiased
(Bessel-corrected) standard deviation, as in TRL's ``GRPOTrainer`` (``torch.std`` default), and
0 for a single peer. The rl stream is A on the trace's action tokens and 0 elsewhere.
"""

from __future__ import annotations

import math
from typing import Literal

from ..episodes.episode import Episode
from ..episodes.trace import TokenStreams, Trace
from .base import Algorithm, AlgorithmConfig, PeerKey, by_role, on_kind, peer_groups, register


class GRPOConfig(AlgorithmConfig):
    type: Literal["grpo"] = "grpo"
    """Group-relative policy optimisation with a per-role group baseline."""
    scale_rewards: bool = False
    """Divide advantages by the peers' reward std (+1e-4). Off by default: std scaling up-weights
    groups whose outcomes barely differ (Dr. GRPO's difficulty bias), and in zero-sum self-play it
    turns near-draw groups' noise into full-size updates and gives the two seats different step
    sizes for the same game, biasing the self-play dynamics."""


def std(values: list[float]) -> float:
    """Unbiased sample standard deviation (``torch.std`` default); 0 for fewer than two values."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))


def relative_advantages(
    episodes: list[Episode],
    roles: set[str] | None,
    scale_rewards: bool = False,
    key: PeerKey = by_role,
) -> list[tuple[Trace, float]]:
    """``(trace, A)`` for every trained trace, A = r − mean(peers) [/ (std(peers) + 1e-4)]."""
    out: list[tuple[Trace, float]] = []
    for members in peer_groups(episodes, roles, key).values():
        rewards = [t.reward for t in members]
        mean = sum(rewards) / len(rewards)
        scale = std(rewards) + 1e-4 if scale_rewards else 1.0
        out.extend((t, (r - mean) / scale) for t, r in zip(members, rewards))
    return out


@register
class GRPO(Algorithm):
    config_class = GRPOConfig
    loss_types = ("rl",)
    uses_reward = True

    @classmethod
    def needs_group(cls, config, role) -> bool:
        return True

    config: GRPOConfig

    def advantages(self, episodes: list[Episode], roles: set[str] | None) -> list[tuple[Trace, float]]:
        return relative_advantages(episodes, roles, self.config.scale_rewards)

    def write(self, trace: Trace, advantage: float) -> None:
        trace.streams = TokenStreams(algorithm=self.name, advantages=on_kind(trace, "action", advantage))

    def score_group(self, episodes: list[Episode], roles: set[str] | None = None) -> None:
        for trace, advantage in self.advantages(episodes, roles):
            self.write(trace, advantage)
