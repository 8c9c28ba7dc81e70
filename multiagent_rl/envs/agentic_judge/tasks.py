"""Small Python function tasks with labelled unit tests and labelled candidates, for an agentic judge.

Each [`CodeTask`][multiagent_rl.envs.agentic_judge.tasks.CodeTask] is an everyday function (clamp, run-length encoding, Roman
numerals, ...) given by a short spec and a few examples. The examples are part of the spec and are authoritative: the
spec and its examples decide what is correct, never the tests. A solver picks or writes an implementation, the unit
tests give a task reward, and a judge that reads the spec and runs code may overrule the tests.

The tests are not all trustworthy. In the *tricky* tasks
([`CodeTask.tricky`][multiagent_rl.envs.agentic_judge.tasks.CodeTask.tricky]) exactly one test is labelled ``"wrong"`` (its
expected value contradicts the spec) or ``"overspecified"`` (it demands something the spec leaves free: a return type,
an exception type, key order, behaviour on an input the spec does not cover). Each tricky task also has an incorrect
candidate written to fit that test: it passes every test of the task yet fails an example, the case where unit tests
alone reward a wrong solution and only a judge that checks the spec can catch it.

Everything carries ground truth: ``CodeTest.label`` for tests, ``Candidate.correct`` for candidates
(correct means it meets the spec and examples, whatever the tests say).
[`run_tests_locally`][multiagent_rl.envs.agentic_judge.tasks.run_tests_locally] and
[`check_examples_locally`][multiagent_rl.envs.agentic_judge.tasks.check_examples_locally] execute the built-in code in this
process to verify those labels; they are for this trusted set only, never for model-written code.

The set itself is data, ``multiagent_rl/envs/agentic_judge/tasks.toml``;
[`load_code_tasks`][multiagent_rl.envs.agentic_judge.tasks.load_code_tasks] reads that file or your own in the same format.

```pycon
>>> task = code_task("clamp")
>>> task.examples[0]
('clamp(5, 0, 3)', '3')
>>> [c.correct for c in task.candidates]
[False, True, False, True]
>>> all(run_tests_locally(task, task.candidates[1].source).values())
True

```
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from .in_sandbox.codec import same

TestLabel = Literal["valid", "wrong", "overspecified"]
"""A test's ground truth: ``valid`` agrees with the spec; ``wrong`` contradicts it; ``overspecified`` demands
behaviour the spec leaves free."""


@dataclass(frozen=True)
class CodeTest:
    """One unit test: a single ``def test_...():`` using plain ``assert``, calling the task's function by name."""

    name: str
    source: str
    label: TestLabel
    why: str = ""  # for a wrong / overspecified test: what is wrong with it; empty for a valid one


@dataclass(frozen=True)
class Candidate:
    """One implementation of the task's function, with ground truth against the spec (not the tests)."""

    source: str
    correct: bool
    note: str


@dataclass(frozen=True)
class CodeTask:
    """A function to write: its spec and authoritative examples, unit tests, and candidate implementations."""

    id: str
    function: str
    spec: str
    examples: tuple[tuple[str, str], ...]  # (call expression, expected value as a Python literal)
    tests: tuple[CodeTest, ...]
    candidates: tuple[Candidate, ...]

    @property
    def tricky(self) -> bool:
        """True when some test is not ``"valid"``, so the tests alone can mislead."""
        return any(t.label != "valid" for t in self.tests)

    def test_source(self) -> str:
        """All the tests' sources, ready to append after the solution code in one module."""
        return "\n\n".join(t.source for t in self.tests)


def load_code_tasks(path=None) -> tuple[CodeTask, ...]:
    """Read a task set from a TOML file (default: the built-in ``tasks.toml`` next to this module).

    Each ``[[task]]`` has ``id``, ``function``, ``spec``, ``examples`` (``[call, expected literal]`` pairs), then
    ``[[task.test]]`` tables (``source``; ``label`` and ``why`` when not valid) and ``[[task.candidate]]`` tables
    (``source``, ``correct``, ``note``). A test's name is read from its source, so the two never disagree.
    """
    if path is None:
        text = resources.files(__package__).joinpath("tasks.toml").read_text()
    else:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    return tuple(_task(entry) for entry in tomllib.loads(text)["task"])


def _task(entry: dict) -> CodeTask:
    tests = []
    for t in entry["test"]:
        match = re.match(r"def (test_\w+)\(", t["source"])
        if match is None:
            raise ValueError(f"task {entry['id']!r}: not a test function: {t['source']!r}")
        tests.append(CodeTest(match.group(1), t["source"], t.get("label", "valid"), t.get("why", "")))
    return CodeTask(
        id=entry["id"], function=entry["function"], spec=entry["spec"],
        examples=tuple((call, expected) for call, expected in entry["examples"]),
        tests=tuple(tests),
        candidates=tuple(Candidate(c["source"], c["correct"], c["note"]) for c in entry["candidate"]),
    )


# Tricky and plain tasks are interleaved so that any prefix of the set holds some of both.
CODE_TASKS: tuple[CodeTask, ...] = load_code_tasks()
"""The built-in task set, in a fixed order."""

_BY_ID: dict[str, CodeTask] = {task.id: task for task in CODE_TASKS}


def code_task(task_id: str) -> CodeTask:
    """The task with id ``task_id``; a ``KeyError`` that lists the valid ids if there is none."""
    try:
        return _BY_ID[task_id]
    except KeyError:
        raise KeyError(f"unknown code task {task_id!r}; valid ids: {', '.join(_BY_ID)}") from None


def run_tests_locally(task: CodeTask, candidate_source: str) -> dict[str, bool]:
    """Run each of ``task``'s tests against ``candidate_source`` and return ``{test name: passed}``.

    The code is executed IN THIS PROCESS, without any sandbox: use it only for trusted code such as the
    built-in candidates of this module, never for model-written code. A test passes when it returns without
    raising. Each test runs in a fresh namespace (exec of the candidate source, then the test source, then a
    call), so one test cannot disturb another; an error while defining the candidate fails every test.
    """
    results = {}
    for test in task.tests:
        namespace: dict = {}
        try:
            exec(candidate_source, namespace)  # noqa: S102 - trusted built-in code, see the docstring
            exec(test.source, namespace)  # noqa: S102
            namespace[test.name]()
        except Exception:  # noqa: BLE001 - any error, not only AssertionError, fails a test
            results[test.name] = False
        else:
            results[test.name] = True
    return results


def check_examples_locally(task: CodeTask, candidate_source: str) -> dict[str, bool]:
    """``{call expression: result equals expected in type and value}`` for each of ``task``'s examples (``2.0`` does not
    meet ``2``); an exception counts as False.

    Like [`run_tests_locally`][multiagent_rl.envs.agentic_judge.tasks.run_tests_locally] this executes the code in this process,
    for trusted built-in code only. Each example is evaluated in a fresh namespace holding just the candidate's
    definitions.
    """
    results = {}
    for call, expected in task.examples:
        namespace: dict = {}
        try:
            exec(candidate_source, namespace)  # noqa: S102 - trusted built-in code, see the docstring
            results[call] = same(eval(call, namespace), ast.literal_eval(expected))
        except Exception:  # noqa: BLE001 - an example that raises is simply not met
            results[call] = False
    return results


def spec_text(task: CodeTask) -> str:
    """The spec and its authoritative examples, as solvers and judges read them."""
    examples = "\n".join(f"{call} == {expected}" for call, expected in task.examples)
    return f"{task.spec}\nExamples (authoritative):\n{examples}"
