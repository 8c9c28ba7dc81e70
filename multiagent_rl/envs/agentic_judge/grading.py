"""Grading a solution in the sandbox so that the solution cannot forge its grade.

A hostile solution runs with the grader's privileges in most test harnesses: it can rewrite the runner or the tests,
return an object that equals everything, print an all-pass line and exit, plant ``usercustomize.py`` for every later
Python run, or read the result marker out of the caller's frame. Here:

- the runner, the tests and the examples never exist as files the solution can write or read: the runner's source
  is the command line (``python3 -I -c``) and the checks come in on its stdin, with a random marker;
- Python starts isolated (``-I``: no user site, no ``PYTHON*`` variables, no script folder on ``sys.path``), so
  nothing planted in the workspace runs first;
- the solution runs in its own process (a fresh one per check) that the runner, as the sandbox's init and
  non-dumpable, cannot be killed, stopped, read or written by; only plain data crosses (``in_sandbox/codec.py``),
  rebuilt by the runner, and examples are compared by type and value;
- the host trusts only the runner's last line, behind the marker, and only when it names every check with a bool;
  anything else (killed, crashed, malformed) grades every check as failed.

```pycon
>>> from multiagent_rl.envs.agentic_judge.tasks import code_task
>>> sorted(task_files(code_task("clamp")))
['/task/SPEC.md', '/task/examples.json', '/task/test_solution.py']

```
"""

from __future__ import annotations

import json
import secrets
from dataclasses import dataclass
from importlib import resources
from typing import Literal

from ...tools.sandbox import CommandResult, Sandbox
from .tasks import CodeTask, spec_text

CALL_TIMEOUT = 5.0
"""Seconds the runner waits for one answer of the solution (its process start included)."""


def _source(name: str) -> str:
    return resources.files(__package__).joinpath("in_sandbox", name).read_text(encoding="utf-8")


_CODEC = _source("codec.py")
RUNNER = _CODEC + "\n" + _source("runner.py")
"""The runner's program (the codec, then ``in_sandbox/runner.py``)."""
SERVER = _CODEC + "\n" + _source("server.py")
"""The solution's side (the codec, then ``in_sandbox/server.py``)."""


@dataclass
class Grade:
    """The outcome of one grading run."""

    passed: dict[str, bool]
    """Per check (test name, or example call): passed. All False unless ``complete``."""
    complete: bool
    """Whether the runner finished and its result line was well formed."""
    report: str
    """What a judge's tool shows: a line per check, then the count."""
    result: CommandResult

    @property
    def share(self) -> float:
        return sum(self.passed.values()) / len(self.passed) if self.passed else 0.0

    @property
    def all_passed(self) -> bool:
        return self.complete and bool(self.passed) and all(self.passed.values())


async def grade(sandbox: Sandbox, task: CodeTask, mode: Literal["tests", "examples"],
                call_timeout: float = CALL_TIMEOUT) -> Grade:
    """Run ``task``'s tests, or check its spec's examples, against ``solution.py`` in ``sandbox``'s workspace."""
    checks = [[t.name, t.source] for t in task.tests] if mode == "tests" else [list(e) for e in task.examples]
    marker = "RESULTS:" + secrets.token_hex(16) + ":"
    # the runner stops starting checks in time to print its result before the sandbox's timeout kills it
    budget = max(0.5, sandbox.config.timeout * 0.8 - 1.0)
    payload = {"mode": mode, "function": task.function, "checks": checks, "call_timeout": call_timeout,
               "budget": budget, "server": SERVER}
    result = await sandbox.run(["python3", "-I", "-c", RUNNER], stdin=marker + "\n" + json.dumps(payload) + "\n")
    names = [c[0] for c in checks]
    passed, complete = dict.fromkeys(names, False), False
    lines = result.stdout.splitlines()
    if lines and lines[-1].startswith(marker):
        try:
            found = json.loads(lines[-1][len(marker):])
        except ValueError:
            found = None
        if isinstance(found, dict) and list(found) == names and all(type(v) is bool for v in found.values()):
            passed, complete = found, True
    report = "\n".join(line for line in lines if not line.startswith(marker))
    if not complete:
        stopped = result.killed or f"exit code {result.returncode}"
        report += f"\nthe grader did not finish ({stopped}): no check counts as passed"
    return Grade(passed, complete, report.strip(), result)


def task_files(task: CodeTask) -> dict[str, str]:
    """The task's files as the judge reads them (host-side, by ``read_file``): never mounted where a solution runs."""
    return {"/task/SPEC.md": spec_text(task) + "\n", "/task/examples.json": json.dumps(task.examples) + "\n",
            "/task/test_solution.py": task.test_source() + "\n"}
