"""Evaluating a judge: on held-out tasks, does it call its tools, give a verdict that parses, and agree with the labels?

Every candidate implementation of each held-out task is judged once, greedily, by the judge under test with its real
tools in the sandbox; the candidates' ground-truth labels are the oracle. Training draws from the other tasks
([`training_tasks`][multiagent_rl.envs.agentic_judge.evaluation.training_tasks]).

```pycon
>>> from multiagent_rl.envs.agentic_judge.evaluation import HELD_OUT_TASKS, held_out_cases
>>> len(HELD_OUT_TASKS), len(held_out_cases())
(6, 20)

```
"""

from __future__ import annotations

from typing import Any

from ...agents.agent import Agent, AgentConfig, make_agent
from ...tasks.task import Task, TaskData
from ..base import play_episodes, run_sync
from ..evaluation import PeriodicEvaluation
from . import LETTERS, AgenticJudgeEnv, solver_prompt
from .tasks import CODE_TASKS, code_task

HELD_OUT_TASKS = tuple(sorted(t.id for t in CODE_TASKS)[::5])
"""Every fifth task by name (two of them tricky: a wrong test, and a wrong candidate that passes every test); a judge
trained by the recipe never sees them."""


def training_tasks() -> list[str]:
    """The tasks a judge trains on: all but [`HELD_OUT_TASKS`][multiagent_rl.envs.agentic_judge.evaluation.HELD_OUT_TASKS]."""
    return [t.id for t in CODE_TASKS if t.id not in HELD_OUT_TASKS]


def held_out_cases(task_ids: tuple[str, ...] = HELD_OUT_TASKS) -> list[Task]:
    """One case per candidate of each task: the solver's task with the candidate to submit in ``info``."""
    return [Task(TaskData(prompt=solver_prompt(code, "choose"), info={"task_id": code.id, "candidate": LETTERS[i]}))
            for code in map(code_task, task_ids) for i in range(len(code.candidates))]


def case_solver():
    """Submits the candidate its case names (``task.info["candidate"]``), so every candidate is judged once."""

    def act(turn) -> str:
        return turn.task.data.info["candidate"]

    return act


def judge_report(judge: Agent, cases: list[Task] | None = None, judge_tokens: int = 256) -> dict[str, Any]:
    """The judge's record on ``cases`` (default: every held-out candidate): the share of verdicts that parse, tool
    calls per case and the share that ran without error, agreement with the label (``1 − |score − correct|``, 0
    without a verdict) and exact agreement (a verdict of "correct" exactly when the label is); and the episodes that
    failed, which count as no verdict."""
    cases = held_out_cases() if cases is None else cases
    env = AgenticJudgeEnv(judge_tokens=judge_tokens)
    solver = make_agent(AgentConfig(model="scripted", policy=case_solver()))
    # trainable: the judge is scored (no verdict is a 0), not failed as a frozen judge's would be
    episodes = run_sync(play_episodes(env, cases, {"solver": solver, "judge": judge}, seed="eval",
                                      trainable={"solver": False, "judge": True}))
    verdicts = agreement = agrees = calls = errors = 0.0
    failed = 0
    for ep in episodes:
        traces = ep.by_role("judge") if ep.ok else []
        if not traces:
            failed += 1
            continue
        m = traces[0].metrics
        verdicts += m.get("verdict", 0.0)
        agreement += traces[0].reward
        agrees += m.get("agrees", 0.0)
        calls += m.get("tool_calls", 0.0)
        errors += m.get("tool_errors", 0.0)
    n = len(episodes)
    return {"cases": n, "failed": failed, "verdict": verdicts / n, "agreement": agreement / n, "agrees": agrees / n,
            "tool_calls": calls / n, "tool_calls_ok": (calls - errors) / calls if calls else None}


def greedy_judge(backend, judge_tokens: int = 256) -> Agent:
    """The judge seat's agent (its tools harness) sampling greedily from ``backend``."""
    return Agent(AgentConfig(model="policy", harness=AgenticJudgeEnv.default_harness["judge"],
                             sampling={"temperature": 0.0, "max_new_tokens": judge_tokens}), backend)


class JudgeEvaluation(PeriodicEvaluation):
    """[`judge_report`][multiagent_rl.envs.agentic_judge.evaluation.judge_report] of the trained judge, greedy, before
    the first step (``at_start``), at the end of the warm-up, every ``every`` steps and after the last (``points``;
    ``eval/judge/...`` metrics). Its state travels in checkpoints."""

    prefix = "eval/judge"

    def __init__(self, every: int, warmup_steps: int = 0, judge_tokens: int = 256, at_start: bool = True):
        super().__init__(every, warmup_steps, at_start=at_start)
        self.judge_tokens = judge_tokens

    def measure(self, step: int) -> dict[str, Any]:
        return judge_report(greedy_judge(self.trainer.live_policy(), self.judge_tokens), judge_tokens=self.judge_tokens)


def evaluate(model, tokenizer, judge_tokens: int = 256) -> dict[str, Any]:
    """A saved model as the judge on every held-out candidate, greedy (``multiagent-rl eval agentic_judge --model
    PATH``)."""
    from ...backends import TransformersBackend

    backend = TransformersBackend(model.eval(), tokenizer, model_id="policy")
    return judge_report(greedy_judge(backend, int(judge_tokens)), judge_tokens=int(judge_tokens))
