"""Proposer–solver: a proposer writes a problem, ``n`` solvers try it, learnability steers the curriculum.

One episode, as its rules:

1. The ``proposer`` gets a seed topic (an arithmetic family, [`multiagent_rl.envs.proposer_solver.problems`][]) and must
   end its reply with one JSON object ``{"problem": "...", "answer": <int>}`` (code fences and whitespace
   are tolerated; extra keys such as ``"difficulty"`` are allowed). A reply that does not — or, with
   ``verify=True``, whose answer is not the problem's value — is invalid: the proposer gets 0 and no
   solver runs.
2. ``solvers`` seats (default 4) answer the problem concurrently; a solver gets 1 if the last integer in
   its reply equals the proposed answer, else 0.
3. With p the solvers' solve rate, the proposer gets ``learnability`` 4p(1−p) (default), ``absolute_zero``
   1 − p (0 when p = 0) or ``r_zero`` min(p, 1 − p) ([`multiagent_rl.envs.proposer_solver.rewards.PROPOSER_REWARDS`][]).

``prompts`` chooses the wording: ``"short"`` (the default, what the tiny model is trained on) or
``"instructed"`` for a pretrained chat model in free text: the proposer is shown the JSON form with a worked
example, the solver is asked for the number only (`PROMPTS`). The example is drawn per task from its seed
(a random level), and a proposal that repeats the shown example is invalid (metric ``copied_example``): a
fixed example is a proposal the model can copy for reward, and a copied problem teaches the solvers nothing.

``menu=True`` constrains the proposal to a menu: one correct problem per difficulty level, generated from
the task's seed and rendered as ``{"difficulty": d, "problem": "...", "answer": ...}``; the proposer's
choice is then a choice of difficulty (the legal-action harness: the difficulty digit is its one free
token). This is how a tiny model can run the curriculum on a CPU; a real model proposes in free text.

Metrics on the proposer's trace: ``valid``, ``solve_rate``, ``learnability``, ``difficulty`` and a one-hot
``level_d`` (their means are the validity, the mean learnability and the distribution of proposed
difficulty); on each solver's: ``correct`` and ``difficulty``. Default algorithm: ``hierarchical_grpo``
with ``episode_group_roles = ["solver"]`` (solvers baselined within their episode, proposers across the
task group).
"""

from __future__ import annotations

import asyncio
import json
import random
import re

from ...tasks.task import Task, TaskData
from ...tools.text import last_json_object
from ..base import Env
from ..registry import register_env
from .problems import LEVELS, TOPICS, evaluate, level_of, make_problem
from .rewards import PROPOSER_REWARDS, learnability

ROLES = ("proposer", "solver")
PROMPTS = ("short", "instructed")
"""The prompt wordings: terse (the tiny model's) or explicit about the format (a pretrained chat model's)."""


def proposer_prompt(topic: str, prompts: str = "short", example: str | None = None) -> str:
    """What the proposer is asked (``prompts``: one of `PROMPTS`; ``example``: the worked example the
    ``"instructed"`` wording shows, by default ``12 + 7`` with the topic's first operator)."""
    if _check_prompts(prompts) == "short":
        return f"Propose a {topic} problem for the solvers. End with JSON: problem and answer."
    example = example or f"12 {TOPICS[topic][0]} 7"
    return (f"Write a new {topic} problem for a student, with its answer, as one line of JSON like "
            f"{proposal_text(example, evaluate(example))}. Do not repeat this example.")


def solver_prompt(problem: str, prompts: str = "short") -> str:
    """What each solver is asked (``prompts``: one of `PROMPTS`)."""
    if _check_prompts(prompts) == "short":
        return f"Solve: {problem} = ?"
    return f"What is {problem}? Reply with the number only."


def _check_prompts(prompts: str) -> str:
    if prompts not in PROMPTS:
        raise ValueError(f"prompts={prompts!r}: one of {', '.join(map(repr, PROMPTS))} ('instructed' for a "
                         f"pretrained chat model in free text)")
    return prompts


def proposal_text(problem: str, answer: int, difficulty: int | None = None) -> str:
    """A proposal as the proposer writes it (the menu's form carries the difficulty first)."""
    fields = ({"difficulty": difficulty} if difficulty is not None else {}) | {"problem": problem, "answer": answer}
    return json.dumps(fields)


def parse_proposal(reply: str) -> tuple[str, int] | None:
    """``(problem, answer)`` from a reply that ends with one JSON object, or None when it does not."""
    obj = last_json_object(reply)
    if not isinstance(obj, dict):
        return None
    problem, answer = obj.get("problem"), obj.get("answer")
    if isinstance(problem, str) and problem.strip() and type(answer) is int:
        return problem.strip(), answer
    return None


def last_integer(reply: str) -> int | None:
    """The last integer in a reply (a solver's answer), or None."""
    found = re.findall(r"-?\d+", reply)
    return int(found[-1]) if found else None


@register_env("proposer_solver")
class ProposerSolverEnv(Env):
    """Seats ``proposer`` and ``solver`` (played ``solvers`` times per episode); a task is a seed topic."""

    name = "proposer_solver"
    roles = ROLES
    default_algo = {"type": "hierarchical_grpo", "episode_group_roles": ["solver"]}

    def __init__(self, solvers: int = 4, reward: str = "learnability", verify: bool = False, menu: bool = False,
                 topics: list[str] | tuple[str, ...] = ("addition",), levels: list[int] | None = None,
                 proposal_tokens: int = 64, answer_tokens: int = 6, prompts: str = "short"):
        if solvers < 1:
            raise ValueError(f"solvers={solvers}: at least one solver")
        if reward not in PROPOSER_REWARDS:
            raise ValueError(f"reward={reward!r}: one of {', '.join(PROPOSER_REWARDS)}")
        unknown = [t for t in topics if t not in TOPICS]
        if unknown or not topics:
            raise ValueError(f"topics {unknown or topics}: choose from {', '.join(TOPICS)}")
        self.levels = sorted(levels or LEVELS)
        if not set(self.levels) <= set(LEVELS):
            raise ValueError(f"levels {self.levels}: choose from {sorted(LEVELS)}")
        self.solvers, self.reward, self.verify, self.menu = solvers, PROPOSER_REWARDS[reward], verify, menu
        self.topics, self.proposal_tokens, self.answer_tokens = tuple(topics), proposal_tokens, answer_tokens
        self.prompts = _check_prompts(prompts)

    def sample_tasks(self, num: int, rng: random.Random) -> list[Task]:
        tasks = []
        for _ in range(num):
            topic, seed = rng.choice(self.topics), rng.randrange(2**31)
            info = {"topic": topic, "seed": seed}
            if self.prompts == "instructed":
                info["example"] = self.example_for(topic, seed)
            tasks.append(Task(TaskData(prompt=proposer_prompt(topic, self.prompts, info.get("example")), info=info)))
        return tasks

    def example_for(self, topic: str, seed: int) -> str:
        """The worked example an ``"instructed"`` proposer prompt shows: a problem of a random level, drawn
        from the task's seed (a different stream from the menu's)."""
        rng = random.Random(f"example-{seed}")
        return make_problem(topic, rng.choice(self.levels), rng)[0]

    def menu_for(self, task: Task) -> list[str]:
        """The task's menu: one problem per level, the same for every episode of the task."""
        rng = random.Random(task.data.info["seed"])
        topic = task.data.info["topic"]
        return [proposal_text(*make_problem(topic, level, rng), difficulty=level) for level in self.levels]

    async def run(self, task: Task, agents) -> None:
        info = task.data.info
        async with agents["proposer"].interaction(task, max_new_tokens=self.proposal_tokens) as it:
            choices = self.menu_for(task) if self.menu else None
            reply = await it.send(state={"topic": info["topic"], "levels": self.levels}, choices=choices)
        proposer = it.trace
        proposal = parse_proposal(reply)
        copied = proposal is not None and _same_problem(proposal[0], info.get("example"))
        valid = proposal is not None and not copied and (not self.verify or _value(proposal[0]) == proposal[1])
        proposer.metrics["valid"] = float(valid)
        if "example" in info:
            proposer.metrics["copied_example"] = float(copied)
        if not valid:
            proposer.add_reward("proposal", 0.0)
            return
        problem, answer = proposal
        level = level_of(problem)
        solved = await asyncio.gather(*(self._solve(agents["solver"], problem, answer, level, k)
                                        for k in range(self.solvers)))
        p = sum(solved) / len(solved)
        proposer.add_reward("proposal", self.reward(p))
        proposer.metrics.update(solve_rate=p, learnability=learnability(p))
        if level is not None:
            proposer.metrics["difficulty"] = float(level)
            proposer.metrics.update({f"level_{d}": float(d == level) for d in self.levels})
        proposer.info["proposer_solver"] = {"problem": problem, "answer": answer, "level": level}

    async def _solve(self, seat, problem: str, answer: int, level: int | None, k: int) -> float:
        task = Task(TaskData(prompt=solver_prompt(problem, self.prompts), answer=str(answer), info={"level": level}))
        async with seat.interaction(task, max_new_tokens=self.answer_tokens) as it:
            reply = await it.send(state={"problem": problem, "level": level})
        correct = float(last_integer(reply) == answer)
        it.trace.add_reward("correct", correct)
        it.trace.metrics["correct"] = correct
        if level is not None:
            it.trace.metrics["difficulty"] = float(level)
        return correct


def _same_problem(problem: str, example: str | None) -> bool:
    """Whether a proposed problem is the shown example up to whitespace."""
    return example is not None and re.sub(r"\s+", "", problem) == re.sub(r"\s+", "", example)


def _value(problem: str) -> int | None:
    try:
        return evaluate(problem)
    except ValueError:
        return None


# -- scripted players -------------------------------------------------------------------------------


def uniform_proposer():
    """Proposes a problem of uniformly random difficulty: a random menu entry, or (free text) a fresh problem."""

    def act(turn) -> str:
        if turn.choices:
            return turn.rng.choice(turn.choices)
        level = turn.rng.choice(turn.state["levels"])
        problem, answer = make_problem(turn.state["topic"], level, turn.rng)
        return proposal_text(problem, answer)

    return act


def guessing_solver():
    """Replies with a random integer between 0 and twice the problem's largest number: the answer format,
    no arithmetic (a warm-up teacher)."""

    def act(turn) -> str:
        numbers = [int(n) for n in re.findall(r"\d+", turn.state["problem"])]
        return str(turn.rng.randint(0, 2 * max(numbers, default=9)))

    return act


def accurate_solver(accuracy: float = 1.0):
    """Replies with the right answer with probability ``accuracy``, else a wrong one (tests, baselines)."""

    def act(turn) -> str:
        answer = evaluate(turn.state["problem"])
        return str(answer if turn.rng.random() < accuracy else answer + turn.rng.randint(1, 9))

    return act
