"""Agentic judge: a solver writes code, unit tests score it, a judge with tools inspects it and may overrule.

One episode, as its rules:

1. A task is a small Python function ([`multiagent_rl.games.code_tasks`][]): a spec with authoritative
   examples, unit tests (some of them wrong or over-specified) and labelled candidate implementations.
2. The ``solver`` answers. ``solver_mode="choose"``: it picks one of the task's candidates (a letter, through
   the legal-action harness: the tiny model's game); ``"write"``: it writes the function (a real model).
3. Its code goes into a fresh workspace (``solution.py``, next to ``test_solution.py``, ``run_tests.py`` and
   ``SPEC.md`` and ``examples.json``) and the tests run in the sandbox ([`multiagent_rl.sandbox`][]): the task reward
   ``tests`` is the share of tests passed.
4. The ``judge`` gets the spec, the solver's whole transcript and the workspace, with tools (``list_files``,
   ``read_file``, ``run_tests``, ``run_python``: every command in the sandbox) through the tool harness, and
   ends with a verdict over the rubric ([`multiagent_rl.rubric`][]). Its score in [0, 1] is the ``judge``
   reward.
5. The solver's reward is ``task_weight × tests + judge_weight × judge``. The defaults (0, 1) let the judge
   overrule the tests entirely: a solution that fits a wrong test but breaks the spec earns nothing.

A verdict that does not parse fails the episode (recorded with the judge's reply, never trained on) when
the judge is frozen, the default. A trained judge (``[env.roles.judge] model = "policy"``) is rewarded by
agreement with the ground truth (``1 − |score − correct|``; 0 for no verdict), and when it gives none the
solver is scored by the tests alone.

Metrics on the solver's trace: ``tests`` (share passed), ``tests_pass`` (all passed), ``judge_score``,
``judged_pass`` (the best verdict on every criterion), ``correct`` (ground truth: the candidate's label, or
in write mode all examples met, checked in the sandbox), ``fooled_tests`` (all tests pass yet incorrect),
``tricky``; on the judge's: ``tool_calls``, ``tool_errors``, ``commands_killed``, ``agrees``.
"""

from __future__ import annotations

import json
import random
import re
import secrets
import string
from typing import Any

from ..env import Env
from ..games.code_tasks import CODE_TASKS, CodeTask, code_task
from ..rubric import Rubric, VerdictError
from ..sandbox import Sandbox, SandboxConfig, Workspace
from ..task import Task, TaskData
from ..tools import tool_call_text

ROLES = ("solver", "judge")
LETTERS = string.ascii_uppercase

# Runs each test in a fresh namespace holding the solution; prints one line: a marker (read from stdin before
# any solution code runs, so a solution cannot simply print a fake result line) and the results as JSON.
RUN_TESTS = '''\
import json, sys, traceback
marker = sys.stdin.readline().strip()
solution, tests = open("solution.py").read(), open("test_solution.py").read()
names = [line[4:line.index("(")] for line in tests.splitlines() if line.startswith("def test_")]
results = {}
for name in names:
    namespace = {}
    try:
        exec(solution, namespace)
        exec(tests, namespace)
        namespace[name]()
        results[name] = True
    except BaseException:
        traceback.print_exc(limit=1)
        results[name] = False
print(marker + json.dumps(results))
'''

# The spec's examples (authoritative) checked against solution.py: a scripted judge and the write mode's ground
# truth run it in the sandbox; examples.json in the workspace holds the [call, expected] pairs.
CHECK_EXAMPLES = """import ast, json
results = {}
for call, expected in json.load(open("examples.json")):
    namespace = {}
    try:
        exec(open("solution.py").read(), namespace)
        results[call] = eval(call, namespace) == ast.literal_eval(expected)
    except BaseException:
        results[call] = False
print(json.dumps(results))
"""


def spec_text(task: CodeTask) -> str:
    examples = "\n".join(f"{call} == {expected}" for call, expected in task.examples)
    return f"{task.spec}\nExamples (authoritative):\n{examples}"


def solver_prompt(task: CodeTask, mode: str) -> str:
    if mode == "write":
        return f"Write the Python function.\n{spec_text(task)}\nReply with the code in a ```python block."
    listing = "\n".join(f"{LETTERS[i]}:\n{c.source}" for i, c in enumerate(task.candidates))
    return f"Pick the correct implementation.\n{spec_text(task)}\nCandidates:\n{listing}Answer with its letter."


def extract_code(reply: str) -> str:
    """The last ```python block of a reply (or the whole reply when it has none)."""
    blocks = re.findall(r"```(?:python|py)?\s*\n(.*?)```", reply, re.DOTALL)
    return (blocks[-1] if blocks else reply).strip() + "\n"


class AgenticJudgeEnv(Env):
    """Seats ``solver`` and ``judge``; a task is one code task
    ([`CODE_TASKS`][multiagent_rl.games.code_tasks.CODE_TASKS])."""

    name = "agentic_judge"
    roles = ROLES
    default_harness = {"judge": {"id": "tools", "max_turns": 2, "max_tool_rounds": 6}}

    def __init__(self, tasks: list[str] | None = None, solver_mode: str = "choose", task_weight: float = 0.0,
                 judge_weight: float = 1.0, rubric: dict | Rubric | None = None,
                 sandbox: dict | SandboxConfig | None = None, solver_tokens: int = 512, judge_tokens: int = 1024):
        if solver_mode not in ("choose", "write"):
            raise ValueError(f"solver_mode={solver_mode!r}: 'choose' (pick a candidate) or 'write' (write the code)")
        if task_weight < 0 or judge_weight < 0 or task_weight + judge_weight == 0:
            raise ValueError(f"task_weight={task_weight}, judge_weight={judge_weight}: non-negative, not both 0")
        self.tasks = tuple(code_task(t) for t in tasks) if tasks else CODE_TASKS
        self.solver_mode, self.task_weight, self.judge_weight = solver_mode, task_weight, judge_weight
        self.rubric = rubric if isinstance(rubric, Rubric) else (Rubric(**rubric) if rubric else Rubric.default())
        self.sandbox_config = sandbox if isinstance(sandbox, SandboxConfig) else SandboxConfig(**(sandbox or {}))
        self.solver_tokens, self.judge_tokens = solver_tokens, judge_tokens

    def sample_tasks(self, num: int, rng: random.Random) -> list[Task]:
        chosen = [rng.choice(self.tasks) for _ in range(num)]
        return [Task(TaskData(prompt=solver_prompt(t, self.solver_mode), info={"task_id": t.id})) for t in chosen]

    async def run(self, task: Task, agents) -> None:
        code = code_task(task.data.info["task_id"])
        with Workspace.create(prefix="judge-") as ws:
            sandbox = Sandbox(ws, self.sandbox_config)
            solver, source, truth = await self._solve(agents["solver"], task, code, ws, sandbox)
            tests = await self._run_tests(sandbox)
            passed = sum(tests.values()) / len(code.tests) if tests else 0.0
            judge, score = await self._judge(agents["judge"], code, solver, ws, sandbox, truth)
        m = solver.metrics
        m.update(tests=passed, tests_pass=float(passed == 1.0), correct=float(truth),
                 fooled_tests=float(passed == 1.0 and not truth), tricky=float(code.tricky))
        solver.info["agentic_judge"] = {"task_id": code.id, "tests": tests, "correct": truth}
        if score is None:  # a trained judge gave no verdict: the tests alone score the solver
            solver.add_reward("tests", passed)
            return
        m.update(judge_score=score, judged_pass=float(score == 1.0))
        solver.add_reward("tests", passed, weight=self.task_weight)
        solver.add_reward("judge", score, weight=self.judge_weight)

    # -- the solver ------------------------------------------------------------------------------
    async def _solve(self, seat, task: Task, code: CodeTask, ws: Workspace, sandbox: Sandbox):
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
        ws.write("SPEC.md", spec_text(code) + "\n")
        ws.write("solution.py", source)
        ws.write("test_solution.py", code.test_source())
        ws.write("run_tests.py", RUN_TESTS)
        ws.write("examples.json", json.dumps(code.examples))
        if not choose:
            truth = all((await self._check_examples(sandbox, code)).values())
        return it.trace, source, truth

    @staticmethod
    async def _run_tests(sandbox: Sandbox) -> dict[str, bool]:
        marker = "RESULTS:" + secrets.token_hex(8) + ":"
        result = await sandbox.run(["python3", "run_tests.py"], stdin=marker + "\n")
        for line in reversed(result.stdout.splitlines()):
            if line.startswith(marker):
                return {k: bool(v) for k, v in json.loads(line[len(marker):]).items()}
        return {}  # killed, crashed or tampered with: no test counts as passed

    @staticmethod
    async def _check_examples(sandbox: Sandbox, code: CodeTask) -> dict[str, bool]:
        result = await sandbox.run(["python3", "-c", CHECK_EXAMPLES])
        try:
            return json.loads(result.stdout.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            return {call: False for call, _ in code.examples}

    # -- the judge -------------------------------------------------------------------------------
    async def _judge(self, seat, code: CodeTask, solver, ws: Workspace, sandbox: Sandbox, truth: bool):
        prompt = judge_prompt(code, solver.messages, self.rubric)
        state = {"task_id": code.id, "examples": code.examples, "rubric": self.rubric}
        async with seat.interaction(Task(TaskData(prompt=prompt)), tools=judge_tools(ws, sandbox),
                                    max_new_tokens=self.judge_tokens) as it:
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


def judge_prompt(code: CodeTask, transcript: list[dict[str, Any]], rubric: Rubric) -> str:
    shown = "\n".join(f"[{m['role']}] {m['content']}" for m in transcript if m["role"] != "system")
    return (f"You judge a solver's work.\nThe task:\n{spec_text(code)}\nThe solver's transcript:\n{shown}\n"
            "The workspace holds SPEC.md, examples.json, solution.py (the solver's code), test_solution.py (unit "
            "tests, which may be wrong or demand more than the spec) and run_tests.py. Use the tools to look and run code.\n"
            + rubric.instructions())


def judge_tools(ws: Workspace, sandbox: Sandbox) -> list:
    """The judge's tools, bound to this episode's workspace; every command runs in the sandbox."""

    def list_files() -> str:
        """List the files in the workspace."""
        return "\n".join(ws.files())

    def read_file(path: str) -> str:
        """Read a text file of the workspace.

        Args:
            path: The file's path, relative to the workspace.
        """
        return ws.read(path, max_bytes=20_000)

    async def run_tests():
        """Run the unit tests against solution.py; prints a JSON map of test name to passed."""
        return await sandbox.run(["python3", "run_tests.py"], stdin="\n")

    async def run_python(code: str):
        """Run a Python program in the workspace (no network; files outside the workspace are read-only or absent).

        Args:
            code: The program's source; `from solution import *` reaches the solver's code.
        """
        return await sandbox.run(["python3", "-c", code])

    return [list_files, read_file, run_tests, run_python]


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
    """Runs the spec's examples against solution.py in the sandbox (one ``run_python`` call) and gives the best
    verdict when all are met, the worst when none is, the middle otherwise: the spec decides, never the tests."""

    def act(turn) -> str:
        results = [m for m in turn.messages if m["role"] == "tool"]
        if not results:
            return "I run the spec's examples.\n" + tool_call_text("run_python", code=CHECK_EXAMPLES)
        rubric: Rubric = turn.state["rubric"]
        met = _examples_met(results[-1]["content"])
        total = len(turn.state["examples"])
        verdict = {}
        for c in rubric.criteria:
            verdict[c.name] = (c.choices[-1] if met == total else c.choices[0] if met == 0
                               else c.choices[len(c.choices) // 2])
        return rubric.verdict_text(verdict, reason=f"{met}/{total} examples met")

    return act


def _examples_met(output: str) -> int:
    for line in reversed(output.splitlines()):
        try:
            return sum(bool(v) for v in json.loads(line).values())
        except (json.JSONDecodeError, AttributeError):
            continue
    return 0


__all__ = ["AgenticJudgeEnv", "RUN_TESTS", "code_solver", "examples_judge", "extract_code", "judge_prompt",
           "judge_tools", "labelled_solver", "random_solver", "solver_prompt", "spec_text"]
