"""Proposer–solver curriculum on arithmetic, with a learnability reward.

    python recipes/proposer_solver.py                      # tiny model, CPU (docs/proposer_solver_results.md)
    python recipes/proposer_solver.py --proposer uniform   # the baseline: solvers trained on uniform proposals
    python recipes/proposer_solver.py --model smollm2-135m --lora 16 --free-text   # a real chat model, free text

One policy plays both roles. Phase 1 (``--warmup-steps``) imitates, with ``sft``, a scripted proposer that
writes a JSON proposal of uniformly random difficulty and a scripted solver that is right 30% of the time at
every level (``--warmup-solver-accuracy``; it teaches the formats and to read the problem). Phase 2 trains both roles with hierarchical GRPO (solvers baselined
within their episode, proposers across the task group): solvers get 1 for the right answer, the proposer the
learnability 4p(1−p) of its problem. The proposer chooses from a menu of one problem per difficulty level
(``ProposerSolverEnv(menu=True)``: its free token is the difficulty), since the embedded tiny model cannot
compute the answers it would have to write in free text. ``--free-text`` is for a pretrained chat model: the
proposer writes its problem and answer as JSON (checked: a wrong answer makes the proposal invalid), both roles
are asked with the env's ``"instructed"`` prompts, sampling is at ``--temperature`` 0.7 and there is no warm-up
unless ``--warmup-steps`` asks for one.

Measured along the way: the validity of free-text proposals right after the warm-up (sampled from the
policy), and per logging step the mean learnability of the trained proposer's problems and, on the same
solver, of a scripted uniform proposer's (a probe env whose episodes are not trained on), the distribution
of proposed difficulty, and the solver's greedy accuracy on a fixed held-out set per difficulty.
Outputs in ``--output-dir``: ``summary.json``, ``curriculum.png``, the episodes, the final model.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from multiagent_rl.config import ExperimentConfig  # noqa: E402
from multiagent_rl.training.phases import warmup_then_rl  # noqa: E402
from multiagent_rl.envs.proposer_solver.evaluation import SolverEvaluation, curves, plot_curriculum  # noqa: E402
from multiagent_rl.training.run import (HelpFormatter, add_hub_flags, add_lora_flag,  # noqa: E402
                                        add_micro_batches_flag, finish, lora_config, train)
from multiagent_rl.training.trainer import MixedAlgorithmTrainer  # noqa: E402

ENV = "multiagent_rl.envs.proposer_solver"


def experiment(args) -> ExperimentConfig:
    """The run as one config object (the same schema as a TOML experiment)."""
    levels = args.levels
    game = {"solvers": args.solvers, "levels": levels, "topics": [args.topic]}
    if args.free_text:
        game |= {"prompts": "instructed", "verify": True, "proposal_tokens": PROPOSAL_TOKENS,
                 "answer_tokens": ANSWER_TOKENS}
    menu = not args.free_text
    separate = args.learners == "separate"  # proposer and solver: two learners, each learning from its own seats
    bind = (lambda role: {"policy": role}) if separate else (lambda role: {})
    imitate = {"model": "scripted", "algo": {"type": "sft"}}
    uniform = {"model": "scripted", "policy": f"{ENV}:uniform_proposer"}
    envs = [
        {"id": "proposer_solver", "name": "curriculum", "args": {**game, "menu": menu}, "group_size": args.group_size,
         "roles": {"proposer": bind("proposer") if args.proposer == "trained" else uniform, "solver": bind("solver")}},
        # the same solver on a uniform proposer's problems, not trained on: the learnability baseline
        {"id": "proposer_solver", "name": "uniform_probe", "args": {**game, "menu": menu},
         "group_size": args.group_size, "weight": args.probe_weight,
         "roles": {"proposer": uniform, "solver": {"trainable": False, **bind("solver")}}},
    ]
    if args.warmup_steps:
        learner = (lambda role: {"learner": role}) if separate else (lambda role: {})
        # free text: a chat model already answers in the instructed format, so only the proposer's JSON is taught
        solver = {"model": "scripted", "policy": f"{ENV}:accurate_solver", "trainable": False} if args.free_text \
            else {**imitate, **warmup_solver(args.warmup_solver_accuracy), **learner("solver")}
        envs.insert(0, {"id": "proposer_solver", "name": "proposer_solver_warmup", "args": game,
                        "group_size": args.group_size,
                        "roles": {"proposer": {**imitate, "policy": f"{ENV}:uniform_proposer", **learner("proposer")},
                                  "solver": solver}})
    # separate learners: two LoRA adapters on one base with --lora, else two full models
    learners = {role: {} if args.lora else {"model": args.model} for role in ("proposer", "solver")}
    return ExperimentConfig.model_validate({
        "model": {"name": args.model, "lora": lora_config(args.lora)},
        "policies": learners if separate else {},
        "env": envs,
        "phase": warmup_then_rl(args.warmup_steps, ["proposer_solver_warmup"], ["curriculum", "uniform_probe"],
                                args.warmup_lr),
        "regulariser": [{"type": "entropy", "coef": args.entropy_coef}] if args.entropy_coef else [],
        "trainer": {
            "output_dir": args.output_dir, "max_steps": args.steps, "learning_rate": args.lr,
            "gradient_accumulation_steps": args.micro_batches, "async_rollouts": args.async_rollouts,
            "lr_scheduler_type": "constant", "groups_per_step": args.groups_per_step, "seed": args.seed,
            "report_to": args.report_to, "logging_steps": args.log_every, "disable_tqdm": False,
            "max_completion_length": 40, "temperature": args.temperature,
            "save_strategy": "steps" if args.save_every else "no", "save_steps": args.save_every or 500,
            "save_total_limit": 2,
        },
    })


PROPOSAL_TOKENS, ANSWER_TOKENS = 48, 16
"""Reply lengths with --free-text: a chat model's JSON proposal and a number (with room for "3 + 4 = 7")."""


def warmup_solver(accuracy: float) -> dict:
    """The scripted solver the warm-up imitates: a guesser (the answer format only) or, with ``accuracy`` > 0, a
    solver right that often (the rest of the time off by a little), which teaches the model to read the problem."""
    if accuracy <= 0:
        return {"policy": f"{ENV}:guessing_solver"}
    return {"policy": f"{ENV}:accurate_solver", "policy_args": {"accuracy": accuracy}}


def summarize(rows: list[dict], points: list[dict], levels: list[int], args, validity, validity_at_end=None) -> dict:
    rl = [r for r in rows if r["step"] > args.warmup_steps]
    last = rl[-max(1, len(rl) // 4):] if rl else []

    def mean(key, among):
        values = [r[key] for r in among if key in r]
        return sum(values) / len(values) if values else None

    trained, probe = mean("curriculum/learnability", last), mean("uniform_probe/learnability", last)
    return {
        "validity_after_warmup": validity,
        "validity_at_end": validity_at_end,
        "curriculum_validity_last_quarter": mean("curriculum/valid", last),
        "learnability_last_quarter": trained,
        "uniform_learnability_last_quarter": probe,
        "learnability_ratio": trained / probe if trained is not None and probe else None,
        "difficulty_last_quarter": {d: mean(f"curriculum/L{d}", last) for d in levels},
        "held_out_first": points[0] if points else None,
        "held_out_last": points[-1] if points else None,
        "explained": SUMMARY_KEYS,
    }


SUMMARY_KEYS = {
    "validity_after_warmup": "share of 128 proposals sampled in free text (no menu) that parse, once the warm-up "
                             "ends (before training when there is none): without --free-text a check of what the "
                             "warm-up taught, not of training (training proposes through the menu of one problem "
                             "per level, where every proposal parses)",
    "validity_at_end": "the same share after the last step",
    "curriculum_validity_last_quarter": "share of valid proposals in training, last quarter of the RL steps",
    "learnability_last_quarter": "mean learnability 4p(1-p) of the trained proposer's problems, last quarter",
    "uniform_learnability_last_quarter": "the same for the uniform probe proposer (the no-curriculum baseline)",
    "learnability_ratio": "learnability_last_quarter / uniform_learnability_last_quarter; null when the probe's is "
                          "0 or missing (every probe problem always or never solved: no ratio to take)",
    "difficulty_last_quarter": "share of the trained proposer's problems at each level, last quarter",
    "held_out_first, held_out_last": "greedy solve accuracy per level on the held-out set, before training (step "
                                      "0) and after the last step",
}
"""What each key of the summary's measurements means (also written into ``summary.json`` as ``explained``)."""


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--model", default="tiny", help="the policy: 'tiny', 'smollm2-135m', a Hub id or a folder")
    p.add_argument("--proposer", choices=("trained", "uniform"), default="trained",
                   help="'uniform' keeps the proposer scripted (uniform difficulty): the no-curriculum baseline")
    p.add_argument("--steps", type=int, default=700, help="training steps, warm-up included")
    p.add_argument("--warmup-steps", type=int, default=None,
                   help="sft steps imitating the scripted roles (0: none). Default 300; 0 with --free-text, where a "
                        "warm-up teaches the proposer alone (its JSON; the solver seat is a scripted solver)")
    p.add_argument("--free-text", action="store_true",
                   help="the proposer writes problem and answer in free text (verified) instead of choosing from a "
                        "menu, with the env's 'instructed' prompts: for a pretrained chat model")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature of the policy (trained at it). Default 1; 0.7 with --free-text")
    p.add_argument("--learners", choices=("shared", "separate"), default="shared",
                   help="shared: one policy plays proposer and solvers (default); separate: two learners, the "
                        "proposer's trained only on proposals, the solver's on answers: two LoRA adapters on one "
                        "base with --lora, else two full models")
    p.add_argument("--levels", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6], help="the difficulty levels proposed")
    p.add_argument("--topic", default="addition", help="the kind of problem")
    p.add_argument("--solvers", type=int, default=4, help="solver attempts per proposal")
    p.add_argument("--warmup-solver-accuracy", type=float, default=0.3,
                   help="the warm-up solver is right with this probability (else off by a little); 0: it guesses an "
                        "integer of the right size (the format only), which leaves the tiny solver ignoring the "
                        "problem and stuck on one answer")
    p.add_argument("--group-size", type=int, default=8, help="proposals per task group")
    p.add_argument("--groups-per-step", type=int, default=8, help="task groups per step")
    p.add_argument("--probe-weight", type=float, default=0.25, help="share of groups on the uniform probe env")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate of the RL phase")
    p.add_argument("--warmup-lr", type=float, default=3e-3, help="learning rate of the warm-up")
    p.add_argument("--entropy-coef", type=float, default=0.0, help="entropy bonus on the RL tokens (0: none)")
    p.add_argument("--eval-every", type=int, default=20, help="steps between held-out solver evaluations")
    p.add_argument("--log-every", type=int, default=5, help="steps between log lines")
    p.add_argument("--save-every", type=int, default=0, help="steps between checkpoints (0: none)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output-dir")
    p.add_argument("--seed", type=int, default=0, help="seeds the run")
    p.add_argument("--output-dir", default="outputs/proposer_solver", help="where everything is written")
    p.add_argument("--report-to", nargs="*", default=[], help="trackers, e.g. wandb or trackio")
    add_hub_flags(p)
    add_lora_flag(p)
    add_micro_batches_flag(p)
    args = p.parse_args(argv)
    if args.warmup_steps is None:
        args.warmup_steps = 0 if args.free_text else 300
    if args.temperature is None:
        args.temperature = 0.7 if args.free_text else 1.0

    config = experiment(args)
    text = {"prompts": "instructed", "answer_tokens": ANSWER_TOKENS, "proposal_tokens": PROPOSAL_TOKENS,
            "temperature": args.temperature} if args.free_text else {}
    evaluation = SolverEvaluation(args.eval_every, args.levels, args.topic, args.warmup_steps, **text)
    trainer = MixedAlgorithmTrainer(config, callbacks=[evaluation])
    evaluation.trainer = trainer
    interrupted = train(trainer, resume=args.resume)
    rows = curves(trainer.state.log_history, args.levels)
    summary = {
        "command": "python recipes/proposer_solver.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "proposer": args.proposer, "steps": trainer.state.global_step, "interrupted": interrupted is not None,
        **summarize(rows, evaluation.points, args.levels, args, evaluation.validity_after_warmup,
                    evaluation.validity_at_end),
        "curves": rows, "held_out": evaluation.points,
    }
    finish(trainer, summary, lambda path: plot_curriculum(rows, evaluation.points, args.levels, path), "curriculum.png",
           interrupted, resume_hint="; continue with --resume", push_to_hub=args.push_to_hub, public=args.public)
    return summary


if __name__ == "__main__":
    main()
