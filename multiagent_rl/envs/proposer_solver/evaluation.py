"""Evaluating a proposer–solver run: the solver's held-out accuracy per difficulty, free-text proposal validity,
and the curriculum's curves and plot."""

from __future__ import annotations

import asyncio
import random
from typing import Any

from ...agents.agent import Agent, AgentConfig, single_turn
from ...tasks.task import Task, TaskData
from ..base import run_sync
from ..evaluation import PeriodicEvaluation
from . import last_integer, parse_proposal, proposer_prompt, solver_prompt
from .problems import LEVELS, make_problem


def held_out_problems(topic: str = "addition", per_level: int = 64, seed: int = 12345,
                      levels: list[int] | None = None) -> dict[int, list[tuple[str, int]]]:
    """A fixed evaluation set per level (1-digit sums have only 100 problems, so level 1's repeats)."""
    rng = random.Random(seed)
    return {level: [make_problem(topic, level, rng) for _ in range(per_level)] for level in (levels or sorted(LEVELS))}


def solve_accuracy(agent: Any, problems: dict[int, list[tuple[str, int]]], prompts: str = "short") -> dict[int, float]:
    """Accuracy per level of ``agent`` (e.g. greedy: ``sampling={"temperature": 0}``) on ``problems``, asked
    with the env's ``prompts`` wording."""
    async def one(problem: str, answer: int) -> float:
        trace = await single_turn(agent.interaction(Task(TaskData(prompt=solver_prompt(problem, prompts)))))
        return float(last_integer(trace.last_reply or "") == answer)

    async def all_levels() -> dict[int, float]:
        out = {}
        for level, items in problems.items():
            scores = await asyncio.gather(*(one(p, a) for p, a in items))
            out[level] = sum(scores) / len(scores)
        return out

    return run_sync(all_levels())


def free_text_validity(backend: Any, topic: str, n: int = 128, max_new_tokens: int = 40, prompts: str = "short",
                       temperature: float = 1.0) -> float:
    """The share of free-text proposals, sampled from ``backend`` at ``temperature``, that parse."""
    proposer = Agent(AgentConfig(model="policy", sampling={"max_new_tokens": max_new_tokens,
                                                           "temperature": temperature}), backend)
    prompt = proposer_prompt(topic, prompts)

    async def play():
        return await asyncio.gather(*(proposer.run(Task(TaskData(prompt=prompt))) for _ in range(n)))

    return sum(parse_proposal(t.last_reply or "") is not None for t in run_sync(play())) / n


class SolverEvaluation(PeriodicEvaluation):
    """Greedy solve accuracy per difficulty level on a fixed held-out set, before training and every ``every``
    steps (``eval/ps/accuracy_L...`` metrics, `points`); the validity of free-text proposals sampled from the policy
    (at ``temperature``) when the warm-up ends — before training when there is none — and after the last step.
    ``prompts`` and ``answer_tokens`` are the env's. Its state travels in checkpoints."""

    prefix = "eval/ps"

    def __init__(self, every: int, levels: list[int], topic: str, warmup_steps: int, per_level: int = 48,
                 prompts: str = "short", answer_tokens: int = 6, proposal_tokens: int = 40,
                 temperature: float = 1.0):
        super().__init__(every)  # accuracy on its own schedule; the warm-up's end measures validity only
        self.warmup_end, self.topic = warmup_steps, topic
        self.prompts, self.answer_tokens, self.proposal_tokens = prompts, answer_tokens, proposal_tokens
        self.temperature = temperature
        self.problems = held_out_problems(topic, per_level=per_level, levels=levels)
        self.validity_after_warmup: float | None = None
        self.validity_at_end: float | None = None

    def state_dict(self):
        return {**super().state_dict(), "validity_after_warmup": self.validity_after_warmup}

    def load_state_dict(self, state):
        super().load_state_dict(state)
        self.validity_after_warmup = state["validity_after_warmup"]

    def metric(self, key: str) -> str:
        return f"{self.prefix}/accuracy_{key}"

    def _backend(self, role: str):
        """The backend that plays ``role`` (its own policy's adapter when proposer and solver are separate learners)."""
        trainer = self.trainer
        return trainer.live_policies.get(role, trainer.live_policy())

    def validity(self) -> float:
        return free_text_validity(self._backend("proposer"), self.topic, max_new_tokens=self.proposal_tokens,
                                  prompts=self.prompts, temperature=self.temperature)

    def on_train_begin(self, args, state, control, **kwargs):
        resumed = bool(self.points)
        super().on_train_begin(args, state, control, **kwargs)
        if not resumed and self.warmup_end == 0 and self.validity_after_warmup is None:
            self.validity_after_warmup = self.validity()

    def on_step_end(self, args, state, control, **kwargs):
        step = state.global_step
        if step == self.warmup_end and self.validity_after_warmup is None:
            self.validity_after_warmup = self.validity()
            self.trainer.record_metric("eval/ps/free_text_validity", self.validity_after_warmup)
        if step == state.max_steps:
            self.validity_at_end = self.validity()
        super().on_step_end(args, state, control, **kwargs)

    def measure(self, step: int) -> dict[str, Any]:
        greedy = Agent(AgentConfig(model="policy", sampling={"temperature": 0.0, "max_new_tokens": self.answer_tokens}),
                       self._backend("solver"))
        return {f"L{level}": acc for level, acc in solve_accuracy(greedy, self.problems, self.prompts).items()}


def curves(log_history: list[dict], levels: list[int]) -> list[dict]:
    """Per logging step: validity, learnability (trained proposer and uniform probe), difficulty shares."""
    rows = []
    for h in log_history:
        if "loss" not in h:
            continue
        row = {"step": h["step"]}
        for env in ("curriculum", "uniform_probe", "warmup"):
            for algo in ("hierarchical_grpo", "untrained", "sft"):
                prefix = f"{env}/proposer/{algo}/"
                for key in ("valid", "learnability", "solve_rate"):
                    if prefix + key in h:
                        row[f"{env}/{key}"] = h[prefix + key]
                for level in levels:
                    if prefix + f"level_{level}" in h:
                        row[f"{env}/L{level}"] = h[prefix + f"level_{level}"]
        rows.append(row)
    return rows


def plot_curriculum(rows: list[dict], points: list[dict], levels: list[int], path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax1, ax2, ax3 = fig.subplots(1, 3)
    for env, style in (("curriculum", "-"), ("uniform_probe", "--")):
        xs = [r["step"] for r in rows if f"{env}/learnability" in r]
        ax1.plot(xs, [r[f"{env}/learnability"] for r in rows if f"{env}/learnability" in r], style,
                 label=f"learnability ({'proposer' if env == 'curriculum' else 'uniform proposer'})")
    xs = [r["step"] for r in rows if "curriculum/valid" in r]
    ax1.plot(xs, [r["curriculum/valid"] for r in rows if "curriculum/valid" in r], ":", label="validity")
    ax1.set_xlabel("step"), ax1.set_title("proposals"), ax1.legend(fontsize=7), ax1.set_ylim(-0.02, 1.05)
    xs = [r["step"] for r in rows if "curriculum/L1" in r]
    if xs:
        ax2.stackplot(xs, *[[r.get(f"curriculum/L{d}", 0) for r in rows if "curriculum/L1" in r] for d in levels],
                      labels=[f"level {d}" for d in levels])
        ax2.legend(fontsize=7, loc="lower left")
    ax2.set_xlabel("step"), ax2.set_title("proposed difficulty")
    for d in levels:
        ax3.plot([p["step"] for p in points], [p[f"L{d}"] for p in points], marker="o", ms=2, label=f"level {d}")
    ax3.set_xlabel("step"), ax3.set_title("solver held-out accuracy (greedy)"), ax3.legend(fontsize=7)
    ax3.set_ylim(-0.02, 1.02)
    fig.tight_layout()
    fig.savefig(path, format="png")




def evaluate(model, tokenizer, topic: str = "addition", per_level: int = 64, prompts: str = "short") -> dict[str, float]:
    """Greedy solve accuracy per level of a saved model as the solver, on the fixed held-out problems
    (``multiagent-rl eval proposer_solver --model PATH``)."""
    from ...backends import TransformersBackend

    backend = TransformersBackend(model.eval(), tokenizer, model_id="policy")
    solver = Agent(AgentConfig(model="policy", sampling={"temperature": 0.0, "max_new_tokens": 16}), backend)
    return {f"accuracy_level_{level}": value
            for level, value in solve_accuracy(solver, held_out_problems(topic, per_level), prompts).items()}
