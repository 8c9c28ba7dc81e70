"""Hierarchical GRPO: GRPO whose peer sets depend on the role.

For roles listed in ``episode_group_roles`` the peers of a trace are the traces of that role
**within the same episode** (e.g. the n solvers that attempted one proposed problem); for every
other role they are the traces of that role across the task group (plain per-role GRPO)::

    A = r − mean(peers)          [/ (std(peers) + 1e-4) with scale_rewards]

The rl stream is A on the trace's action tokens and 0 elsewhere.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Literal

from ..episodes.episode import Episode
from ..episodes.trace import Trace
from .base import register
from .grpo import GRPO, GRPOConfig, relative_advantages


class HierarchicalGRPOConfig(GRPOConfig):
    type: Literal["hierarchical_grpo"] = "hierarchical_grpo"
    """GRPO with in-episode peer groups for some roles and task-group peers for the rest."""
    episode_group_roles: list[str] = []
    """Roles whose peers are the same role's traces in the same episode (not across the task group)."""


@register
class HierarchicalGRPO(GRPO):
    config_class = HierarchicalGRPOConfig
    loss_types = ("rl",)

    @classmethod
    def needs_group(cls, config, role) -> bool:
        return role not in config.episode_group_roles

    config: HierarchicalGRPOConfig

    def peer_key(self, index: int, episode: Episode, trace: Trace) -> Hashable:
        if trace.role in self.config.episode_group_roles:
            return (trace.role, "episode", index)
        return (trace.role, "group")

    def advantages(self, episodes: list[Episode], roles: set[str] | None) -> list[tuple[Trace, float]]:
        return relative_advantages(episodes, roles, self.config.scale_rewards, key=self.peer_key)
