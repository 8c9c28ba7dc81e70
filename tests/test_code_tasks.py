"""The built-in code tasks agree with their own labels, checked by executing every candidate and test.

Correct candidates meet every example and every valid test; each wrong or overspecified test fails a correct
candidate; each incorrect candidate fails an example, and fails a test unless it is the one written to fit the
bad test of a tricky task; enough tricky tasks have such a candidate that passes every test.
"""

from __future__ import annotations

import ast
import dataclasses
import doctest
from collections import Counter

import pytest

from multiagent_rl.envs.agentic_judge import tasks as ct
from multiagent_rl.envs.agentic_judge.tasks import (
    CODE_TASKS,
    CodeTask,
    check_examples_locally,
    code_task,
    run_tests_locally,
)

TASK_IDS = [task.id for task in CODE_TASKS]
FORBIDDEN_CALLS = {"print", "open", "input", "exec", "eval", "__import__"}
FORBIDDEN_MODULES = {"random", "os", "sys", "socket", "subprocess", "time", "pathlib", "urllib", "http", "secrets"}


def bad_tests(task: CodeTask):
    return [t for t in task.tests if t.label != "valid"]


def fits_bad_test(task: CodeTask, source: str) -> bool:
    """An incorrect candidate written to fit the task's bad test: it passes that test yet fails an example."""
    passed = run_tests_locally(task, source)
    return (task.tricky and all(passed[t.name] for t in bad_tests(task))
            and not all(check_examples_locally(task, source).values()))


def defined_functions(source: str) -> list[str]:
    return [node.name for node in ast.parse(source).body if isinstance(node, ast.FunctionDef)]


def test_the_set_has_the_promised_shape():
    assert 28 <= len(CODE_TASKS) <= 32
    assert len(set(TASK_IDS)) == len(TASK_IDS)
    tricky = [task for task in CODE_TASKS if task.tricky]
    assert 10 <= len(tricky) <= 12
    labels = Counter(t.label for task in CODE_TASKS for t in task.tests)
    assert labels["wrong"] >= 4 and labels["overspecified"] >= 4
    assert set(labels) == {"valid", "wrong", "overspecified"}
    fully_fitted = [task.id for task in tricky if any(
        not c.correct and fits_bad_test(task, c.source) and all(run_tests_locally(task, c.source).values())
        for c in task.candidates)]
    assert len(fully_fitted) >= 6, fully_fitted
    # The correct candidate must not sit at one fixed position a solver could learn.
    first_correct = Counter(next(i for i, c in enumerate(task.candidates) if c.correct) for task in CODE_TASKS)
    assert len(first_correct) >= 3 and max(first_correct.values()) <= len(CODE_TASKS) // 2
    assert 1 <= sum(sum(c.correct for c in task.candidates) == 2 for task in CODE_TASKS) <= 8


@pytest.mark.parametrize("task", CODE_TASKS, ids=TASK_IDS)
def test_task_structure(task: CodeTask):
    assert task.id.isidentifier() and task.id == task.id.lower()
    assert task.function.isidentifier()
    assert task.spec.startswith(f"{task.function}(") and "\n" in task.spec
    assert 3 <= len(task.tests) <= 5 and 3 <= len(task.candidates) <= 4
    assert any(c.correct for c in task.candidates) and any(not c.correct for c in task.candidates)
    assert len(bad_tests(task)) == (1 if task.tricky else 0)
    names = [t.name for t in task.tests]
    assert len(set(names)) == len(names)
    for test in task.tests:
        assert test.name.startswith("test_")
        assert defined_functions(test.source) == [test.name]
        assert task.function in {n.id for n in ast.walk(ast.parse(test.source)) if isinstance(n, ast.Name)}
        assert test.label in ("valid", "wrong", "overspecified")
        assert bool(test.why) == (test.label != "valid")
    for candidate in task.candidates:
        assert defined_functions(candidate.source)[-1] == task.function
        assert candidate.note
    module = ast.parse(task.test_source())
    assert [n.name for n in module.body] == names


@pytest.mark.parametrize("task", CODE_TASKS, ids=TASK_IDS)
def test_examples_are_literal_calls_of_the_function(task: CodeTask):
    assert len(task.examples) >= 3
    for call, expected in task.examples:
        ast.literal_eval(expected)
        node = ast.parse(call, mode="eval").body
        assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == task.function
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            ast.literal_eval(arg)


@pytest.mark.parametrize("task", CODE_TASKS, ids=TASK_IDS)
def test_code_is_pure_standard_library(task: CodeTask):
    for source in [t.source for t in task.tests] + [c.source for c in task.candidates]:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                assert node.func.id not in FORBIDDEN_CALLS, source
            if isinstance(node, ast.Import):
                assert not {a.name.split(".")[0] for a in node.names} & FORBIDDEN_MODULES, source
            if isinstance(node, ast.ImportFrom):
                assert node.module.split(".")[0] not in FORBIDDEN_MODULES, source


@pytest.mark.parametrize("task", CODE_TASKS, ids=TASK_IDS)
def test_correct_candidates_meet_the_examples_and_the_valid_tests(task: CodeTask):
    for candidate in task.candidates:
        if candidate.correct:
            assert all(check_examples_locally(task, candidate.source).values()), candidate.note
            passed = run_tests_locally(task, candidate.source)
            assert all(passed[t.name] for t in task.tests if t.label == "valid"), (candidate.note, passed)


@pytest.mark.parametrize("task", [task for task in CODE_TASKS if task.tricky], ids=lambda task: task.id)
def test_bad_tests_really_mislead(task: CodeTask):
    (bad,) = bad_tests(task)
    assert any(not run_tests_locally(task, c.source)[bad.name] for c in task.candidates if c.correct)
    # The fitted candidate passes the bad test and all the valid ones, so only the examples expose it.
    fitted = [c for c in task.candidates if not c.correct and fits_bad_test(task, c.source)]
    assert fitted and any("fits" in c.note for c in fitted)


@pytest.mark.parametrize("task", CODE_TASKS, ids=TASK_IDS)
def test_incorrect_candidates_fail_an_example_and_a_test(task: CodeTask):
    for candidate in task.candidates:
        if not candidate.correct:
            assert not all(check_examples_locally(task, candidate.source).values()), candidate.note
            passed = run_tests_locally(task, candidate.source)
            assert not all(passed.values()) or fits_bad_test(task, candidate.source), candidate.note


def test_helpers():
    task = code_task("rotate")
    assert task is CODE_TASKS[TASK_IDS.index("rotate")] and task.tricky and not code_task("clamp").tricky
    with pytest.raises(KeyError, match="valid ids: clamp, is_palindrome"):
        code_task("no_such_task")
    with pytest.raises(dataclasses.FrozenInstanceError):
        task.id = "other"  # type: ignore[misc]
    # The tests run in fresh namespaces: a candidate that does not even define the function fails them all.
    assert run_tests_locally(task, "x = 1\n") == {t.name: False for t in task.tests}
    assert check_examples_locally(task, "def rotate(xs, k):\n    raise RuntimeError\n") == {
        call: False for call, _ in task.examples}
    correct = next(c for c in task.candidates if c.correct)
    namespace: dict = {}
    exec(correct.source + "\n" + task.test_source(), namespace)  # noqa: S102 - the module's own built-in code
    assert all(t.name in namespace for t in task.tests)


def test_doctests():
    result = doctest.testmod(ct, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
