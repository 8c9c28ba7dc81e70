"""Every Python block in README.md and docs/*.md runs as written; every TOML experiment block loads.

The Python blocks of one page run in order in one fresh interpreter (later blocks use what earlier
ones defined), in a temporary working directory, with ``MULTIAGENT_RL_MAX_STEPS=2`` so that a
``trainer.train()`` shown with its real step count finishes in seconds. Blocks tagged ``bash``
(installs, hour-long recipes) and untagged blocks (formulas, console output) are not run.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)

RUNNER = """
import json, sys, traceback
blocks = json.load(open(sys.argv[1]))
namespace = {"__name__": "__main__"}
for line, code in blocks:
    try:
        exec(compile(code, f"{sys.argv[2]}:{line}", "exec"), namespace)
    except BaseException:
        traceback.print_exc()
        print(f"BLOCK FAILED: {sys.argv[2]} line {line}", flush=True)
        sys.exit(1)
"""


def blocks(page: Path, language: str) -> list[tuple[int, str]]:
    text = page.read_text()
    return [(text[: m.start()].count("\n") + 1, m.group(2)) for m in FENCE.finditer(text) if m.group(1) == language]


PYTHON_PAGES = [p for p in PAGES if blocks(p, "python")]
TOML_BLOCKS = [(p, line, code) for p in PAGES for line, code in blocks(p, "toml")]
TOML_BLOCKS += [(p, 1, p.read_text()) for p in sorted((ROOT / "recipes" / "configs").glob("*.toml"))]


def test_the_pages_have_blocks_to_check():
    assert ROOT / "README.md" in PYTHON_PAGES and len(PYTHON_PAGES) >= 4
    assert TOML_BLOCKS


@pytest.mark.parametrize("page", PYTHON_PAGES, ids=[p.name for p in PYTHON_PAGES])
def test_python_blocks_run_as_written(page, tmp_path):
    if "bwrap" in page.read_text() or "bubblewrap" in page.read_text():
        from multiagent_rl.tools.sandbox import bwrap_available

        if not bwrap_available():
            pytest.skip("this page's code runs commands in the sandbox: apt-get install bubblewrap")
    code = tmp_path / "blocks.json"
    code.write_text(json.dumps(blocks(page, "python")))
    runner = tmp_path / "runner.py"
    runner.write_text(RUNNER)
    env = {**os.environ, "MULTIAGENT_RL_MAX_STEPS": "2", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(runner), str(code), page.name], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-5000:]


@pytest.mark.parametrize("page, line, code", TOML_BLOCKS, ids=[f"{p.name}:{line}" for p, line, _ in TOML_BLOCKS])
def test_toml_experiments_load(page, line, code):
    from multiagent_rl.config import ExperimentConfig

    data = tomllib.loads(code)
    if "env" in data:  # an experiment (other TOML, e.g. pyproject snippets, only has to parse)
        ExperimentConfig.model_validate(data)


def test_every_module_docstring_example_runs():
    """The ``>>>`` examples in the package's docstrings are documentation too (``doctest: +SKIP`` marks the ones
    that need a model or a network)."""
    import doctest
    import importlib
    import pkgutil

    import multiagent_rl

    failed = {}
    for info in pkgutil.walk_packages(multiagent_rl.__path__, "multiagent_rl."):
        result = doctest.testmod(importlib.import_module(info.name), optionflags=doctest.ELLIPSIS)
        if result.failed:
            failed[info.name] = result.failed
    assert not failed, failed


SPHINX_ROLE = re.compile(r":(?:py:)?(?:class|func|mod|meth|attr|data|exc|obj):`")


def test_docstrings_cross_reference_in_the_sites_syntax():
    """The API reference is MkDocs + mkdocstrings, which renders Markdown: a Sphinx role (``:class:`X```) shows up
    as literal text there. Cross-references are written ``[`X`][multiagent_rl.module.X]`` (``mkdocs build
    --strict`` in CI fails on a target that does not exist), and ``>>>`` examples sit in ```` ```pycon ```` fences
    so their output is not read as Markdown."""
    offenders = [f"{path.relative_to(ROOT)}:{n}" for path in sorted((ROOT / "multiagent_rl").rglob("*.py"))
                 for n, line in enumerate(path.read_text().splitlines(), 1) if SPHINX_ROLE.search(line)]
    assert not offenders, "Sphinx roles in docstrings (use [`Name`][module.Name]): " + ", ".join(offenders)
