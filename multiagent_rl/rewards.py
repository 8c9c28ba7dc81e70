"""Rewards that shape credit (used beside the algorithms in :mod:`multiagent_rl.algorithms`)."""

from __future__ import annotations


def learnability(p: float) -> float:
    """Learnability reward ``4·p·(1−p)`` of a task solved at rate ``p``.

    Peaks at 1.0 for a 50% solve rate and is 0 for tasks that are always or never solved, so a
    proposer role rewarded with it learns to pose problems at the edge of the solver's ability.

    >>> learnability(0.5), learnability(0.0), learnability(1.0)
    (1.0, 0.0, 0.0)
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"learnability expects a solve rate in [0, 1], got {p}")
    return 4.0 * p * (1.0 - p)
