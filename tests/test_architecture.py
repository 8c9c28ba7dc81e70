"""The package's shape: no import cycle (lazy imports included), layers that import only what they need,
small modules."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "multiagent_rl"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def imports_of(name: str) -> set[str]:
    """Package modules ``name`` imports anywhere in its file (inside functions too)."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {alias.name for alias in node.names if alias.name in MODULES}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{base}.{node.module}" if node.module else base
            else:
                base = node.module or ""
            for alias in node.names:
                target = f"{base}.{alias.name}"
                out.add(target if target in MODULES else base)
    return {m for m in out if m in MODULES and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return found


def test_no_import_cycle_lazy_imports_included():
    graph = {name: imports_of(name) for name in MODULES}
    # the checker itself sees both kinds of import
    assert "multiagent_rl.training.arguments" in graph["multiagent_rl.config"]  # a lazy (in-function) import
    assert "multiagent_rl.envs.kuhn_poker.rules" in graph["multiagent_rl.envs.kuhn_poker"]
    assert cycles(graph) == [], cycles(graph)
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]  # it finds one


def _imported_by(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    return set(out.stdout.split())


def test_layers_import_only_what_they_need():
    # the rollout engine and the public API work without TRL (notebooks, evaluation)
    assert "trl" not in _imported_by("import multiagent_rl, multiagent_rl.rollout.engine")
    # the game itself needs neither torch nor OpenSpiel; the environment needs no OpenSpiel
    game = _imported_by("import multiagent_rl.envs.kuhn_poker.rules")
    assert "pyspiel" not in game and "open_spiel" not in game
    env = _imported_by("import multiagent_rl.envs.kuhn_poker")
    assert "pyspiel" not in env and "open_spiel" not in env
    blocked = "import sys; sys.modules['pyspiel'] = None; sys.modules['open_spiel'] = None\n"
    _imported_by(blocked + "from multiagent_rl.envs.kuhn_poker import random_mixed_policy, KuhnPokerEnv; "
                 "random_mixed_policy(0)")


def test_no_module_is_over_400_lines():
    long = {name: n for name, p in MODULES.items() if (n := len(p.read_text().splitlines())) > 400}
    assert not long, long


def test_the_trainer_is_thin_and_names_no_algorithm_or_regulariser():
    from multiagent_rl.algorithms import ALGORITHMS
    from multiagent_rl.training.regularisers import REGULARISERS

    source = (PACKAGE / "training" / "trainer.py").read_text()
    assert len(source.splitlines()) <= 250
    tree = ast.parse(source)
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef)) and ast.get_docstring(node)}
    words = set()  # every identifier and every word of a string the code holds (docstrings and comments aside)
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words.add(node.id)
        elif isinstance(node, ast.Attribute):
            words.add(node.attr)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            words.add(node.name)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
            words |= set(re.findall(r"[A-Za-z_]+", node.value))
    names = {n for name in [*ALGORITHMS, *REGULARISERS] for n in (name, name.upper())} | {
        cls.__name__ for cls in [*ALGORITHMS.values(), *REGULARISERS.values()]}
    assert not words & names, words & names


def test_every_shipped_environment_is_reachable_by_id():
    """Each package under multiagent_rl/envs/ registers its env; a config names it by that id."""
    from multiagent_rl.config import ExperimentConfig
    from multiagent_rl.envs.registry import ENVS

    packages = sorted(p.name for p in (PACKAGE / "envs").iterdir() if (p / "__init__.py").exists())
    assert sorted(ENVS) == packages, (sorted(ENVS), packages)
    for env_id in packages:
        spec = ExperimentConfig.model_validate({"env": [{"id": env_id}]}).env[0]
        assert spec.env_class() is ENVS[env_id] and spec.env_class().__module__.startswith(f"multiagent_rl.envs.{env_id}")
