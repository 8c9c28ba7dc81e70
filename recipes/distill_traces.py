"""Rejection-sampling fine-tuning: distil a run's best traces into a fresh model with TRL's SFTTrainer.

    python recipes/user_sim.py --output-dir outputs/user_sim          # a run to distil (any run with traces)
    python recipes/distill_traces.py --traces outputs/user_sim/traces --steps 150 300

    python recipes/kuhn_poker.py --output-dir outputs/kuhn_poker     # or a Kuhn poker self-play run
    python recipes/distill_traces.py --eval kuhn_poker --traces outputs/kuhn_poker/traces --env kuhn_poker \
        --steps 1400 1600

Takes runs' traces (``--traces``, repeated for several runs: a run's ``traces/`` or, for ``episode_format =
"jsonl"`` runs, ``episodes/``, a folder of shards or one shard), keeps those the trained policy played
(``--played-by``: a warm-up's scripted teacher is not the policy) that match ``--env`` (an env id or label),
``--role`` and ``--steps``, keeps the best ones (``--min-reward``), turns every assistant reply into a
prompt–completion pair (the loss is on the reply only) and fine-tunes a fresh copy of the base model with
``trl.SFTTrainer``. For comparison it also fine-tunes, on as many examples, a copy on traces drawn without the reward
filter. All three (base, SFT on any traces, SFT on the best) are evaluated by ``--eval``:

- ``user_sim`` (default): greedy success per persona on held-out scenarios against the scripted user; the
  assistant's traces, best = success (reward ≥ 1).
- ``proposer_solver``: the solver's greedy accuracy per difficulty level on the fixed held-out problems (asked
  with ``--prompts``); the solvers' traces, best = right answers (reward ≥ 1).
- ``kuhn_poker``: the exact exploitability of the distilled policy (read at all 12 information states as the
  legal-action harness plays it) and its expected chips against the Nash policy; both seats' traces, best = hands
  that won chips (reward ≥ 1).

Writes ``summary.json`` and the two fine-tuned models (``sft_any/``, ``sft_best/``, each loadable with
``from_pretrained``) to ``--output-dir``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
from pathlib import Path

os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

from multiagent_rl.models import load_model_and_tokenizer  # noqa: E402
from multiagent_rl.data.traces import filter_traces, load_traces, to_sft_prompt_completion  # noqa: E402
from multiagent_rl.training.run import HelpFormatter  # noqa: E402


def fine_tune(rows, args, name: str):
    """A fresh base model fine-tuned on ``rows`` (prompt–completion) with TRL's SFTTrainer, saved with its tokenizer
    in ``--output-dir/name``."""
    import torch
    from trl import SFTConfig, SFTTrainer

    model, tokenizer = load_model_and_tokenizer(args.model)
    cpu = not torch.cuda.is_available()
    config = SFTConfig(
        output_dir=str(Path(args.output_dir) / name), num_train_epochs=args.epochs, learning_rate=args.lr,
        per_device_train_batch_size=args.batch_size, lr_scheduler_type="constant", logging_steps=20,
        save_strategy="no", report_to=[], seed=args.seed, max_length=None,
        use_cpu=cpu, bf16=not cpu, activation_checkpointing=False,  # TRL's defaults are GPU ones
    )
    trainer = SFTTrainer(model=model, args=config, train_dataset=rows, processing_class=tokenizer)
    trainer.train()
    trainer.save_model(config.output_dir)  # weights, config and tokenizer: the model the summary scores
    return model, tokenizer


def user_sim_evaluation(args):
    """Greedy success per persona on held-out scenarios (higher is better)."""
    from multiagent_rl.agents.agent import Agent, AgentConfig
    from multiagent_rl.backends import TransformersBackend
    from multiagent_rl.envs.user_sim import UserSimEnv
    from multiagent_rl.envs.user_sim.evaluation import held_out_scenarios, success_by_persona

    env = UserSimEnv(menu=True, split="held_out")
    tasks = held_out_scenarios(env, args.per_persona)
    random.seed(args.seed)  # once, before the base model's evaluation (the fine-tuning runs reseed with args.seed)

    def evaluate(model, tokenizer) -> dict[str, float]:
        greedy = Agent(AgentConfig(model="policy", sampling={"temperature": 0.0, "max_new_tokens": 24}),
                       TransformersBackend(model.eval(), tokenizer))
        return success_by_persona(greedy, env, tasks)

    return evaluate


def kuhn_poker_evaluation(args):
    """Exact exploitability (lower is better) and expected chips against Nash of the policy the harness plays."""
    from multiagent_rl.envs.kuhn_poker.exploitability import evaluation_report
    from multiagent_rl.envs.kuhn_poker.evaluation import read_policy

    def evaluate(model, tokenizer) -> dict[str, float]:
        report = evaluation_report(read_policy(model.eval(), tokenizer, legal_choices=True))
        return {k: report[k] for k in ("exploitability", "chips_vs_nash_p0", "chips_vs_nash_p1")}

    return evaluate


def proposer_solver_evaluation(args):
    """Greedy solve accuracy per difficulty level on the fixed held-out problems, asked with ``--prompts`` (the
    wording the run's solvers were asked with), and its mean over the levels (higher is better)."""
    from multiagent_rl.agents.agent import Agent, AgentConfig
    from multiagent_rl.backends import TransformersBackend
    from multiagent_rl.envs.proposer_solver.evaluation import held_out_problems, solve_accuracy

    problems = held_out_problems(args.topic, per_level=args.per_level)

    def evaluate(model, tokenizer) -> dict[str, float]:
        greedy = Agent(AgentConfig(model="policy", sampling={"temperature": 0.0, "max_new_tokens": 16}),
                       TransformersBackend(model.eval(), tokenizer))
        accuracy = solve_accuracy(greedy, problems, args.prompts)
        return {**{f"level_{level}": value for level, value in accuracy.items()},
                "mean": sum(accuracy.values()) / len(accuracy)}

    return evaluate


EVALUATIONS = {"user_sim": (user_sim_evaluation, "assistant"), "kuhn_poker": (kuhn_poker_evaluation, None),
               "proposer_solver": (proposer_solver_evaluation, "solver")}
"""``--eval`` choices: how a distilled model is scored, and the role whose traces are distilled by default
(None: every role)."""


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter)
    p.add_argument("--traces", required=True, nargs="+", action="extend", metavar="FOLDER",
                   help="a run's traces/ (or episodes/) folder, a folder of shards or a shard file; several: repeat "
                        "the flag or list them")
    p.add_argument("--more-traces", nargs="+", action="extend", dest="traces", help=argparse.SUPPRESS)  # old spelling
    p.add_argument("--eval", choices=sorted(EVALUATIONS), default="user_sim", help="how models are scored")
    p.add_argument("--env", help="an env id (user_sim, kuhn_poker, proposer_solver) or an env entry's label; "
                                 "default: all")
    p.add_argument("--role", help="whose traces (default: the assistant for user_sim, both seats for kuhn_poker, "
                                  "the solver for proposer_solver)")
    p.add_argument("--played-by", default="policy",
                   help="whose traces: 'policy' (the trained model; not a warm-up's scripted teacher), another "
                        "model name of the traces' model column, or 'any'")
    p.add_argument("--min-reward", type=float, default=1.0, help="the best traces: reward at least this")
    p.add_argument("--steps", type=int, nargs=2, metavar=("FIRST", "LAST"), help="inclusive step range (default: all)")
    p.add_argument("--model", default="tiny", help="the base model each fine-tuned copy starts from")
    p.add_argument("--epochs", type=float, default=2.0, help="SFT epochs over each condition's examples")
    p.add_argument("--lr", type=float, default=1e-3, help="SFT learning rate (constant)")
    p.add_argument("--batch-size", type=int, default=32, help="SFT batch size")
    p.add_argument("--max-examples", type=int, default=2000, help="replies per condition (drawn at random)")
    p.add_argument("--per-persona", type=int, default=16, help="with --eval user_sim: held-out scenarios per persona")
    p.add_argument("--prompts", default="short", choices=("short", "instructed"),
                   help="with --eval proposer_solver: the solver prompt wording of the run ('instructed' for "
                        "proposer_solver.py --free-text)")
    p.add_argument("--topic", default="addition", help="with --eval proposer_solver: the held-out problems' kind")
    p.add_argument("--per-level", type=int, default=48, help="with --eval proposer_solver: held-out problems per level")
    p.add_argument("--seed", type=int, default=0, help="seeds the draws and the fine-tuning")
    p.add_argument("--output-dir", default="outputs/distill_traces", help="summary.json, sft_any/, sft_best/")
    args = p.parse_args(argv)

    make_evaluation, default_role = EVALUATIONS[args.eval]
    role = args.role or default_role
    traces = load_traces(args.traces)
    pool = filter_traces(traces, env=args.env, role=role, model=None if args.played_by == "any" else args.played_by,
                         steps=tuple(args.steps) if args.steps else None)
    best = filter_traces(pool, min_reward=args.min_reward)
    if len(best) == 0:
        raise SystemExit(f"no {args.env or 'any env'}/{role or 'any role'} trace played by {args.played_by} reaches "
                         f"reward {args.min_reward}: nothing to distil")
    best_rows = to_sft_prompt_completion(best)
    n = min(len(best_rows), args.max_examples)
    best_rows = best_rows.shuffle(seed=args.seed).select(range(n))
    any_rows = to_sft_prompt_completion(pool).shuffle(seed=args.seed).select(range(n))

    evaluate = make_evaluation(args)
    results = {"base": evaluate(*load_model_and_tokenizer(args.model))}
    for name, rows in (("sft_any", any_rows), ("sft_best", best_rows)):
        results[name] = evaluate(*fine_tune(rows, args, name))
    out = Path(args.output_dir)
    summary = {"eval": args.eval, "traces": len(pool), "best_traces": len(best), "examples_per_condition": n,
               "min_reward": args.min_reward, "results": results,
               "models": {name: str(out / name) for name in ("sft_any", "sft_best")}}
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    keys = list(results["base"])
    print("| model | " + " | ".join(keys) + " |")
    for name, r in results.items():
        print(f"| {name} | " + " | ".join(f"{r[k]:.2f}" for k in keys) + " |")
    return summary


if __name__ == "__main__":
    main()
