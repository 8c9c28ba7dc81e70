"""Milliseconds per sandboxed command (control groups + setpriv + prlimit + bubblewrap + seccomp), against the same
command unsandboxed; and one grading run of the agentic judge (the runner and a solution process for 4 tests).

    python bench/sandbox_overhead.py [--runs 50]
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from pathlib import Path

from multiagent_rl.envs.agentic_judge.grading import grade
from multiagent_rl.envs.agentic_judge.tasks import code_task
from multiagent_rl.tools.sandbox import Sandbox, SandboxConfig, cgroups

COMMANDS = {"true": ["true"], "python3 -c pass": ["python3", "-c", "pass"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=50)
    args = p.parse_args()
    config = SandboxConfig()
    support = cgroups.support()
    with config.workspace() as ws:
        print(f"control groups: {'v%d' % support.version if support.version else 'none (' + support.reason + ')'}; "
              f"workspace quota: {'tmpfs' if ws.quota_mounted else 'checked after each command'}")
        sandbox = Sandbox(ws, config)
        print(f"{'command':<28}{'sandboxed ms':>14}{'plain ms':>10}")
        for name, argv in COMMANDS.items():
            sandbox.run_sync(argv)  # first-call costs out of the timing
            started = time.perf_counter()
            for _ in range(args.runs):
                assert sandbox.run_sync(argv).ok
            boxed = (time.perf_counter() - started) / args.runs * 1000
            # the interpreter the sandbox runs (the system's when there is one)
            python = "/usr/bin/python3" if Path("/usr/bin/python3").exists() else sys.executable
            plain_argv = [python if a == "python3" else a for a in argv]
            started = time.perf_counter()
            for _ in range(args.runs):
                subprocess.run(plain_argv, check=True)
            plain = (time.perf_counter() - started) / args.runs * 1000
            print(f"{name:<28}{boxed:>14.1f}{plain:>10.1f}")
        task = code_task("clamp")
        ws.write("solution.py", task.candidates[1].source)

        async def grading() -> float:
            started = time.perf_counter()
            for _ in range(max(1, args.runs // 5)):
                assert (await grade(sandbox, task, "tests")).all_passed
            return (time.perf_counter() - started) / max(1, args.runs // 5) * 1000

        print(f"{'grade clamp (4 tests)':<28}{asyncio.run(grading()):>14.1f}{'':>10}")


if __name__ == "__main__":
    main()
