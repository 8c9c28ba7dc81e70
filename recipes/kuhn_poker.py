"""Kuhn poker self-play, measured exactly.

    python recipes/kuhn_poker.py                       # tiny model, CPU, rae, ~10 minutes on 2 cores
    accelerate launch recipes/kuhn_poker.py --model Qwen/Qwen2.5-0.5B-Instruct

One policy plays both seats. Every reply goes through the legal-action harness: it is constrained
to the two legal words and trained with the softmax over just those (``--free-text`` lets the
model reply anything, re-prompting and then forfeiting invalid replies). Phase 1
(``--warmup-steps``) imitates, with ``sft``, a scripted player whose mixed strategy is random at
every information state: no game knowledge, but the policy learns to look at its card. Phase 2
is self-play RL (``--algo``, default ``rae``) with an entropy bonus (``--entropy-coef``) over the
two legal words, which keeps the policy from collapsing into pure strategies. Every
``--eval-every`` steps the policy's action probabilities are read at all 12 information states
and OpenSpiel computes the exploitability of the current policy and of the reach-weighted average
of the policies seen so far (self-play policy gradient cycles; the average converges).
Outputs in ``--output-dir``: ``summary.json``, ``exploitability.png``, the episodes (JSON lines)
and the final model.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from multiagent_rl.config import ExperimentConfig  # noqa: E402
from multiagent_rl.eval import kuhn  # noqa: E402
from multiagent_rl.eval.kuhn import KuhnEvaluation  # noqa: E402
from multiagent_rl.trainer import MixedAlgorithmTrainer, WarmupLearningRate  # noqa: E402

WARMUP_POLICY = "multiagent_rl.envs.kuhn_poker:random_mixed_policy"


def experiment(args) -> ExperimentConfig:
    """The run as one config object (the same schema as ``--config file.toml``)."""
    warmup_seat = {"model": "scripted", "policy": WARMUP_POLICY, "policy_args": {"seed": args.seed, "low": 0.1, "high": 0.9, "two_point": True},
                   "trainable": True, "algo": {"type": "sft"}}
    env_args = {"legal_choices": not args.free_text}
    envs = [{"id": "kuhn_poker", "name": "kuhn_selfplay", "args": env_args, "group_size": args.group_size,
             "start_step": args.warmup_steps}]
    if args.warmup_steps:
        envs.insert(0, {"id": "kuhn_poker", "name": "kuhn_warmup", "args": env_args, "group_size": args.group_size,
                        "stop_step": args.warmup_steps,
                        "roles": {"player_0": warmup_seat, "player_1": warmup_seat}})
    return ExperimentConfig.model_validate({
        "algo": _algo(args.algo),
        "model": {"name": args.model},
        "env": envs,
        "trainer": {
            "output_dir": args.output_dir,
            "max_steps": args.steps,
            "learning_rate": args.lr,
            "entropy_coef": args.entropy_coef,
            "lr_scheduler_type": "constant",
            "groups_per_step": args.groups_per_step,
            "seed": args.seed,
            "report_to": args.report_to,
            "save_strategy": "no",
            "logging_steps": args.eval_every,
            "disable_tqdm": False,
        },
    })


def _algo(name: str) -> dict:
    if name == "grpo_std":
        return {"type": "grpo", "scale_rewards": True}
    return {"type": name}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="tiny", help="'tiny' (embedded, CPU), a hub id or a local path")
    p.add_argument("--algo", default="rae", help="rae | grpo | grpo_std (grpo with std scaling) | max_rl | ...")
    p.add_argument("--steps", type=int, default=500, help="training steps, warm-up included")
    p.add_argument("--warmup-steps", type=int, default=100, help="sft steps imitating a random mixed strategy")
    p.add_argument("--group-size", type=int, default=8, help="episodes per deal")
    p.add_argument("--groups-per-step", type=int, default=32, help="deals per step per process")
    p.add_argument("--lr", type=float, default=3e-4, help="Adam learning rate of the RL phase")
    p.add_argument("--warmup-lr", type=float, default=3e-3, help="learning rate of the sft warm-up")
    p.add_argument("--entropy-coef", type=float, default=None,
                   help="entropy bonus on the RL tokens (TRL's entropy_coef). Default 0.3 with the legal-action "
                        "harness, where it is the entropy over the two legal words and keeps self-play from "
                        "collapsing to pure strategies; 0 with --free-text, where it would spread mass over the "
                        "whole vocabulary")
    p.add_argument("--free-text", action="store_true",
                   help="free-text replies (invalid ones re-prompted, then forfeited) instead of the legal-action harness")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--output-dir", default="outputs/kuhn_poker")
    p.add_argument("--config", help="a TOML experiment config; replaces the flags above except --output-dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--report-to", nargs="*", default=[], help="trackers, e.g. wandb (WANDB_MODE=offline) or trackio")
    args = p.parse_args(argv)
    if args.entropy_coef is None:
        args.entropy_coef = 0.0 if args.free_text else 0.3

    config = ExperimentConfig.from_toml(args.config) if args.config else experiment(args)
    config.trainer.setdefault("output_dir", args.output_dir)
    warmup = max((e.stop_step or 0) for e in config.env if e.stop_step is not None) if any(
        e.stop_step for e in config.env) else 0
    legal_choices = any(e.args.get("legal_choices", False) for e in config.env if e.id == "kuhn_poker")
    evaluation = KuhnEvaluation(args.eval_every, start_step=warmup, legal_choices=legal_choices)
    trainer = MixedAlgorithmTrainer(config, callbacks=[evaluation, WarmupLearningRate(warmup, args.warmup_lr)])
    evaluation.trainer = trainer
    trainer.train()

    out = Path(trainer.args.output_dir)
    final = evaluation.points[-1]
    summary = {
        "command": "python recipes/kuhn_poker.py " + " ".join(argv if argv is not None else os.sys.argv[1:]),
        "algo": config.algo.model_dump(),
        "legal_choices": legal_choices,
        "final_exploitability": final["exploitability"],
        "final_avg_exploitability": final["avg_exploitability"],
        "final_invalid_reply_rate": final["invalid_reply_rate"],
        "episodes": final["episodes"],
        "seconds": final["seconds"],
        "report": kuhn.evaluation_report(kuhn.read_policy(
            trainer.accelerator.unwrap_model(trainer.model), trainer.tokenizer, legal_choices=legal_choices)),
        "avg_report": kuhn.evaluation_report(evaluation.average.table()) if len(evaluation.average) else None,
        "curve": evaluation.points,
    }
    if trainer.accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        kuhn.plot_exploitability(evaluation.points, str(out / "exploitability.png"))
        trainer.save_model(str(out / "final_model"))
        print(json.dumps({k: v for k, v in summary.items() if k not in ("curve", "report", "avg_report")}, indent=2))
        print(f"wrote {out / 'summary.json'} and {out / 'exploitability.png'}")
    return summary


if __name__ == "__main__":
    main()
