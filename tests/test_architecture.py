"""The package's shape: no import cycle (lazy imports included), layers that import only what they need,
small modules."""

from __future__ import annotations

import ast
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
