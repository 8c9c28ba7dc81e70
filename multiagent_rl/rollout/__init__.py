"""The rollout engine: environments played by their seats, episodes scored by the algorithms, the run's health.

Imports nothing from TRL: a notebook or an evaluation uses [`Orchestrator`][multiagent_rl.rollout.engine.Orchestrator]
alone.
"""

from .engine import Orchestrator, RolloutStep, episode_metrics
from .health import RunHealth, RunStopped

__all__ = ["Orchestrator", "RolloutStep", "RunHealth", "RunStopped", "episode_metrics"]
