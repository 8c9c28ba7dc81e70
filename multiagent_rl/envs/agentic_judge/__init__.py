"""Agentic judge: a solver writes code, unit tests score it, a judge with tools inspects it and may overrule.

One episode, as its rules:

1. A task is a small Python function ([`multiagent_rl.envs.agentic_judge.tasks`][]): a spec with authoritative
   examples, unit tests (some of them wrong or over-specified) and labelled candidate implementations.
2. The ``solver`` answers. ``solver_mode="choose"``: it picks one of the task's candidates (a letter, through
   the legal-action harness: the tiny model's game); ``"write"``: it writes the function (a real model).
3. Ground truth: the candidate's label, or in write mode the spec's examples checked against the code in a fresh
   workspace holding only ``solution.py``, before anything else of the solution has run.
4. The code goes into the episode's workspace as ``solution.py`` and the task's tests run on it in the sandbox
   ([`grading`][multiagent_rl.envs.agentic_judge.grading]: the runner, tests and examples are out of the
   solution's reach, and each call of its function runs in a process of its own): the task reward ``tests`` is the
   share of tests passed.
5. The ``judge`` gets the spec, the solver's whole transcript and the workspace, with tools (``list_files``,
   ``read_file``, ``run_tests``, ``check_examples``, ``run_python``: every command in the sandbox) through the
   tool harness, and ends with a verdict over the rubric ([`multiagent_rl.tools.rubric`][]). Its score in [0, 1] is the
   ``judge`` reward.
6. The solver's reward is ``task_weight × tests + judge_weight × judge``. The defaults (0, 1) let the judge
   overrule the tests entirely: a solution that fits a wrong test but breaks the spec earns nothing. Every reward
   is checked against ``reward_ranges`` ([0, 1] each): a value outside fails the episode instead of training on it.

A verdict that does not parse fails the episode (recorded with the judge's reply, never trained on) when
the judge is frozen, the default. A trained judge (``[env.roles.judge] model = "policy"``) is rewarded by
agreement with the ground truth (``1 − |score − correct|``; 0 for no verdict), and when it gives none the
solver is scored by the tests alone.

Metrics on the solver's trace: ``tests`` (share passed), ``tests_pass`` (all passed), ``judge_score``,
``judged_pass`` (the best verdict on every criterion), ``correct`` (ground truth), ``fooled_tests`` (all tests
pass yet incorrect), ``tricky``; on the judge's: ``tool_calls``, ``tool_errors``, ``commands_killed``, ``agrees``.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import re
import string
from typing import Any

from ...tasks.task import Task, TaskData
from ...tools import tool_call_text
from ...tools.rubric import Rubric, VerdictError
from ...tools.sandbox import Sandbox, SandboxConfig, Workspace, WorkspaceEscape
from ..base import Env
from ..registry import register_env
from .grading import CALL_TIMEOUT, grade, task_files
from .tasks import CODE_TASKS, CodeTask, code_task, spec_text

ROLES = ("solver", "judge")
LETTERS = string.ascii_uppercase

def solver_prompt(task: CodeTask, mode: str) -> str:
    if mode == "write":
        return f"Write the Python function.\n{spec_text(task)}\nReply with the code in a ```python block."
    listing = "\n".join(f"{LETTERS[i]}:\n{c.source}" for i, c in enumerate(task.candidates))
    return f"Pick the correct implementation.\n{spec_text(task)}\nCandidates:\n{listing}Answer with its letter."


def extract_code(reply: str) -> str:
    """The last ```python block of a reply (or the whole reply when it has none)."""
    blocks = re.findall(r"```(?:python|py)?\s*\n(.*?)```", reply, re.DOTALL)
    return (blocks[-1] if blocks else reply).strip() + "\n"


@register_env("agentic_judge")
class AgenticJudgeEnv(Env):
    """Seats ``solver`` and ``judge``; a task is one code task
    ([`CODE_TASKS`][multiagent_rl.envs.agentic_judge.tasks.CODE_TASKS])."""

    name = "agentic_judge"
    roles = ROLES
    default_harness = {"judge": {"id": "tools", "max_turns": 2, "max_tool_rounds": 6}}
    reward_ranges = {"tests": (0.0, 1.0), "judge": (0.0, 1.0), "agreement": (0.0, 1.0)}

    def __init__(self, tasks: list[str] | None = None, solver_mode: str = "choose", task_weight: float = 0.0,
                 judge_weight: float = 1.0, rubric: dict | Rubric | None = None,
                 sandbox: dict | SandboxConfig | None = None, solver_tokens: int = 512, judge_tokens: int = 1024,
                 call_timeout: float = CALL_TIMEOUT, transcript_chars: int = 4000):
        if solver_mode not in ("choose", "write"):
            raise ValueError(f"solver_mode={solver_mode!r}: 'choose' (pick a candidate) or 'write' (write the code)")
        if task_weight < 0 or judge_weight < 0 or task_weight + judge_weight == 0:
            raise ValueError(f"task_weight={task_weight}, judge_weight={judge_weight}: non-negative, not both 0")
        if call_timeout <= 0:
            raise ValueError(f"call_timeout={call_timeout}: seconds one call of the solution may take, > 0")
        self.tasks = tuple(code_task(t) for t in tasks) if tasks else CODE_TASKS
        self.solver_mode, self.task_weight, self.judge_weight = solver_mode, task_weight, judge_weight
        self.rubric = rubric if isinstance(rubric, Rubric) else (Rubric(**rubric) if rubric else Rubric.default())
        self.sandbox_config = sandbox if isinstance(sandbox, SandboxConfig) else SandboxConfig(**(sandbox or {}))
        self.solver_tokens, self.judge_tokens, self.call_timeout = solver_tokens, judge_tokens, call_timeout
        self.transcript_chars = transcript_chars

    def sample_tasks(self, num: int, rng: random.Random) -> list[Task]:
        chosen = [rng.choice(self.tasks) for _ in range(num)]
        return [Task(TaskData(prompt=solver_prompt(t, self.solver_mode), info={"task_id": t.id})) for t in chosen]

    async def run(self, task: Task, agents) -> None:
        code = code_task(task.data.info["task_id"])
        with self.sandbox_config.workspace(prefix="judge-") as ws:
            sandbox = Sandbox(ws, self.sandbox_config)
            solver, truth = await self._solve(agents["solver"], task, code, ws)
            tests = await grade(sandbox, code, "tests", self.call_timeout)
            judge, score = await self._judge(agents["judge"], code, solver, ws, sandbox, truth)
        m = solver.metrics
        m.update(tests=tests.share, tests_pass=float(tests.all_passed), correct=float(truth),
                 fooled_tests=float(tests.all_passed and not truth), tricky=float(code.tricky))
        solver.info["agentic_judge"] = {"task_id": code.id, "tests": tests.passed, "correct": truth,
                                        "graded": tests.complete}
        if score is None:  # a trained judge gave no verdict: the tests alone score the solver
            solver.add_reward("tests", tests.share)
            return
        m.update(judge_score=score, judged_pass=float(score == 1.0))
        solver.add_reward("tests", tests.share, weight=self.task_weight)
        solver.add_reward("judge", score, weight=self.judge_weight)

    # -- the solver ------------------------------------------------------------------------------
    async def _solve(self, seat, task: Task, code: CodeTask, ws: Workspace):
        choose = self.solver_mode == "choose"
        state = {"task_id": code.id, "function": code.function, "examples": code.examples}
        async with seat.interaction(task, max_new_tokens=self.solver_tokens) as it:
            choices = tuple(LETTERS[i] for i in range(len(code.candidates))) if choose else None
            reply = await it.send(state=state, choices=choices)
        if choose:
            candidate = code.candidates[LETTERS.index(reply.strip())]
            source, truth = candidate.source, candidate.correct
            it.trace.metrics["candidate"] = float(LETTERS.index(reply.strip()))
        else:
            source = extract_code(reply)
            truth = await self._ground_truth(code, source)
        ws.write("solution.py", source)
        return it.trace, truth

    async def _ground_truth(self, code: CodeTask, source: str) -> bool:
        """All the spec's examples met, checked in a fresh workspace holding only the code: nothing the solution
        leaves behind in the episode's workspace can run before or during this check."""
        with self.sandbox_config.workspace(prefix="truth-") as fresh:
            fresh.write("solution.py", source)
            checked = await grade(Sandbox(fresh, self.sandbox_config), code, "examples", self.call_timeout)
        return checked.all_passed

    # -- the judge -------------------------------------------------------------------------------
    async def _judge(self, seat, code: CodeTask, solver, ws: Workspace, sandbox: Sandbox, truth: bool):
        prompt = judge_prompt(code, solver.messages, self.rubric, self.transcript_chars)
        state = {"task_id": code.id, "examples": code.examples, "rubric": self.rubric}
        tools = judge_tools(ws, sandbox, code, self.call_timeout)
        async with seat.interaction(Task(TaskData(prompt=prompt)), tools=tools, max_new_tokens=self.judge_tokens) as it:
            reply = await it.send(state=state)
        trace = it.trace
        calls = trace.info.get("tool_calls", [])
        trace.metrics.update(tool_calls=float(len(calls)), tool_errors=float(sum(not c["ok"] for c in calls)),
                             commands_killed=float(sum(bool(c.get("killed")) for c in calls)))
        try:
            verdicts = self.rubric.parse(reply)
        except VerdictError as exc:
            if not seat.trainable:
                raise VerdictError(f"judge: {exc}") from None
            trace.add_reward("agreement", 0.0)
            trace.metrics["verdict"] = 0.0
            return trace, None
        score = self.rubric.score(verdicts)
        trace.info["verdicts"] = {name: v.verdict for name, v in verdicts.items()}
        trace.metrics.update(verdict=1.0, agrees=float((score == 1.0) == truth))
        if seat.trainable:
            trace.add_reward("agreement", 1.0 - abs(score - float(truth)))
        return trace, score


def judge_prompt(code: CodeTask, transcript: list[dict[str, Any]], rubric: Rubric, max_chars: int = 4000) -> str:
    """The judge's first message: the spec, the solver's transcript (each message cut to ``max_chars``: the code is
    in the workspace), what the workspace holds, and the rubric."""

    def cut(text: str) -> str:
        return text if len(text) <= max_chars else text[:max_chars] + f"\n[... {len(text) - max_chars} characters cut]"

    shown = "\n".join(f"[{m['role']}] {cut(m['content'])}" for m in transcript if m["role"] != "system")
    return (f"You judge a solver's work.\nThe task:\n{spec_text(code)}\nThe solver's transcript:\n{shown}\n"
            "The workspace holds solution.py (the solver's code). The task's files are read-only: /task/SPEC.md, "
            "/task/examples.json and /task/test_solution.py (unit tests, which may be wrong or demand more than the "
            "spec). Use the tools to look and run code.\n" + rubric.instructions())


def judge_tools(ws: Workspace, sandbox: Sandbox, code: CodeTask, call_timeout: float = CALL_TIMEOUT) -> list:
    """The judge's tools, bound to this episode's workspace; every command runs in the sandbox, and host-side file
    access never blocks, follows a link or leaves the workspace."""
    files = task_files(code)

    async def list_files() -> str:
        """List the files in the workspace and the task's read-only files."""
        listing = await asyncio.to_thread(ws.listing)
        return "\n".join([listing, *files]).strip()

    async def read_file(path: str) -> str:
        """Read a text file of the workspace, or one of the task's files under /task.

        Args:
            path: The file's path, relative to the workspace (or /task/...).
        """
        if path in files or "/" + path in files:
            return files[path if path in files else "/" + path]
        if path.startswith("/task"):
            raise WorkspaceEscape(f"{path!r}: the task's files are {', '.join(files)}")
        return await asyncio.to_thread(ws.read, path, 20_000)

    async def run_tests():
        """Run the unit tests against solution.py (the function runs in a process of its own); a line per test."""
        graded = await grade(sandbox, code, "tests", call_timeout)
        return dataclasses.replace(graded.result, stdout=graded.report, stderr="")

    async def check_examples():
        """Check the spec's examples against solution.py, comparing results by type and value; a line per example."""
        graded = await grade(sandbox, code, "examples", call_timeout)
        return dataclasses.replace(graded.result, stdout=graded.report, stderr="")

    async def run_python(code: str):
        """Run a Python program in the workspace (no network; files outside the workspace are read-only or absent).

        Args:
            code: The program's source; `from solution import *` reaches the solver's code.
        """
        # -I: nothing the solution planted (usercustomize, sitecustomize, a module named like the standard
        # library's) runs first; the workspace goes last on the path so that `import solution` still works.
        return await sandbox.run(["python3", "-I", "-c", "import os, sys; sys.path.append(os.getcwd())\n" + code])

    return [list_files, read_file, run_tests, check_examples, run_python]


# -- scripted players -------------------------------------------------------------------------------


def random_solver():
    """Picks a uniformly random candidate (choose mode)."""

    def act(turn) -> str:
        return turn.rng.choice(turn.choices)

    return act


def labelled_solver(correct: bool = True):
    """Picks a candidate with the given ground-truth label (for tests and warm-ups; it reads the labels)."""

    def act(turn) -> str:
        candidates = code_task(turn.state["task_id"]).candidates
        picks = [LETTERS[i] for i, c in enumerate(candidates) if c.correct == correct]
        return turn.rng.choice(picks)

    return act


def code_solver(source: str):
    """Writes the given source, whatever the task (write mode; e.g. an attack in the tests)."""

    def act(turn) -> str:
        return f"```python\n{source}```"

    return act


def examples_judge():
    """Checks the spec's examples against solution.py (one ``check_examples`` call) and gives the best verdict when
    all are met, the worst when none is, the middle otherwise: the spec decides, never the tests."""

    def act(turn) -> str:
        results = [m for m in turn.messages if m["role"] == "tool"]
        if not results:
            return "I check the spec's examples.\n" + tool_call_text("check_examples")
        rubric: Rubric = turn.state["rubric"]
        met = _examples_met(results[-1]["content"])
        total = len(turn.state["examples"])
        verdict = {}
        for c in rubric.criteria:
            verdict[c.name] = (c.choices[-1] if met == total else c.choices[0] if met == 0
                               else c.choices[len(c.choices) // 2])
        return rubric.verdict_text(verdict, reason=f"{met}/{total} examples met")

    return act


def hostile_solver():
    """Writes, task after task, a solution that attacks the host or its grade instead of solving anything (write
    mode): the attacks of ``ATTACKS`` in turn, each named in the code's first line (``# attack: NAME``), for runs
    that check the sandbox and the grading hold."""

    names, turns = sorted(ATTACKS), itertools.count()

    def act(turn) -> str:
        name = names[next(turns) % len(names)]
        return f"```python\n# attack: {name}\n{ATTACKS[name].replace('FUNCTION', turn.state['function'])}```"

    return act


def _examples_met(output: str) -> int:
    return sum(line.startswith("PASS ") for line in output.splitlines())


from .attacks import ATTACKS  # noqa: E402 - data, after the players that use it

__all__ = ["ATTACKS", "AgenticJudgeEnv", "code_solver", "examples_judge", "extract_code", "hostile_solver",
           "judge_prompt", "judge_tools", "labelled_solver", "random_solver", "solver_prompt", "spec_text"]
