"""The ``multiagent-rl`` command: train an experiment from a TOML file, or evaluate a saved model on an environment.

    multiagent-rl train recipes/configs/agentic_judge.toml --set trainer.max_steps=50 --set env.0.group_size=4
    accelerate launch -m multiagent_rl train experiment.toml          # the same on several processes
    multiagent-rl eval kuhn_poker --model outputs/kuhn_poker/final_model

``--set KEY=VALUE`` writes a dotted key over the file (list entries by index: ``env.0.args.solver_mode``); VALUE is read
as a TOML value (``2``, ``1e-3``, ``true``, ``"text"``, ``[1, 2]``), and as a plain string when it is not one. ``train``
writes the run under ``[trainer] output_dir`` (default ``outputs/<file name>``): checkpoints, traces, the final model
and ``summary.json``. ``eval`` runs the environment package's own evaluation (``multiagent_rl.envs.<id>.evaluation``'s
``evaluate(model, tokenizer, **options)``) and prints its report as JSON.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import tomllib
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


def parse_value(text: str) -> Any:
    """A ``--set`` value: a TOML value when it parses as one, else the string itself."""
    try:
        return tomllib.loads(f"value = {text}")["value"]
    except tomllib.TOMLDecodeError:
        return text


def apply_override(data: dict, assignment: str) -> None:
    """Write ``KEY=VALUE`` (a dotted key, list entries by index) into ``data``; a key that leads nowhere is an error
    naming it."""
    if "=" not in assignment:
        raise SystemExit(f"--set {assignment!r}: write KEY=VALUE, e.g. --set trainer.max_steps=50")
    key, _, text = assignment.partition("=")
    parts = key.strip().split(".")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        where = ".".join(parts[: i + 1])
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise SystemExit(f"--set {key}: {where} is not an entry of a list of {len(node)}")
            node = node[int(part)]
        else:
            node = node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            raise SystemExit(f"--set {key}: {where} is a value, not a table")
    last = parts[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise SystemExit(f"--set {key}: {last} is not an entry of a list of {len(node)}")
        node[int(last)] = parse_value(text)
    else:
        node[last] = parse_value(text)


def load_experiment(path: str, overrides: list[str]):
    """The experiment in ``path`` with the ``--set`` overrides written over it."""
    from .config import ExperimentConfig

    with open(path, "rb") as f:
        data = tomllib.load(f)
    for assignment in overrides:
        apply_override(data, assignment)
    data.setdefault("trainer", {}).setdefault("output_dir", str(Path("outputs") / Path(path).stem))
    return ExperimentConfig.model_validate(data)


def train(args: argparse.Namespace) -> dict:
    from .training.run import finish
    from .training.run import train as run_training
    from .training.trainer import MixedAlgorithmTrainer

    experiment = load_experiment(args.config, args.set)
    trainer = MixedAlgorithmTrainer(experiment)
    interrupted = run_training(trainer, resume=args.resume)
    command = " ".join(["multiagent-rl", "train", args.config, *(f"--set {a}" for a in args.set)])
    summary = {"command": command, "steps": trainer.state.global_step, "interrupted": interrupted is not None,
               "episodes": trainer.rollout.episodes_played,
               "last_log": next((h for h in reversed(trainer.state.log_history) if "loss" in h), {})}
    finish(trainer, summary, None, None, interrupted, resume_hint="; continue with --resume")
    return summary


def evaluate(args: argparse.Namespace) -> dict:
    from .envs.registry import ENVS
    from .models import load_model_and_tokenizer

    env_class = ENVS.lookup(args.env)  # an unknown id fails here, listing the known ones
    # the evaluation lives beside the env, in its package: built-in or registered by a user's own package
    home = importlib.import_module(env_class.__module__)
    package = home.__name__ if hasattr(home, "__path__") else home.__name__.rpartition(".")[0]
    target = f"{package}.evaluation" if package else f"{home.__name__}.evaluation"
    try:
        module = importlib.import_module(target) if package else None
    except ModuleNotFoundError as error:
        if error.name != target:
            raise  # the evaluation exists but one of its own imports is missing: show that, not "no evaluation"
        module = None
    if module is None or not hasattr(module, "evaluate"):
        raise SystemExit(f"env {args.env!r} ships no evaluation of a saved model ({target.replace('.', '/')}.py "
                         "defines no evaluate()); its metrics are logged during training")
    model, tokenizer = load_model_and_tokenizer(args.model)
    options = {k.replace("-", "_"): parse_value(v) for k, _, v in (o.partition("=") for o in args.option)}
    report = module.evaluate(model, tokenizer, **options)
    print(json.dumps(report, indent=2))
    return report


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(prog="multiagent-rl", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train the experiment in a TOML file")
    t.add_argument("config", help="the experiment, a TOML file (ExperimentConfig)")
    t.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="write a dotted key over the file (repeatable), e.g. trainer.max_steps=50")
    t.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in the output folder")
    e = sub.add_parser("eval", help="evaluate a saved model with an environment's own evaluation")
    e.add_argument("env", help="a registered env id, e.g. kuhn_poker")
    e.add_argument("--model", required=True, help="'tiny', 'smollm2-135m', a Hub id or a saved model folder")
    e.add_argument("--option", action="append", default=[], metavar="NAME=VALUE",
                   help="an option of the env's evaluate() (repeatable), e.g. legal_choices=true")
    args = p.parse_args(argv)
    return train(args) if args.command == "train" else evaluate(args)


if __name__ == "__main__":
    sys.exit(0 if main() is not None else 1)
