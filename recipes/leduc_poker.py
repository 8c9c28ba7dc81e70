"""Leduc poker self-play on the tiny model, with exact exploitability through OpenSpiel.

    python recipes/leduc_poker.py                     # tiny model, CPU (wall time: docs/leduc_poker.md)
    python recipes/leduc_poker.py --steps 1200        # a longer run

As the Kuhn recipe: an ``sft`` warm-up imitating a random two-point mixed strategy (``--warmup-steps``; it fixes
the reply format and makes the policy look at its cards), then self-play with one policy in both seats, the
legal-action harness and an entropy bonus (``--entropy-coef``, optionally annealed with ``--entropy-final``);
``--fresh-optimizer`` starts self-play with a fresh Adam, as the Kuhn recipe does.
Every ``--eval-every`` steps the policy is read at all 288 information states and scored with OpenSpiel: the
current policy and the reach-weighted average of the readings. Uniform random play has exploitability ~2.37.
Outputs in ``--output-dir``: ``summary.json``, ``exploitability.png``, the traces, the final model.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from multiagent_rl.envs.leduc_poker import table_policy  # noqa: E402
from multiagent_rl.envs.leduc_poker.evaluation import uniform_table  # noqa: E402
from multiagent_rl.games.evaluation import AverageOpponent  # noqa: E402
from multiagent_rl.training.phases import warmup_then_rl  # noqa: E402
from multiagent_rl.envs.leduc_poker.evaluation import LeducEvaluation  # noqa: E402
from multiagent_rl.training.run import (HelpFormatter, add_hub_flags, add_lora_flag,  # noqa: E402
                                        add_micro_batches_flag, finish, lora_config, train)
from multiagent_rl.training.trainer import MixedAlgorithmTrainer  # noqa: E402

ENV = "multiagent_rl.envs.leduc_poker"
# the exact average policy as a scripted seat (--opponents average); main() hands it the evaluation
AVERAGE_OPPONENT = AverageOpponent(table_policy, uniform_table())


def experiment(args) -> dict:
    warmup_seat = {"model": "scripted", "policy": f"{ENV}:random_mixed_policy", "policy_args": {"seed": args.seed},
                   "algo": {"type": "sft"}}
    envs = [{"id": "leduc_poker", "group_size": args.group_size}]  # labelled by its id
    policies, rl_envs = {}, ["leduc_poker"]
    if args.opponents == "average":  # each seat against the exact average policy: the other seat is scripted
        seat = {"model": "scripted", "policy": AVERAGE_OPPONENT, "trainable": False}
        envs = [{"id": "leduc_poker", "name": f"leduc_vs_average_{learner}", "group_size": args.group_size,
                 "roles": {other: seat}} for learner, other in (("p0", "player_1"), ("p1", "player_0"))]
        rl_envs = [e["name"] for e in envs]
    if args.opponents == "pool":  # the policy plays each seat against a snapshot drawn from its pool
        seat = {"model": "pool:policy", "pool": {"rule": args.pool_rule}}
        envs = [{"id": "leduc_poker", "name": f"leduc_vs_pool_{learner}", "group_size": args.group_size,
                 "roles": {other: seat}} for learner, other in (("p0", "player_1"), ("p1", "player_0"))]
        rl_envs = [e["name"] for e in envs]
        policies = {"policy": {"snapshot_every": args.snapshot_every, "snapshot_start": args.warmup_steps,
                               "pool_size": args.pool_size}}
    if args.warmup_steps:
        envs.insert(0, {"id": "leduc_poker", "name": "leduc_poker_warmup", "group_size": args.group_size,
                        "roles": {"player_0": warmup_seat, "player_1": warmup_seat}})
    trainer = {"output_dir": args.output_dir, "max_steps": args.steps, "learning_rate": args.lr,
               "gradient_accumulation_steps": args.micro_batches, "async_rollouts": args.async_rollouts,
               "lr_scheduler_type": "constant",
               "groups_per_step": args.groups_per_step, "seed": args.seed, "report_to": args.report_to,
               "logging_steps": args.eval_every, "disable_tqdm": False, "max_completion_length": 4,
               "save_strategy": "no"}
    regularisers = [{"type": "entropy", "coef": args.entropy_coef,
                **({"final": args.entropy_final, "anneal_start": args.warmup_steps} if args.entropy_final is not None
                   else {})}] if args.entropy_coef or args.entropy_final is not None else []
    if args.magnet_coef:
        regularisers.append({"type": "magnet", "coef": args.magnet_coef, "start": args.warmup_steps,
                        "every": args.magnet_every})
    phases = warmup_then_rl(args.warmup_steps, ["leduc_poker_warmup"], rl_envs, args.warmup_lr,
                            fresh_optimizer=args.fresh_optimizer)
    return {"algo": {"type": args.algo}, "model": {"name": args.model, "lora": lora_config(args.lora)}, "env": envs, "phase": phases,
            "policies": policies,
            "regulariser": regularisers, "trainer": trainer}


def plot(points: list[dict], path: str) -> None:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 4), dpi=110)
    FigureCanvasAgg(fig)
    ax = fig.subplots()
    ax.plot([p["step"] for p in points], [p["exploitability"] for p in points], marker="o", ms=3, label="current")
    avg = [(p["step"], p["avg_exploitability"]) for p in points if p["avg_exploitability"] is not None]
    if avg:
        ax.plot(*zip(*avg), marker="s", ms=3, label="average (reach-weighted)")
    ax.axhline(2.374, ls="--", color="gray", lw=1, label="uniform random (2.37)")
    ax.axhline(0.0, ls="--", color="black", lw=1, label="Nash (0)")
    ax.set_xlabel("step")
    ax.set_ylabel("exploitability (NashConv / 2)")
    ax.set_title("Leduc poker")
    ax.legend(fontsize=8)
    fig.savefig(path, bbox_inches="tight")


def parse(argv=None) -> argparse.Namespace:
    """The recipe's flags (``parse([])``: the defaults)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--model", default="tiny", help="the policy: 'tiny', 'smollm2-135m', a Hub id or a folder")
    p.add_argument("--algo", default="rae", help="the RL algorithm of self-play (rae, grpo, ...)")
    p.add_argument("--steps", type=int, default=400, help="training steps, warm-up included")
    p.add_argument("--warmup-steps", type=int, default=100, help="sft steps imitating a random mixed strategy (0: none)")
    p.add_argument("--group-size", type=int, default=8, help="episodes per deal")
    p.add_argument("--groups-per-step", type=int, default=16, help="deals per step")
    p.add_argument("--lr", type=float, default=3e-4, help="learning rate of self-play")
    p.add_argument("--warmup-lr", type=float, default=3e-3, help="learning rate of the warm-up")
    p.add_argument("--entropy-coef", type=float, default=0.3, help="entropy bonus on the RL tokens (0: none)")
    p.add_argument("--entropy-final", type=float, help="anneal the bonus to this value by the last step")
    p.add_argument("--fresh-optimizer", action="store_true",
                   help="start self-play with a fresh Adam instead of the warm-up's (the Kuhn recipe's default; on "
                        "Leduc neutral to worse in one comparison: docs/leduc_poker.md)")
    p.add_argument("--magnet-coef", type=float, default=0.0,
                   help="R-NaD-style pull (the magnet regulariser, as in the Kuhn recipe): KL toward the uniform policy "
                        "for --magnet-every steps after the warm-up, then toward a frozen copy of the policy renewed "
                        "every --magnet-every steps (0: off; with it, --entropy-coef 0 leaves the magnet alone)")
    p.add_argument("--magnet-every", type=int, default=200, help="steps between magnet renewals")
    p.add_argument("--opponents", choices=("self", "pool", "average"), default="self",
                   help="self: the policy plays both seats (default); pool: each seat against a frozen past snapshot "
                        "of itself drawn per deal from its opponent pool; average: against the exact reach-weighted "
                        "average of its evaluated policies (tabular fictitious play)")
    p.add_argument("--pool-rule", choices=("uniform", "latest", "pfsp"), default="uniform",
                   help="with --opponents pool: how a snapshot is drawn (uniform: fictitious self-play)")
    p.add_argument("--snapshot-every", type=int, default=20, help="with --opponents pool: steps between snapshots")
    p.add_argument("--pool-size", type=int, default=100, help="with --opponents pool: most snapshots kept")
    p.add_argument("--eval-every", type=int, default=20, help="steps between exact evaluations (and log lines)")
    p.add_argument("--seed", type=int, default=0, help="seeds the run and the warm-up strategy")
    p.add_argument("--output-dir", default="outputs/leduc_poker", help="where everything is written")
    p.add_argument("--report-to", nargs="*", default=[], help="trackers, e.g. wandb or trackio")
    add_hub_flags(p)
    add_lora_flag(p)
    add_micro_batches_flag(p)
    return p.parse_args(argv)


def main(argv=None) -> dict:
    args = parse(argv)

    evaluation = LeducEvaluation(args.eval_every, start_step=args.warmup_steps)
    AVERAGE_OPPONENT.evaluation = evaluation
    trainer = MixedAlgorithmTrainer(experiment(args), callbacks=[evaluation])
    evaluation.trainer = trainer
    interrupted = train(trainer)
    points = evaluation.points
    summary = {
        "command": "python recipes/leduc_poker.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "steps": trainer.state.global_step, "interrupted": interrupted is not None,
        "episodes": trainer.rollout.episodes_played,
        "final_exploitability": points[-1]["exploitability"] if points else None,
        "final_avg_exploitability": points[-1]["avg_exploitability"] if points else None,
        "best_avg_exploitability": min((p["avg_exploitability"] for p in points
                                        if p["avg_exploitability"] is not None), default=None),
        "curve": points,
    }
    finish(trainer, summary, lambda path: plot(points, path), "exploitability.png", interrupted, hidden=("curve",),
           push_to_hub=args.push_to_hub, public=args.public)
    return summary


if __name__ == "__main__":
    main()
