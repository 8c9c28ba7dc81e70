"""Kuhn poker self-play, measured exactly.

    python recipes/kuhn_poker.py                       # tiny model, CPU (wall time: docs/kuhn_poker_results.md)
    python recipes/kuhn_poker.py --resume              # continue from the latest checkpoint in --output-dir
    accelerate launch recipes/kuhn_poker.py --model Qwen/Qwen2.5-0.5B-Instruct

One policy plays both seats (``--opponents pool``: each seat against a frozen past snapshot of itself, drawn per
deal from its opponent pool, ``--pool-rule``, ``--snapshot-every``; ``--opponents average``: against the exact
reach-weighted average of its evaluated policies). Every reply goes through the legal-action harness: it is constrained
to the two legal words and trained with the softmax over just those (``--free-text`` lets the
model reply anything, re-prompting and then forfeiting invalid replies). Phase 1
(``--warmup-steps``) imitates, with ``sft``, a scripted player whose mixed strategy is random at
every information state: no game knowledge, but the policy learns to look at its card (twice as many
episodes per deal as the RL phase, ``--warmup-group-size``; its last step prints how closely the policy plays
that teacher and warns where it has not learned to read its card). Phase 2
is self-play RL (``--algo``, default ``grpo``: a deal's episodes are one group, so the baseline is that
deal's mean) with a fresh Adam, a learning rate decaying linearly to ``--final-lr-ratio`` × ``--lr``, and
a pull toward a magnet that moves (R-NaD-style,
``--magnet-coef``, ``--magnet-every``): for the first period a pull toward the uniform policy over
the two legal words (an entropy bonus, which keeps the policy from collapsing into pure strategies),
then toward a frozen copy of the policy renewed every period, so the regularisation has no fixed
floor. ``--magnet-coef 0`` uses a constant entropy bonus instead (``--entropy-coef``, the setting of
the earlier results: ``--magnet-coef 0 --steps 500 --groups-per-step 32``). Every
``--eval-every`` steps the policy's action probabilities are read at all 12 information states
and OpenSpiel computes the exploitability of the current policy and of the reach-weighted average
of the policies seen so far (self-play policy gradient cycles; the average converges).

A checkpoint is saved every ``--save-every`` steps (``--resume`` continues from the latest, with
the same deals, baselines and evaluation curve as an uninterrupted run). Ctrl-C finishes the step
in flight, saves a checkpoint, the summary and the model, and exits with status 130.
``--algo max_rl`` trains on the chips mapped to [0, 1], (chips + 2) / 4, since MaxRL needs
rewards in [0, 1]. Outputs in ``--output-dir``: ``summary.json``, ``exploitability.png``, the
episodes (Parquet trace shards, or JSON lines with ``--episode-format jsonl``), checkpoints and the final model.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from multiagent_rl.config import ExperimentConfig  # noqa: E402
from multiagent_rl.envs.kuhn_poker import KuhnPokerEnv  # noqa: E402
from multiagent_rl.envs.kuhn_poker.exploitability import evaluation_report  # noqa: E402
from multiagent_rl.games.evaluation import AverageOpponent  # noqa: E402
from multiagent_rl.envs.kuhn_poker import random_mixed_table, table_policy  # noqa: E402
from multiagent_rl.envs.kuhn_poker.evaluation import (KuhnEvaluation, WarmupCheck, plot_exploitability,  # noqa: E402
                                                        read_policy)
from multiagent_rl.training.run import (add_hub_flags, add_lora_flag, add_micro_batches_flag,  # noqa: E402
                                        close_episode_log, lora_config, publish, results_table)
from multiagent_rl.training.trainer import MixedAlgorithmTrainer, TrainingInterrupted  # noqa: E402

WARMUP_POLICY = "multiagent_rl.envs.kuhn_poker:random_mixed_policy"

DEFAULTS = dict(model="tiny", backend="transformers", vllm_mode="colocate", vllm_url=None, algo="grpo", steps=2400,
                warmup_steps=100, group_size=8, warmup_group_size=None, groups_per_step=16, lr=3e-4, warmup_lr=3e-3, entropy_coef=None,
                entropy_final=None, magnet_coef=None, magnet_every=200, final_lr_ratio=None,
                opponents="self", pool_rule="uniform", snapshot_every=50, pool_size=100,
                output_dir="outputs/kuhn_poker", seed=0, report_to=[])
# Flags that rewrite a --config file's settings, and where they go.
OVERRIDES = {"steps": "max_steps", "lr": "learning_rate", "seed": "seed", "report_to": "report_to",
             "groups_per_step": "groups_per_step", "output_dir": "output_dir"}
NOT_WITH_CONFIG = ("warmup_steps", "warmup_group_size", "warmup_lr", "free_text", "backend", "vllm_mode", "vllm_url",
                   "entropy_coef", "entropy_final",
                   "magnet_coef", "magnet_every", "final_lr_ratio", "opponents", "pool_rule", "snapshot_every",
                   "pool_size")


def warmup_teacher(config: ExperimentConfig) -> dict | None:
    """The table the warm-up seats imitate, when they play the recipe's scripted warm-up policy."""
    for env in config.env:
        for role in env.roles.values():
            if role.policy == WARMUP_POLICY:
                return random_mixed_table(**role.policy_args)
    return None


# the exact average policy as a scripted seat (--opponents average); main() hands it the evaluation
AVERAGE_OPPONENT = AverageOpponent(table_policy, random_mixed_table(low=0.5, high=0.5))


def experiment(args) -> ExperimentConfig:
    """The run as one config object (the same schema as ``--config file.toml``)."""
    warmup_seat = {"model": "scripted", "policy": WARMUP_POLICY, "policy_args": {"seed": args.seed, "low": 0.1, "high": 0.9, "two_point": True},
                   "algo": {"type": "sft"}}
    env_args = {"legal_choices": not args.free_text, "reward": "unit" if args.algo == "max_rl" else "chips"}
    envs = [{"id": "kuhn_poker", "args": env_args, "group_size": args.group_size}]  # labelled by its id
    policies = {}
    if args.opponents == "average":  # each seat against the exact average policy: the other seat is scripted
        seat = {"model": "scripted", "policy": AVERAGE_OPPONENT, "trainable": False}
        envs = [{"id": "kuhn_poker", "name": f"kuhn_vs_average_{learner}", "args": env_args,
                 "group_size": args.group_size, "roles": {other: seat}}
                for learner, other in (("p0", "player_1"), ("p1", "player_0"))]
    if args.opponents == "pool":  # the policy plays each seat against a snapshot drawn from its pool
        seat = {"model": "pool:policy", "pool": {"rule": args.pool_rule}}
        envs = [{"id": "kuhn_poker", "name": f"kuhn_vs_pool_{learner}", "args": env_args, "group_size": args.group_size,
                 "roles": {other: seat}} for learner, other in (("p0", "player_1"), ("p1", "player_0"))]
        policies = {"policy": {"snapshot_every": args.snapshot_every, "snapshot_start": args.warmup_steps,
                               "pool_size": args.pool_size}}
    rl_envs = [e.get("name", e["id"]) for e in envs]
    phases = []
    if args.warmup_steps:
        envs.insert(0, {"id": "kuhn_poker", "name": "kuhn_poker_warmup", "args": env_args,
                        "group_size": args.warmup_group_size,
                        "roles": {"player_0": warmup_seat, "player_1": warmup_seat}})
        # the RL phase starts with a fresh Adam: the warm-up's second moments would shrink its first few hundred steps
        phases = [{"name": "warmup", "steps": args.warmup_steps, "envs": ["kuhn_poker_warmup"],
                   "learning_rate": args.warmup_lr},
                  {"name": "selfplay", "envs": rl_envs, "fresh_optimizer": not args.carry_warmup_optimizer}]
    regularisers = []
    if args.entropy_coef or args.entropy_final is not None:
        regularisers.append({"type": "entropy", "coef": args.entropy_coef,
                             **({"final": args.entropy_final, "anneal_start": args.warmup_steps}
                                if args.entropy_final is not None else {})})
    if args.magnet_coef:
        regularisers.append({"type": "magnet", "coef": args.magnet_coef, "start": args.warmup_steps,
                             "every": args.magnet_every})
    return ExperimentConfig.model_validate({
        "algo": _algo(args.algo),
        "model": {"name": args.model, "backend": args.backend, "lora": lora_config(args.lora),
                  "vllm": {"mode": args.vllm_mode, **({"base_url": args.vllm_url} if args.vllm_url else {})}},
        "env": envs,
        "policies": policies,
        "phase": phases,
        "regulariser": regularisers,
        "trainer": {
            "output_dir": args.output_dir,
            "max_steps": args.steps, "gradient_accumulation_steps": args.micro_batches,
            "async_rollouts": args.async_rollouts,
            "learning_rate": args.lr,
            # transformers' polynomial schedule with power 1 is a linear decay to lr_end at the last step
            **({"lr_scheduler_type": "polynomial",
                "lr_scheduler_kwargs": {"lr_end": args.lr * args.final_lr_ratio, "power": 1.0}}
               if args.final_lr_ratio < 1 else {"lr_scheduler_type": "constant"}),
            "groups_per_step": args.groups_per_step,
            "seed": args.seed,
            "report_to": args.report_to,
            "logging_steps": args.eval_every,
            "disable_tqdm": False,
        },
    })


def from_file(path: str, args, given: set[str]) -> ExperimentConfig:
    """A TOML experiment, with the flags given on the command line written over it."""
    config = ExperimentConfig.from_toml(path)
    clash = sorted(f"--{k.replace('_', '-')}" for k in given & set(NOT_WITH_CONFIG))
    if clash:
        raise SystemExit(f"{', '.join(clash)} cannot be combined with --config: set the phases and regularisers in the "
                         "file instead ([[phase]], [[regulariser]])")
    data = config.model_dump()
    for flag, key in OVERRIDES.items():
        if flag in given:
            data["trainer"][key] = getattr(args, flag)
    if "model" in given:
        data["model"]["name"] = args.model
    if "algo" in given:
        data["algo"] = _algo(args.algo)
    for env, original in zip(data["env"], config.env):
        env["instance"] = original.instance
        if "group_size" in given:
            env["group_size"] = args.group_size
        if "algo" in given and args.algo == "max_rl" and env["id"] == "kuhn_poker":
            env["args"]["reward"] = "unit"
    data["trainer"].setdefault("output_dir", args.output_dir)
    return ExperimentConfig.model_validate(data)


def _algo(name: str) -> dict:
    if name == "grpo_std":
        return {"type": "grpo", "scale_rewards": True}
    return {"type": name}


def parse(argv=None) -> tuple[argparse.Namespace, set[str]]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="'tiny' (embedded, CPU), a hub id or a local path (default tiny)")
    p.add_argument("--backend", choices=("transformers", "vllm"), help="what samples the policy (default transformers)")
    p.add_argument("--vllm-mode", choices=("colocate", "server"), help="with --backend vllm (default colocate)")
    p.add_argument("--vllm-url", help="with --vllm-mode server: the server's API root, e.g. http://127.0.0.1:8000/v1")
    p.add_argument("--algo", help="grpo (default; each deal's episodes are one group) | rae | grpo_std (grpo with std "
                                  "scaling) | max_rl | ...")
    p.add_argument("--steps", type=int, help="training steps, warm-up included (default 2400)")
    p.add_argument("--warmup-steps", type=int, help="sft steps imitating a random mixed strategy (default 100)")
    p.add_argument("--group-size", type=int, help="episodes per deal (default 8)")
    p.add_argument("--warmup-group-size", type=int,
                   help="episodes per deal in the warm-up (default twice --group-size: enough games per step for the "
                        "policy to learn to read its card; docs/kuhn_poker_results.md)")
    p.add_argument("--groups-per-step", type=int, help="deals per step per process (default 16)")
    p.add_argument("--lr", type=float, help="Adam learning rate of the RL phase (default 3e-4)")
    p.add_argument("--warmup-lr", type=float, help="learning rate of the sft warm-up (default 3e-3)")
    p.add_argument("--entropy-coef", type=float,
                   help="entropy bonus on the RL tokens (the entropy regulariser's coef). Default 0 (the magnet's first period "
                        "plays its part); 0.3 with --magnet-coef 0 and the legal-action harness, where it is the entropy "
                        "over the two legal words and keeps self-play from collapsing to pure strategies; 0 with "
                        "--free-text, where it would spread mass over the whole vocabulary")
    p.add_argument("--entropy-final", type=float,
                   help="anneal the entropy bonus linearly to this value, from the end of the warm-up to the last "
                        "step (the entropy regulariser's final; default: a constant bonus)")
    p.add_argument("--magnet-coef", type=float,
                   help="R-NaD-style regularisation: weight of the KL pull toward a magnet that is uniform for "
                        "--magnet-every steps after the warm-up, then a frozen copy of the policy renewed every "
                        "--magnet-every steps (the magnet regulariser's coef). Default 0.3 with the legal-action harness; "
                        "0 (off) with --free-text, where a uniform magnet would spread mass over the whole vocabulary")
    p.add_argument("--magnet-every", type=int, help="steps between magnet renewals (default 200)")
    p.add_argument("--final-lr-ratio", type=float,
                   help="decay the learning rate linearly from --lr at step 0 to this fraction of it at the last step "
                        "(the warm-up's own rate overrides its steps). Default 0.3 with the magnet (near the fixed "
                        "point a constant rate leaves Adam's steps a random walk of the sampling noise), 1 (constant) "
                        "without it")
    p.add_argument("--opponents", choices=("self", "pool", "average"),
                   help="self: the policy plays both seats of every game (default); pool: it plays each seat against a "
                        "frozen past snapshot of itself drawn per deal from its opponent pool (--pool-rule); average: "
                        "against the exact reach-weighted average of its evaluated policies (tabular fictitious play)")
    p.add_argument("--pool-rule", choices=("uniform", "latest", "pfsp"),
                   help="with --opponents pool: uniform over the pool (fictitious self-play, default), the latest 5, or "
                        "prioritised by the learner's losses against each snapshot (PFSP)")
    p.add_argument("--snapshot-every", type=int,
                   help="with --opponents pool: steps between snapshots, from the end of the warm-up (default 50)")
    p.add_argument("--pool-size", type=int, help="with --opponents pool: most snapshots kept (default 100)")
    p.add_argument("--carry-warmup-optimizer", action="store_true",
                   help="keep the warm-up's Adam state into the RL phase instead of starting RL with a fresh one "
                        "(the setting of the earlier results in docs/kuhn_poker_results.md)")
    p.add_argument("--free-text", action="store_true", default=None,
                   help="free-text replies (invalid ones re-prompted, then forfeited) instead of the legal-action harness")
    p.add_argument("--eval-every", type=int, default=10, help="steps between exact evaluations (and log lines)")
    p.add_argument("--eval-at-start", action="store_true",
                   help="also evaluate the untrained model before the first step (summary: 'before')")
    p.add_argument("--save-every", type=int, default=100, help="steps between checkpoints (0: none)")
    p.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in --output-dir")
    p.add_argument("--output-dir", help="where everything is written (default outputs/kuhn_poker)")
    p.add_argument("--episode-format", choices=("parquet", "jsonl"), default="parquet",
                   help="the episode log: Parquet trace shards in traces/ or JSON lines in episodes/")
    p.add_argument("--config", help="a TOML experiment config; flags given explicitly are written over it")
    p.add_argument("--seed", type=int, help="default 0")
    p.add_argument("--report-to", nargs="*", help="trackers, e.g. wandb (WANDB_MODE=offline) or trackio")
    add_hub_flags(p)
    add_lora_flag(p)
    add_micro_batches_flag(p)
    args = p.parse_args(argv)
    given = {k for k, v in vars(args).items() if v is not None and k in DEFAULTS or (k == "free_text" and v)}
    for key, value in DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    args.free_text = bool(args.free_text)
    if args.warmup_group_size is None:
        args.warmup_group_size = 2 * args.group_size
    if args.magnet_coef is None:
        args.magnet_coef = 0.0 if args.free_text else 0.3
    if args.entropy_coef is None:
        args.entropy_coef = 0.0 if args.free_text or args.magnet_coef else 0.3
    if args.final_lr_ratio is None:
        args.final_lr_ratio = 0.3 if args.magnet_coef else 1.0
    if not 0 < args.final_lr_ratio <= 1:
        p.error(f"--final-lr-ratio {args.final_lr_ratio}: a fraction of --lr in (0, 1] (1: a constant rate)")
    return args, given


def main(argv=None) -> dict:
    args, given = parse(argv)
    config = from_file(args.config, args, given) if args.config else experiment(args)
    trainer_cfg = config.trainer
    trainer_cfg.setdefault("output_dir", args.output_dir)
    trainer_cfg.setdefault("episode_format", args.episode_format)
    if args.save_every:
        trainer_cfg.update(save_strategy="steps", save_steps=args.save_every, save_total_limit=2)
    else:
        trainer_cfg["save_strategy"] = "no"
    stops = [e.stop_step for e in config.env if e.stop_step is not None]
    warmup = max(stops, default=0)
    evaluation = KuhnEvaluation(args.eval_every, start_step=warmup, at_start=args.eval_at_start)
    AVERAGE_OPPONENT.evaluation = evaluation
    teacher = warmup_teacher(config) if warmup else None
    check = WarmupCheck(warmup, teacher, evaluation) if teacher else None
    trainer = MixedAlgorithmTrainer(config, callbacks=[evaluation, *([check] if check else [])])
    evaluation.trainer = trainer
    legal_choices = any(isinstance(slot.env, KuhnPokerEnv) and slot.env.legal_choices for slot in trainer.rollout.slots)
    evaluation.legal_choices = legal_choices
    interrupted = None
    try:
        trainer.train(resume_from_checkpoint=True if args.resume else None)
    except TrainingInterrupted as exc:
        interrupted = exc

    out = Path(trainer.args.output_dir)
    final = evaluation.points[-1] if evaluation.points else {}
    model = trainer.accelerator.unwrap_model(trainer.model)
    summary = {
        "command": "python recipes/kuhn_poker.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "algo": config.algorithm_for(config.env[-1], None).model_dump(),
        "legal_choices": legal_choices,
        "steps": trainer.state.global_step,
        "interrupted": interrupted is not None,
        "before": evaluation.points[0] if args.eval_at_start and evaluation.points else None,
        "final_exploitability": final.get("exploitability"),
        "final_avg_exploitability": final.get("avg_exploitability"),
        "final_invalid_reply_rate": final.get("invalid_reply_rate"),
        "warmup_check": check.report if check else None,
        "episodes": trainer.rollout.episodes_played,
        # from the evaluation's creation (model loaded) to the last evaluation point: training time, without the
        # loading before it and this summary's reports after it
        "seconds_to_last_evaluation": final.get("seconds"),
        "report": evaluation_report(read_policy(model, trainer.tokenizer, legal_choices=legal_choices)),
        "avg_report": evaluation_report(evaluation.average.table()) if len(evaluation.average) else None,
        "curve": evaluation.points,
    }
    close_episode_log(trainer)
    if trainer.accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        if evaluation.points:
            plot_exploitability(evaluation.points, str(out / "exploitability.png"))
        trainer.command = summary["command"]
        trainer.model_card_results = results_table(summary, ("curve", "report", "avg_report", "warmup_check"))
        trainer.save_model(str(out / "final_model"))
        print(json.dumps({k: v for k, v in summary.items() if k not in ("curve", "report", "avg_report")}, indent=2))
        print(f"wrote {out / 'summary.json'} and {out / 'exploitability.png'}")
        if args.push_to_hub and interrupted is None:
            print("pushed: " + ", ".join(publish(trainer, args.push_to_hub, public=args.public).values()))
        elif args.push_to_hub:
            print(f"not pushed to {args.push_to_hub}: the run was interrupted; resume it to the end, then push")
        if interrupted is not None:
            print(f"interrupted at step {interrupted.step}: checkpoint {interrupted.checkpoint}, summary "
                  f"{out / 'summary.json'}, model {out / 'final_model'}; continue with --resume", flush=True)
    trainer.accelerator.end_training()  # trackers closed, the process group torn down before the interpreter exits
    if interrupted is not None:
        sys.exit(130)
    return summary


if __name__ == "__main__":
    main()
