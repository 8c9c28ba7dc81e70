"""Rewards that shape credit (used beside the algorithms in [`multiagent_rl.algorithms`][])."""

from __future__ import annotations


def learnability(p: float) -> float:
    """Learnability reward ``4·p·(1−p)`` of a task solved at rate ``p``.

    Peaks at 1.0 for a 50% solve rate and is 0 for tasks that are always or never solved, so a
    proposer role rewarded with it learns to pose problems at the edge of the solver's ability.

    ```pycon
    >>> learnability(0.5), learnability(0.0), learnability(1.0)
    (1.0, 0.0, 0.0)

    ```
    """
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"learnability expects a solve rate in [0, 1], got {p}")
    return 4.0 * p * (1.0 - p)


def absolute_zero(p: float) -> float:
    """The Absolute Zero Reasoner's proposer reward: ``1 − p``, and 0 when nobody solves it (``p = 0``).

    ```pycon
    >>> absolute_zero(0.25), absolute_zero(0.0), absolute_zero(1.0)
    (0.75, 0.0, 0.0)

    ```
    """
    _check_rate(p)
    return 0.0 if p == 0 else 1.0 - p


def r_zero(p: float) -> float:
    """R-Zero's proposer reward ``min(p, 1 − p)``: highest (0.5) at a 50% solve rate.

    ```pycon
    >>> r_zero(0.25), r_zero(0.5), r_zero(1.0)
    (0.25, 0.5, 0.0)

    ```
    """
    _check_rate(p)
    return min(p, 1.0 - p)


PROPOSER_REWARDS = {"learnability": learnability, "absolute_zero": absolute_zero, "r_zero": r_zero}
"""Proposer rewards from the solve rate p of a proposed problem, by name."""


def _check_rate(p: float) -> None:
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"expects a solve rate in [0, 1], got {p}")
