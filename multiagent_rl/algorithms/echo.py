"""ECHO: GRPO on the agent's actions plus learning to predict what comes back.

For a trained trace with GRPO advantage A (same per-role peers as [`grpo`][multiagent_rl.algorithms.grpo])::

    rl_t = A   on action tokens, 0 elsewhere
    ce_t = α   on observation tokens after the trace's first action token, 0 elsewhere

α is ``role_alpha[role]`` if set, else ``alpha``. Observations before the first action (context
the agent never acted on) carry no ce weight; modelling the environment's replies to its own
actions is what gives the agent a world model of them.
"""

from __future__ import annotations

from typing import Literal

from ..episodes.trace import TokenStreams, Trace
from .base import on_kind, register
from .grpo import GRPO, GRPOConfig


class EchoConfig(GRPOConfig):
    type: Literal["echo"] = "echo"
    """GRPO on actions plus a cross-entropy stream on the observations that follow them."""
    alpha: float = 0.1
    """Cross-entropy weight α on observation tokens after the first action."""
    role_alpha: dict[str, float] = {}
    """Per-role override of ``alpha``."""


def observation_weights(trace: Trace, alpha: float) -> list[float]:
    """α on observation tokens that come after the trace's first action token, 0 elsewhere."""
    out, acted = [], False
    for kind in trace.token_kinds:
        acted = acted or kind == "action"
        out.append(alpha if acted and kind == "observation" else 0.0)
    return out


@register
class Echo(GRPO):
    config_class = EchoConfig
    loss_types = ("rl", "ce")
    required_streams = ("rl",)  # single-turn traces have no observations for the ce stream

    config: EchoConfig

    def write(self, trace: Trace, advantage: float) -> None:
        alpha = self.config.role_alpha.get(trace.role, self.config.alpha)
        trace.streams = TokenStreams(
            algorithm=self.name,
            advantages=on_kind(trace, "action", advantage),
            ce_weights=observation_weights(trace, alpha),
        )
