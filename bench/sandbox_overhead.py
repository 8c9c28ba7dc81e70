"""Milliseconds per sandboxed command (setpriv + prlimit + bubblewrap), against the same command unsandboxed.

    python bench/sandbox_overhead.py [--runs 50]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from multiagent_rl.sandbox import Sandbox, Workspace

COMMANDS = {"true": ["true"], "python3 -c pass": ["python3", "-c", "pass"]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=50)
    args = p.parse_args()
    with Workspace.create() as ws:
        sandbox = Sandbox(ws)
        print(f"{'command':<18}{'sandboxed ms':>14}{'plain ms':>10}")
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
            print(f"{name:<18}{boxed:>14.1f}{plain:>10.1f}")


if __name__ == "__main__":
    main()
