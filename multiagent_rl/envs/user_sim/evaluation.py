"""Evaluating a simulated-user run: the assistant's success on held-out scenarios, per persona, and the plot."""

from __future__ import annotations

import random
from collections import defaultdict
from typing import Any

from ...agents.agent import Agent, AgentConfig, make_agent
from ...tasks.task import Task
from ..base import play_episodes, run_sync
from ..evaluation import PeriodicEvaluation
from . import PERSONAS, UserSimEnv, scripted_user


def held_out_scenarios(env: UserSimEnv, per_persona: int = 16, seed: int = 4242) -> list[Task]:
    """A fixed set of scenarios on goals never used in training (``env`` built with ``split="held_out"``)."""
    rng = random.Random(seed)
    return [env.scenario(rng.choice(env.goals), persona, rng.randrange(2**31))
            for persona in env.personas for _ in range(per_persona)]


def success_by_persona(assistant: Any, env: UserSimEnv, tasks: list[Task], user: Any = None) -> dict[str, float]:
    """The assistant's success rate per persona on ``tasks`` against the scripted user (or ``user``)."""
    user = user or make_agent(AgentConfig(model="scripted", policy=scripted_user()))
    episodes = run_sync(play_episodes(env, tasks, {"user": user, "assistant": assistant}, seed="eval",
                                      trainable={"user": False, "assistant": False}))
    by: dict[str, list[float]] = defaultdict(list)
    for ep, task in zip(episodes, tasks):
        traces = ep.by_role("assistant") if ep.ok else []
        by[task.data.info["persona"]].append(traces[0].metrics["success"] if traces else 0.0)
    out = {p: sum(v) / len(v) for p, v in by.items()}
    out["all"] = sum(sum(v) for v in by.values()) / sum(len(v) for v in by.values())
    return out


class UserSimEvaluation(PeriodicEvaluation):
    """Greedy success per persona on held-out scenarios before training (``at_start``), at the end of the warm-up,
    every ``every`` steps after it and after the last step (``eval/us/success_...`` metrics, `points`). Its state
    travels in checkpoints."""

    prefix = "eval/us"

    def __init__(self, every: int, warmup_steps: int, per_persona: int = 16, menu: bool = True,
                 personas: tuple[str, ...] = PERSONAS, max_turns: int = 6, reply_tokens: int = 24,
                 at_start: bool = False):
        super().__init__(every, warmup_steps, at_start=at_start, during_warmup=False)
        self.reply_tokens = reply_tokens
        self.env = UserSimEnv(personas=personas, menu=menu, split="held_out", max_turns=max_turns)
        self.tasks = held_out_scenarios(self.env, per_persona)

    def metric(self, key: str) -> str:
        return f"{self.prefix}/success_{key}"

    def measure(self, step: int) -> dict[str, Any]:
        greedy = Agent(AgentConfig(model="policy", sampling={"temperature": 0.0, "max_new_tokens": self.reply_tokens}),
                       self.trainer.live_policy())
        return success_by_persona(greedy, self.env, self.tasks)


def plot_user_sim(points: list[dict], warmup_steps: int, path: str, title: str = "") -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    for key in (*PERSONAS, "all"):
        xs = [p["step"] for p in points if key in p]
        ax.plot(xs, [p[key] for p in points if key in p], "-o" if key == "all" else "-", markersize=3, label=key,
                linewidth=2.5 if key == "all" else 1.2)
    ax.axvline(warmup_steps, color="gray", linestyle=":", label="end of warm-up")
    ax.set_xlabel("step")
    ax.set_ylabel("held-out success (greedy)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.savefig(path, bbox_inches="tight")


def evaluate(model, tokenizer, per_persona: int = 16, max_turns: int = 6, menu: bool = True) -> dict[str, float]:
    """Greedy booking success per persona of a saved model as the assistant, on held-out scenarios against the
    scripted user (``multiagent-rl eval user_sim --model PATH``)."""
    from ...backends import TransformersBackend

    env = UserSimEnv(split="held_out", menu=menu, max_turns=max_turns)
    backend = TransformersBackend(model.eval(), tokenizer, model_id="policy")
    assistant = Agent(AgentConfig(model="policy", sampling={"temperature": 0.0}), backend)
    return success_by_persona(assistant, env, held_out_scenarios(env, per_persona))
