"""Agentic judge: a tiny solver learns from a judge that runs code in a sandbox, or from the unit tests alone.

    python recipes/agentic_judge.py                    # reward = the judge's verdict (tiny model, CPU)
    python recipes/agentic_judge.py --reward tests     # the baseline: reward = share of unit tests passed
    python recipes/agentic_judge.py --solver hostile --steps 4   # attacks instead of code: does everything hold?

The solver picks one of a task's candidate implementations (``AgenticJudgeEnv(solver_mode="choose")``: its one
free token is a letter, through the legal-action harness) and is trained with GRPO. Every episode runs the
task's unit tests on its choice in the sandbox, then a judge (scripted by default: ``examples_judge`` runs the
spec's examples through its ``run_python`` tool, in the sandbox, and writes a rubric verdict) judges it. With
``--reward judge`` the solver's reward is the judge's score (task_weight 0: the judge overrules the tests);
with ``--reward tests`` it is the share of tests passed (judge_weight 0; the judge still runs, for the metrics).

Some tests are wrong or over-specified, and each such task has a wrong candidate written to pass every test:
the tests reward it, the judge does not. Logged per step: the judged pass rate, the true correctness of the
choices (ground-truth labels), the share of choices that pass all tests yet are wrong (``fooled_tests``).
Outputs in ``--output-dir``: ``summary.json``, ``judge.png``, the episodes, the final model.

``--judge-model vllm:http://HOST:8000/v1#MODEL`` puts a served model in the judge's seat (the tools harness
drives it token by token, so a vLLM server; see docs/agentic_judge.md); the default is the scripted judge.

``--train judge`` trains the judge instead (a pretrained chat model: ``--model smollm2-135m --lora 16``; the tiny
model's 2,048 positions cannot hold the judge's prompt): the solver picks a random candidate (scripted), the
judge explores the workspace with real tool calls and is rewarded by agreement with the candidate's ground-truth
label, ``1 − |score − correct|`` (0 without a verdict that parses). Logged per step: the share of judge replies
with a verdict that parses, of tool calls that ran without error, and agreement. ``--warmup-steps N`` first has the
policy imitate the scripted judge for N ``sft`` steps (SmolLM2-135M writes neither a tool call nor a verdict that
parses on its own, so RL alone gets no signal; docs/agentic_judge_results.md); the logged curves are the RL phase's.
The judge trains on 24 of the 30 tasks; before the first step, after the warm-up, every ``--eval-every`` steps and
after the last it judges every candidate of the other 6 greedily (``multiagent_rl.envs.agentic_judge.evaluation``):
``held_out_before`` / ``held_out_after`` in the summary (verdicts that parse, tool calls and their success, agreement
with the labels).

``--solver hostile`` replaces the solver by a scripted one that writes attacks instead of code (every attack of
``multiagent_rl.envs.agentic_judge.ATTACKS`` in turn: forged grades, FIFOs, deep trees, memory and disk hogs, fork
bombs, ...), in write mode, judged by the scripted judge; nothing is trained (a tool-using judge's prompt does not fit
the tiny model's 2,048 positions): a run that checks the sandbox and the grading hold through every step. Its summary
counts, per attack, the episodes, their errors and rewards, and what was left on the machine (workspaces, mounts,
control groups).
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from multiagent_rl.config import ExperimentConfig  # noqa: E402
from multiagent_rl.envs.agentic_judge.evaluation import JudgeEvaluation, training_tasks  # noqa: E402
from multiagent_rl.training.phases import warmup_then_rl  # noqa: E402
from multiagent_rl.training.run import (HelpFormatter, add_hub_flags, add_lora_flag,  # noqa: E402
                                        add_micro_batches_flag, finish, lora_config, train)
from multiagent_rl.training.trainer import MixedAlgorithmTrainer  # noqa: E402

METRICS = ("judged_pass", "correct", "fooled_tests", "tests_pass", "judge_score", "tests")
JUDGE_METRICS = ("verdict", "agrees", "tool_calls", "tool_errors")
"""A trained judge's metrics (the judge's trace): verdict parsed, agreement with the label, calls, failed calls."""


def experiment(args) -> ExperimentConfig:
    weights = {"task_weight": 0.0, "judge_weight": 1.0} if args.reward == "judge" else \
        {"task_weight": 1.0, "judge_weight": 0.0}
    if args.solver == "hostile":
        return hostile_experiment(args, weights)
    if args.train == "judge":
        return judge_experiment(args)
    if args.judge_model == "scripted":
        judge = {"model": "scripted", "policy": "multiagent_rl.envs.agentic_judge:examples_judge"}
    else:
        judge = {"model": args.judge_model, "sampling": {"temperature": 0.0, "max_new_tokens": 1024}}
    return ExperimentConfig.model_validate({
        "model": {"name": args.model, "lora": lora_config(args.lora)},
        "algo": {"type": "grpo"},
        "env": [{"id": "agentic_judge", "args": {"solver_mode": "choose", **weights}, "group_size": args.group_size,
                 "roles": {"judge": {**judge, "trainable": False}}}],
        "trainer": {
            "output_dir": args.output_dir, "max_steps": args.steps, "learning_rate": args.lr,
            "gradient_accumulation_steps": args.micro_batches, "async_rollouts": args.async_rollouts,
            "lr_scheduler_type": "constant", "groups_per_step": args.groups_per_step, "seed": args.seed,
            "report_to": args.report_to, "logging_steps": args.log_every, "disable_tqdm": False,
            "max_completion_length": 4, "save_strategy": "no",
        },
    })


def judge_experiment(args) -> ExperimentConfig:
    """The policy is the judge, rewarded by agreement with the ground-truth labels; a scripted solver picks random
    candidates (half of each task's candidates are wrong, some written to pass every test). With
    ``--warmup-steps`` the policy first imitates (``sft``) the scripted ``examples_judge``: its tool call and its
    verdict in the rubric's JSON, the format a small model does not find by sampling."""
    env_args = {"solver_mode": "choose", "judge_tokens": args.judge_tokens, "tasks": training_tasks()}
    solver = {"model": "scripted", "policy": "multiagent_rl.envs.agentic_judge:random_solver", "trainable": False}
    envs = [{"id": "agentic_judge", "args": env_args, "group_size": args.group_size,
             "roles": {"solver": solver, "judge": {"model": "policy", "trainable": True}}}]
    warmup = args.warmup_steps
    if warmup:
        teacher = {"model": "scripted", "policy": "multiagent_rl.envs.agentic_judge:examples_judge",
                   "algo": {"type": "sft"}}
        envs.insert(0, {"id": "agentic_judge", "name": "agentic_judge_warmup", "args": env_args,
                        "group_size": args.group_size, "roles": {"solver": solver, "judge": teacher}})
    return ExperimentConfig.model_validate({
        "model": {"name": args.model, "lora": lora_config(args.lora)},
        "algo": {"type": "grpo"},
        "env": envs,
        "phase": warmup_then_rl(warmup, ["agentic_judge_warmup"], ["agentic_judge"], fresh_optimizer=True),
        "trainer": {
            "output_dir": args.output_dir, "max_steps": args.steps, "learning_rate": args.lr,
            "gradient_accumulation_steps": args.micro_batches, "async_rollouts": args.async_rollouts,
            "lr_scheduler_type": "constant", "groups_per_step": args.groups_per_step, "seed": args.seed,
            "report_to": args.report_to, "logging_steps": args.log_every, "disable_tqdm": False,
            "max_completion_length": args.judge_tokens, "save_strategy": "no", "temperature": args.temperature,
        },
    })


def hostile_experiment(args, weights: dict) -> ExperimentConfig:
    """Write mode; the solver attacks (scripted) and the judge is the scripted examples judge: nothing is trained
    (the tiny model's 2,048 positions cannot hold a tool-using judge's prompt), the run checks that the sandbox and
    the grading hold through every step. Short limits keep the hanging attacks cheap."""
    env_args = {"solver_mode": "write", **weights, "solver_tokens": 8192, "call_timeout": 1.0,
                "sandbox": {"timeout": 4, "cpu_seconds": 2, "memory_mb": 512, "max_processes": 16}}
    return ExperimentConfig.model_validate({
        "model": {"name": args.model, "lora": lora_config(args.lora)},
        "algo": {"type": "grpo"},
        "env": [{"id": "agentic_judge", "args": env_args, "group_size": args.group_size,
                 "roles": {"solver": {"model": "scripted", "policy": "multiagent_rl.envs.agentic_judge:hostile_solver",
                                      "trainable": False},
                           "judge": {"model": "scripted", "policy": "multiagent_rl.envs.agentic_judge:examples_judge",
                                     "trainable": False}}}],
        "trainer": {
            "output_dir": args.output_dir, "max_steps": args.steps, "learning_rate": args.lr,
            "gradient_accumulation_steps": args.micro_batches, "async_rollouts": args.async_rollouts,
            "lr_scheduler_type": "constant", "groups_per_step": args.groups_per_step, "seed": args.seed,
            "report_to": args.report_to, "logging_steps": args.log_every, "disable_tqdm": False,
            "max_completion_length": 4, "save_strategy": "no",
        },
    })


def attack_report(output_dir: str) -> dict:
    """Per attack of a ``--solver hostile`` run, read back from its traces: episodes, failed episodes (with their
    errors), and the highest tests share, ground truth, judged pass and reward the solver got (ground truth and
    judged pass should be 0; a function that returns None meets the tests and examples that expect a falsy value or
    None, which the tests share and the judge's partial verdicts show); and what the run left on the machine."""
    import tempfile
    from pathlib import Path

    from multiagent_rl.tools.sandbox import cgroups
    from multiagent_rl.data.traces import dataset_to_episodes, load_traces

    rows: dict[str, dict] = {}
    for _, ep in dataset_to_episodes(load_traces(Path(output_dir, "traces"))):
        solvers = ep.by_role("solver")
        reply = solvers[0].last_reply if solvers else ""
        name = reply.split("# attack: ", 1)[1].split("\n", 1)[0] if "# attack: " in reply else "unknown"
        row = rows.setdefault(name, {"episodes": 0, "failed": 0, "tests": 0.0, "correct": 0.0, "judged_pass": 0.0,
                                     "reward": 0.0, "errors": []})
        row["episodes"] += 1
        if not ep.ok or not solvers:
            row["failed"] += 1
            row["errors"] = sorted(set(row["errors"]) | {ep.errors[0].splitlines()[0][:160]})
            continue
        for key in ("tests", "correct", "judged_pass"):
            row[key] = max(row[key], solvers[0].metrics.get(key, 0.0))
        row["reward"] = max(row["reward"], solvers[0].reward)
    support = cgroups.support()
    left = {
        "workspaces": sorted(p.name for p in Path(tempfile.gettempdir()).glob("*")
                             if p.name.startswith(("judge-", "truth-"))),
        "mounts": [line.split()[1] for line in open("/proc/mounts") if "/judge-" in line or "/truth-" in line],
        "control_groups": [] if support.memory is None else sorted(p.name for p in support.memory.glob("cmd-*")),
    }
    return {"attacks": dict(sorted(rows.items())), "left_on_the_machine": left}


def curves(log_history: list[dict], role: str = "solver") -> list[dict]:
    """Per logging step, the trained ``role``'s metrics (means over the step's episodes)."""
    rows = []
    for h in log_history:
        row = {"step": h["step"]}
        for key in METRICS if role == "solver" else JUDGE_METRICS:
            found = [v for k, v in h.items() if k.startswith(f"agentic_judge/{role}/") and k.endswith("/" + key)]
            if found:
                row[key] = found[0]
        if len(row) > 1:
            rows.append(row)
    return rows


def summarize(rows: list[dict], first: int, keys: tuple[str, ...] = METRICS[:4]) -> dict:
    def mean(key, among):
        values = [r[key] for r in among if key in r]
        return sum(values) / len(values) if values else None

    start, last = rows[:first], rows[-max(1, len(rows) // 4):]
    return {f"{key}_{part}": mean(key, among) for key in keys
            for part, among in (("start", start), ("last_quarter", last))}


def plot(rows: list[dict], path: str, title: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    labels = (("judged_pass", "judged pass rate"), ("correct", "truly correct (labels)"),
              ("tests_pass", "passes all tests"), ("fooled_tests", "passes all tests, wrong"),
              ("verdict", "judge: verdict parses"), ("agrees", "judge: agrees with the label"))
    for key, label in labels:
        if not any(key in r for r in rows):
            continue
        ax.plot([r["step"] for r in rows if key in r], [r[key] for r in rows if key in r], label=label)
    ax.set_xlabel("step")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.savefig(path, bbox_inches="tight")


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--model", default="tiny",
                   help="the policy: 'tiny', 'smollm2-135m', a Hub id or a folder (the judge needs a real model)")
    p.add_argument("--reward", choices=("judge", "tests"), default="judge",
                   help="the solver's reward: the judge's verdict, or the share of unit tests passed")
    p.add_argument("--solver", choices=("policy", "hostile"), default="policy",
                   help="'hostile': a scripted solver writes attacks instead of code (write mode), the scripted judge "
                        "judges them, nothing is trained: a check that the sandbox and the grading hold in a run")
    p.add_argument("--train", choices=("solver", "judge"), default="solver",
                   help="the seat the policy plays and trains: the solver (judged by --judge-model), or the judge "
                        "(rewarded by agreement with the labels; a scripted solver picks random candidates)")
    p.add_argument("--judge-tokens", type=int, default=256, help="with --train judge: most tokens per judge reply")
    p.add_argument("--warmup-steps", type=int, default=0,
                   help="with --train judge: first this many sft steps imitating the scripted examples_judge (its "
                        "tool call and its verdict's JSON), then RL; counted in --steps; e.g. 20 for --model smollm2-135m")
    p.add_argument("--eval-every", type=int, default=0,
                   help="with --train judge: steps between held-out evaluations of the judge (greedy, every candidate "
                        "of 6 tasks it never trains on); it is always evaluated before the first step, after the "
                        "warm-up and after the last step")
    p.add_argument("--temperature", type=float, default=1.0,
                   help="sampling temperature of the policy (trained at it); e.g. 0.7 for a small chat model judge")
    p.add_argument("--judge-model", default="scripted",
                   help="'scripted' (examples_judge) or a served model, e.g. vllm:http://HOST:8000/v1#MODEL")
    p.add_argument("--steps", type=int, default=120, help="training steps")
    p.add_argument("--group-size", type=int, default=8, help="episodes per task")
    p.add_argument("--groups-per-step", type=int, default=4, help="tasks per step")
    p.add_argument("--lr", type=float, default=2e-3, help="learning rate")
    p.add_argument("--log-every", type=int, default=2, help="steps between log lines")
    p.add_argument("--start-logs", type=int, default=3, help="logging steps averaged as the starting level")
    p.add_argument("--seed", type=int, default=0, help="seeds the run")
    p.add_argument("--output-dir", default="outputs/agentic_judge", help="where everything is written")
    p.add_argument("--report-to", nargs="*", default=[], help="trackers, e.g. wandb or trackio")
    add_hub_flags(p)
    add_lora_flag(p)
    add_micro_batches_flag(p)
    args = p.parse_args(argv)
    if args.train == "judge" and args.solver == "hostile":
        p.error("--train judge with --solver hostile: the hostile run trains nothing; drop one of them")
    if args.warmup_steps and (args.train != "judge" or args.warmup_steps >= args.steps):
        p.error(f"--warmup-steps {args.warmup_steps}: a warm-up of the judge, so with --train judge, and fewer than "
                f"--steps ({args.steps}) so that RL runs after it")
    if args.train == "judge" and args.model == "tiny":
        p.error("--train judge needs a model whose context holds the judge's prompt (~2,000-2,400 tokens; the tiny "
                "model has 2,048 positions): e.g. --model smollm2-135m --lora 16")

    evaluation = JudgeEvaluation(args.eval_every, args.warmup_steps, args.judge_tokens) \
        if args.train == "judge" else None
    trainer = MixedAlgorithmTrainer(experiment(args), callbacks=[evaluation] if evaluation else None)
    if evaluation:
        evaluation.trainer = trainer
    interrupted = train(trainer)
    rows = curves(trainer.state.log_history, args.train)
    summary = {
        "command": "python recipes/agentic_judge.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "trained": args.train, "reward": args.reward if args.train == "solver" else "agreement",
        "steps": trainer.state.global_step, "interrupted": interrupted is not None,
        **summarize(rows, args.start_logs, METRICS[:4] if args.train == "solver" else JUDGE_METRICS), "curves": rows,
    }
    if evaluation:
        summary.update(held_out_before=evaluation.points[0], held_out_after=evaluation.points[-1],
                       held_out=evaluation.points)
    if args.solver == "hostile":
        summary.update(attack_report(args.output_dir))
    title = (f"solver rewarded by the {args.reward}" if args.train == "solver" else "judge rewarded by agreement")
    finish(trainer, summary, lambda path: plot(rows, path, f"{title}, seed {args.seed}"),
           "judge.png", interrupted, push_to_hub=args.push_to_hub, public=args.public)
    return summary


if __name__ == "__main__":
    main()
