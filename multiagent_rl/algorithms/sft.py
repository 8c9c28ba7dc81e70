"""SFT on another agent's tokens.

The trained trace was produced by a frozen teacher or a scripted agent (``samples_from_policy``
is False); the policy imitates it with cross-entropy weight 1 on the action tokens::

    ce_t = 1 if token t is an action token else 0
"""

from __future__ import annotations

from typing import Literal

from ..episodes.episode import Episode
from ..episodes.trace import TokenStreams
from .base import Algorithm, AlgorithmConfig, on_kind, register, trained_traces


class SFTConfig(AlgorithmConfig):
    type: Literal["sft"] = "sft"
    """Supervised fine-tuning on the action tokens of a teacher's or scripted agent's traces."""


@register
class SFT(Algorithm):
    config_class = SFTConfig
    loss_types = ("ce",)
    samples_from_policy = False

    def score_group(self, episodes: list[Episode], roles: set[str] | None = None) -> None:
        for _, _, trace in trained_traces(episodes, roles):
            trace.streams = TokenStreams(algorithm=self.name, ce_weights=on_kind(trace, "action", 1.0))
