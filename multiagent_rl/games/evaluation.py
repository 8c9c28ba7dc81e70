"""What every game's evaluation during training shares: read the model's policy every few steps, score it and the
reach-weighted average of the readings exactly, log both, and survive a resume.

A game plugs in by subclassing [`GameEvaluation`][multiagent_rl.games.evaluation.GameEvaluation] with its name (the
metric prefix), its average policy, how the model's policy is read and how a table is scored
([`KuhnEvaluation`][multiagent_rl.envs.kuhn_poker.evaluation.KuhnEvaluation],
[`LeducEvaluation`][multiagent_rl.envs.leduc_poker.evaluation.LeducEvaluation]).
[`AverageOpponent`][multiagent_rl.games.evaluation.AverageOpponent] is a scripted seat that plays the evaluation's
average policy: fictitious self-play in its exact tabular form.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

from transformers import TrainerCallback

from .average import ReachWeightedAverage


class GameEvaluation(TrainerCallback):
    """Every ``every`` steps (and at the last) the policy is read at all information states; from ``start_step`` on
    each reading joins the reach-weighted average policy with linear weights (as in CFR+: later, better policies
    weigh more). The exploitability of both goes into the trainer's log as ``eval/{name}/exploitability`` and
    ``eval/{name}/avg_exploitability`` (printed on the console line) and into `points`; the average and the
    curve travel in checkpoints, so a resumed run continues the same curve. A point's ``seconds`` count from the
    callback's creation (after the model is loaded) to that point, resumed runs included. ``at_start=True`` also
    reads the untrained policy before the first step (a step-0 point, printed, not logged: the trainer's log starts
    at step 1). Set ``evaluation.trainer = trainer`` once the trainer is built."""

    name: str = ""
    """The metric prefix: ``eval/{name}/...``."""

    def __init__(self, every: int, start_step: int = 0, at_start: bool = False):
        self.every, self.start_step, self.at_start = every, start_step, at_start
        self.average = self.new_average()
        self.points: list[dict] = []
        self.trainer = None
        self.started = time.time()

    # -- what a game supplies ------------------------------------------------------------------
    def new_average(self) -> ReachWeightedAverage:
        """An empty average policy over the game's information states."""
        raise NotImplementedError

    def read(self, model, tokenizer) -> dict:
        """The model's policy table, as the seats play it."""
        raise NotImplementedError

    def exploitability(self, table) -> float:
        """The exact exploitability of a table."""
        raise NotImplementedError

    def extra(self, trainer, model, table) -> dict[str, Any]:
        """More numbers for this evaluation point (logged when listed in `logged`)."""
        return {}

    logged: tuple[str, ...] = ("exploitability", "avg_exploitability")
    """The point's keys that go into the trainer's log."""

    # -- the shared part -----------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average.state_dict(), "points": self.points, "seconds": time.time() - self.started}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.average.load_state_dict(state["average"])
        self.points = list(state["points"])
        self.started = time.time() - float(state["seconds"])

    def on_train_begin(self, args, state, control, **kwargs):
        if not self.at_start or self.points:  # resumed: the curve has its start already
            return
        point = self.evaluate(state.global_step)
        if self.trainer.accelerator.is_main_process:
            shown = "  ".join(f"{key} {point[key]:.4g}" for key in self.logged if point.get(key) is not None)
            print(f"before training (step {point['step']}): {shown}", flush=True)

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step % self.every and step != state.max_steps:
            return
        point = self.evaluate(step)
        for key in self.logged:
            if point[key] is not None:
                self.trainer.record_metric(f"eval/{self.name}/{key}", point[key])

    def evaluate(self, step: int) -> dict[str, Any]:
        """Read and score the policy now; the point joins `points` (and the average from ``start_step`` on)."""
        trainer = self.trainer
        model = trainer.accelerator.unwrap_model(trainer.model)
        table = self.read(model, trainer.tokenizer)
        if step >= self.start_step:
            self.average.add(table, weight=len(self.average) + 1)
        point = {"step": step, "episodes": trainer.rollout.episodes_played,
                 "seconds": round(time.time() - self.started, 1), "exploitability": self.exploitability(table),
                 "avg_exploitability": self.exploitability(self.average.table()) if len(self.average) else None,
                 **self.extra(trainer, model, table)}
        self.points.append(point)
        return point


class AverageOpponent:
    """A scripted player of an evaluation's reach-weighted average policy: the learner plays against its own average,
    fictitious self-play in its exact tabular form (the recipes' ``--opponents average``).

    ``play`` turns a table into a scripted policy (the game's ``table_policy``); ``start`` is the table played before
    the first evaluation point joins the average (the uniform policy, say). The average is re-read whenever a point
    joins it, so the seat plays the same table between two evaluations. Set ``opponent.evaluation = evaluation``
    once the evaluation callback exists; until then the seat plays ``start``."""

    def __init__(self, play: Callable[[Mapping], Callable], start: Mapping):
        self.play, self.start = play, start
        self.evaluation: GameEvaluation | None = None
        self._points, self._policy = -1, None

    def __call__(self, turn) -> str:
        average = self.evaluation.average if self.evaluation is not None else None
        points = len(average) if average is not None else 0
        if points != self._points:
            self._points = points
            self._policy = self.play(average.table() if points else self.start)
        return self._policy(turn)
