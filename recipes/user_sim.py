"""Simulated users with hidden goals: a tiny assistant learns to ask, then book what the user wanted.

    python recipes/user_sim.py          # tiny model, CPU (docs/user_sim_results.md)
    python recipes/user_sim.py --model smollm2-135m --lora 16 --free-text --user model   # a real chat model

The user is scripted (``UserSimEnv``'s default: four personas, terse, chatty, confused, adversarial, each with a
hidden booking goal); the assistant is the policy, and each of its replies is a choice from a menu (the three
questions, and a booking for every combination of values the user has mentioned; the legal-action harness).
Phase 1 (``--warmup-steps``) imitates, with ``sft``, a hasty scripted assistant that mostly books at once with
the first values it heard (``hasty_assistant``: it teaches the format and succeeds about 10% of the time, since
users rarely give everything, and give it right, in their first message); phase 2 trains the assistant with GRPO
on the success check of its booking. Measured: greedy success per persona on held-out scenarios (goals never used in training) at the end
of the warm-up and every ``--eval-every`` steps. Outputs in ``--output-dir``: ``summary.json``,
``user_sim.png``, the episodes, the final model.

With ``--free-text`` the assistant writes its replies (its last ``BOOK`` line is the booking); with ``--user model``
the user is the base model itself, frozen, playing the persona and hidden goal from its system prompt, and
``summary.json`` reports how it kept to its part (``user_conduct``: ``leaked_goal``, ``broke_character``). The warm-up
always talks to the scripted user: imitating the teacher's format needs no model-played partner.
"""

from __future__ import annotations

import argparse
import os
import sys

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from multiagent_rl.config import ExperimentConfig  # noqa: E402
from multiagent_rl.training.phases import warmup_then_rl  # noqa: E402
from multiagent_rl.envs.user_sim.evaluation import UserSimEvaluation, plot_user_sim  # noqa: E402
from multiagent_rl.training.run import (HelpFormatter, add_hub_flags, add_lora_flag,  # noqa: E402
                                        add_micro_batches_flag, finish, lora_config, train)
from multiagent_rl.training.trainer import MixedAlgorithmTrainer  # noqa: E402

ENV = "multiagent_rl.envs.user_sim"


def experiment(args) -> ExperimentConfig:
    game = {"menu": not args.free_text, "max_turns": args.max_turns, "partial_credit": args.partial_credit}
    separate = args.learners == "separate"  # assistant and user: two learners, each trained on its own seat
    if separate and args.user != "trained":
        raise SystemExit("--learners separate: the user must learn too (--user trained)")
    bind = (lambda role: {"policy": role}) if separate else (lambda role: {})
    roles = {"assistant": bind("assistant")}
    if args.user == "model":  # the base model itself, frozen, reading its persona and hidden goal from its prompt
        roles["user"] = {"model": args.model, "trainable": False,
                         "sampling": {"temperature": args.user_temperature, "max_new_tokens": 64}}
    elif args.user == "trained":  # the policy (or its own learner) plays the user and learns from the user's reward
        roles["user"] = {"model": "policy", "trainable": True, "sampling": {"max_new_tokens": 64}, **bind("user")}
    envs = [{"id": "user_sim", "args": {**game, "user_reward": args.user == "trained"}, "group_size": args.group_size,
             "roles": roles}]  # labelled by its id
    if args.warmup_steps:
        teacher = {"model": "scripted", "policy": f"{ENV}:hasty_assistant", "policy_args": {"patience": args.patience},
                   "algo": {"type": "sft"}, **({"learner": "assistant"} if separate else {})}
        # the scripted user: imitating the teacher's format needs no model-played partner (and costs no sampling)
        envs.insert(0, {"id": "user_sim", "name": "user_sim_warmup", "args": game, "group_size": args.group_size,
                        "roles": {"assistant": teacher}})
    # separate learners: two LoRA adapters on one base with --lora, else two full models (the assistant first: the
    # held-out evaluation reads the first policy)
    learners = {role: {} if args.lora else {"model": args.model} for role in ("assistant", "user")}
    return ExperimentConfig.model_validate({
        "model": {"name": args.model, "lora": lora_config(args.lora)},
        "policies": learners if separate else {},
        "algo": {"type": "grpo"},
        "env": envs,
        "phase": warmup_then_rl(args.warmup_steps, ["user_sim_warmup"], ["user_sim"], args.warmup_lr),
        "trainer": {
            "output_dir": args.output_dir, "max_steps": args.steps, "learning_rate": args.lr,
            "gradient_accumulation_steps": args.micro_batches, "async_rollouts": args.async_rollouts,
            "lr_scheduler_type": "constant", "groups_per_step": args.groups_per_step, "seed": args.seed,
            "report_to": args.report_to, "logging_steps": args.log_every, "disable_tqdm": False,
            "max_completion_length": args.reply_tokens, "save_strategy": "no", "temperature": args.temperature,
        },
    })


def user_conduct_summary(log_history: list[dict]) -> dict:
    """A model-played user's conduct over the run: the mean per logged step of ``leaked_goal`` and
    ``broke_character`` (the share of conversations where it quoted its hidden goal / stepped out of its part)."""
    out = {}
    for key in ("leaked_goal", "broke_character"):
        values = [v for h in log_history for k, v in h.items() if k.split("/")[1:2] == ["user"] and k.endswith(key)]
        out[key] = round(sum(values) / len(values), 4) if values else None
    return out


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--model", default="tiny", help="the policy: 'tiny', 'smollm2-135m', a Hub id or a folder")
    p.add_argument("--steps", type=int, default=300, help="training steps, warm-up included")
    p.add_argument("--warmup-steps", type=int, default=60, help="sft steps imitating the hasty assistant (0: none)")
    p.add_argument("--patience", type=float, default=0.3, help="the warm-up teacher's chance to ask instead of book")
    p.add_argument("--max-turns", type=int, default=6, help="assistant turns per conversation")
    p.add_argument("--free-text", action="store_true",
                   help="the assistant replies in free text (its last BOOK line is parsed) instead of from the menu")
    p.add_argument("--user", choices=("scripted", "model", "trained"), default="scripted",
                   help="who plays the user in training: the scripted user; --model itself, frozen, from each "
                        "persona's prompt; or trained: the policy plays it too and learns from the user's reward "
                        "(in character + goal met). Held-out evaluation always uses the scripted user")
    p.add_argument("--learners", choices=("shared", "separate"), default="shared",
                   help="with --user trained: one policy plays both seats (shared), or the assistant and the user are "
                        "two learners, each trained on its own seat (separate: two LoRA adapters with --lora, else "
                        "two full models)")
    p.add_argument("--temperature", type=float, default=None,
                   help="sampling temperature of the assistant (trained at it). Default 1; 0.7 with --free-text, "
                        "where a small chat model's replies at 1 drift off topic")
    p.add_argument("--user-temperature", type=float, default=0.7, help="sampling temperature of a model-played user")
    p.add_argument("--reply-tokens", type=int, default=24, help="most tokens of one assistant reply")
    p.add_argument("--partial-credit", type=float, default=0.0,
                   help="reward share for the slots a not-quite-right booking gets right (0: success only)")
    p.add_argument("--eval-at-start", action="store_true", help="also evaluate the untrained model (step 0)")
    p.add_argument("--group-size", type=int, default=8, help="conversations per scenario")
    p.add_argument("--groups-per-step", type=int, default=4, help="scenarios per step")
    p.add_argument("--lr", type=float, default=1e-3, help="learning rate of the RL phase")
    p.add_argument("--warmup-lr", type=float, default=3e-3, help="learning rate of the warm-up")
    p.add_argument("--eval-every", type=int, default=30, help="steps between held-out evaluations")
    p.add_argument("--per-persona", type=int, default=16, help="held-out scenarios per persona")
    p.add_argument("--log-every", type=int, default=5, help="steps between log lines")
    p.add_argument("--seed", type=int, default=0, help="seeds the run and the warm-up teacher")
    p.add_argument("--output-dir", default="outputs/user_sim", help="where everything is written")
    p.add_argument("--report-to", nargs="*", default=[], help="trackers, e.g. wandb or trackio")
    add_hub_flags(p)
    add_lora_flag(p)
    add_micro_batches_flag(p)
    args = p.parse_args(argv)
    if args.temperature is None:
        args.temperature = 0.7 if args.free_text else 1.0

    evaluation = UserSimEvaluation(args.eval_every, args.warmup_steps, per_persona=args.per_persona,
                                   max_turns=args.max_turns, menu=not args.free_text, reply_tokens=args.reply_tokens,
                                   at_start=args.eval_at_start)
    trainer = MixedAlgorithmTrainer(experiment(args), callbacks=[evaluation])
    evaluation.trainer = trainer
    interrupted = train(trainer)
    points = evaluation.points
    warm = next((pt for pt in points if pt["step"] == args.warmup_steps), None)
    summary = {
        "command": "python recipes/user_sim.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "steps": trainer.state.global_step, "interrupted": interrupted is not None,
        "held_out_after_warmup": warm, "held_out_last": points[-1] if points else None,
        "gain_points": ({k: round(100 * (points[-1][k] - warm[k]), 1) for k in warm if k != "step"}
                        if warm and points else None),
        "held_out_before": points[0] if args.eval_at_start and points else None,
        "user_conduct": user_conduct_summary(trainer.state.log_history) if args.user != "scripted" else None,
        "held_out": points,
    }
    title = f"assistant, seed {args.seed}"
    finish(trainer, summary, lambda path: plot_user_sim(points, args.warmup_steps, path, title), "user_sim.png",
           interrupted, push_to_hub=args.push_to_hub, public=args.public)
    return summary


if __name__ == "__main__":
    main()
