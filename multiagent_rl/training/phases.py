"""Training phases: which ``[[env]]`` entries are played for how many steps, at which learning rate, and where the
optimizer state starts fresh (``[[phase]]`` in an experiment; the trainer carries them out with
[`phase_callbacks`][multiagent_rl.training.callbacks.phase_callbacks])."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class PhaseConfig(BaseModel):
    """One phase of training: which environment entries are played, for how many steps, at which learning rate.

    ```toml
    [[phase]]                   # an sft warm-up imitating a scripted player
    name = "warmup"
    steps = 100
    envs = ["kuhn_poker_warmup"]
    learning_rate = 3e-3

    [[phase]]                   # then self-play RL until [trainer] max_steps, with a fresh Adam
    name = "selfplay"
    envs = ["kuhn_poker"]
    fresh_optimizer = true
    ```
    """

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    name: str
    steps: int | None = Field(None, ge=1)
    """Steps of this phase; None for the last phase: until ``[trainer] max_steps``."""
    envs: list[str]
    """The ``[[env]]`` entries played in this phase, by label (their ``name``, else their ``id``)."""
    learning_rate: float | None = Field(None, gt=0)
    """A fixed learning rate for this phase; None: the trainer's schedule."""
    fresh_optimizer: bool = False
    """Forget the optimizer's state (Adam's moments) at the start of this phase: a warm-up's large gradients would
    otherwise shrink the next phase's first steps for ~1 / (1 − β₂) steps."""


def apply_phases(phases: list[PhaseConfig], envs: list, labels: list[str]) -> None:
    """Set each env entry's ``start_step`` / ``stop_step`` from the phases that list it (contiguous; explicit
    start/stop steps that disagree are an error)."""
    if not phases:
        return
    starts, start = [], 0
    for i, phase in enumerate(phases):
        if phase.steps is None and i != len(phases) - 1:
            raise ValueError(f"[[phase]] {phase.name!r}: only the last phase may leave out steps")
        unknown = set(phase.envs) - set(labels)
        if unknown:
            raise ValueError(f"[[phase]] {phase.name!r} names unknown env entries {sorted(unknown)}; the entries "
                             f"are {labels} (their name, else their id)")
        starts.append(start)
        start += phase.steps or 0
    for env, label in zip(envs, labels):
        listed = [i for i, phase in enumerate(phases) if label in phase.envs]
        if not listed:
            raise ValueError(f"env {label!r} is in no [[phase]]: list it in the phases it is played in")
        if listed != list(range(listed[0], listed[-1] + 1)):
            raise ValueError(f"env {label!r} is listed in phases that are not consecutive: give it one entry per "
                             "stretch (two [[env]] entries with different names)")
        if env.start_step or env.stop_step is not None:
            if (env.start_step, env.stop_step) != _phase_steps(phases, starts, listed):
                raise ValueError(f"env {label!r}: start_step / stop_step clash with its [[phase]]s; leave them "
                                 "out, the phases set them")
        env.start_step, env.stop_step = _phase_steps(phases, starts, listed)


def _phase_steps(phases: list[PhaseConfig], starts: list[int], listed: list[int]) -> tuple[int, int | None]:
    last = phases[listed[-1]]
    return starts[listed[0]], None if last.steps is None else starts[listed[-1]] + last.steps


def phase_boundaries(phases: list[PhaseConfig]) -> list[tuple[int, int | None, PhaseConfig]]:
    """``(start, stop, phase)`` of every phase (stop None: until the end)."""
    out, start = [], 0
    for phase in phases:
        stop = None if phase.steps is None else start + phase.steps
        out.append((start, stop, phase))
        start = stop or start
    return out


def warmup_then_rl(warmup_steps: int, warmup: list[str], rl: list[str], warmup_lr: float | None = None,
                   fresh_optimizer: bool = False) -> list[dict[str, Any]]:
    """The two ``[[phase]]`` entries of a warm-up (``warmup`` env entries for ``warmup_steps`` steps, at ``warmup_lr``)
    followed by RL (``rl`` entries until the end, with a fresh optimizer state if asked); none without a warm-up.

    ```pycon
    >>> [p["name"] for p in warmup_then_rl(100, ["kuhn_poker_warmup"], ["kuhn_poker"], 3e-3)]
    ['warmup', 'rl']

    ```
    """
    if not warmup_steps:
        return []
    return [{"name": "warmup", "steps": warmup_steps, "envs": warmup,
             **({"learning_rate": warmup_lr} if warmup_lr is not None else {})},
            {"name": "rl", "envs": rl, "fresh_optimizer": fresh_optimizer}]
