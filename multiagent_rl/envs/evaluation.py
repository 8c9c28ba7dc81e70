"""What the environments' held-out evaluations share: a trainer callback that measures the live policy on a schedule
and keeps its points in checkpoints. Each env's ``evaluation.py`` subclasses it with what it measures."""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback


class PeriodicEvaluation(TrainerCallback):
    """Measures the trained policy before the first step (``at_start``), when the warm-up ends (``warmup_steps``),
    every ``every`` steps (also during the warm-up unless ``during_warmup`` is False) and after the last step.

    A subclass implements [`measure`][multiagent_rl.envs.evaluation.PeriodicEvaluation.measure]; each point (its
    numbers and ``step``) joins ``points``, and from the first step on its numbers are logged as
    ``{prefix}/{key}`` ([`metric`][multiagent_rl.envs.evaluation.PeriodicEvaluation.metric] renames). The point
    before training is printed rather than logged: a metric recorded then would be averaged into the first logging
    step's line. Set ``trainer`` (the ``MixedAlgorithmTrainer``) before training; ``points`` travel in checkpoints.
    """

    prefix = "eval"

    def __init__(self, every: int, warmup_steps: int = 0, at_start: bool = True, during_warmup: bool = True):
        self.every, self.warmup_steps, self.at_start, self.during_warmup = every, warmup_steps, at_start, during_warmup
        self.points: list[dict[str, Any]] = []
        self.trainer = None

    def measure(self, step: int) -> dict[str, Any]:
        """The numbers of this evaluation point (the live policy: ``self.trainer.live_policy()``)."""
        raise NotImplementedError

    def metric(self, key: str) -> str:
        """The logged name of a point's ``key``."""
        return f"{self.prefix}/{key}"

    def state_dict(self) -> dict[str, Any]:
        return {"points": self.points}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.points = list(state["points"])

    def due(self, step: int, max_steps: int) -> bool:
        """Whether the step that just ended is evaluated."""
        if step == max_steps or (self.warmup_steps and step == self.warmup_steps):
            return True
        if not self.every or step % self.every:
            return False
        return self.during_warmup or step >= self.warmup_steps

    def evaluate(self, step: int) -> dict[str, Any]:
        """Measure now; the point joins ``points``."""
        point = self.measure(step)
        self.points.append({"step": step, **point})
        return point

    def on_train_begin(self, args, state, control, **kwargs):
        if not self.at_start or self.points:  # resumed: the curve has its start already
            return
        point = self.evaluate(state.global_step)
        if self.trainer.accelerator.is_main_process:
            shown = "  ".join(f"{key} {value:.4g}" for key, value in point.items() if isinstance(value, (int, float)))
            print(f"before training (step {state.global_step}): {shown}", flush=True)

    def on_step_end(self, args, state, control, **kwargs):
        if not self.due(state.global_step, state.max_steps):
            return
        for key, value in self.evaluate(state.global_step).items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.trainer.record_metric(self.metric(key), value)
