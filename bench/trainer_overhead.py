"""Trainer overhead: one optimizer step of MixedAlgorithmTrainer vs TRL's GRPOTrainer on the same batch shapes.

Times ``training_step`` (the loss's forward, ``_compute_loss``, backward) plus the optimizer step on a
prepared batch, with rollouts out of the picture, for three cases on the same model weights:

- ``trl grpo``:            TRL's ``GRPOTrainer`` (DAPO loss, beta 0) on an all-GRPO batch;
- ``mixed all-grpo``:      ``MixedAlgorithmTrainer`` on the same batch (every sample tagged ``grpo``);
- ``mixed grpo+echo+sft``: ``MixedAlgorithmTrainer`` on a batch of the same shape and token count where a
                           third of the rows are GRPO, a third ECHO (actions and observations: rl + ce)
                           and a third SFT (ce only), so all three streams are live.

The cases are interleaved rep by rep (so load on a shared machine hits all alike) and the median
over ``--reps`` steps after ``--warmup`` steps is reported.

    MULTIAGENT_RL_CACHE=/tmp/mrlcache HF_HUB_OFFLINE=1 python bench/trainer_overhead.py
"""

from __future__ import annotations

import argparse
import copy
import os
import random
import shlex
import statistics
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from multiagent_rl.algorithms import build_algorithm  # noqa: E402
from multiagent_rl.envs.base import SingleAgentEnv  # noqa: E402
from multiagent_rl.episodes.episode import Episode  # noqa: E402
from multiagent_rl.models import load_model_and_tokenizer  # noqa: E402
from multiagent_rl.tasks.task import Task, TaskData  # noqa: E402
from multiagent_rl.episodes.trace import Segment, Trace  # noqa: E402
from multiagent_rl.training.trainer import MixedAlgorithmConfig, MixedAlgorithmTrainer  # noqa: E402


def _trace(rng: random.Random, vocab: int, segments: list[tuple[str, int]], reward: float) -> Trace:
    t = Trace(role="agent", trainable=True, model="policy", segments=[
        Segment(kind, [rng.randrange(3, vocab) for _ in range(n)], [-1.0] * n if kind == "action" else None)
        for kind, n in segments
    ])
    t.add_reward("r", reward)
    return t


def episodes(kind: str, rows: int, prompt_len: int, completion_len: int, vocab: int, seed: int) -> list[Episode]:
    """``rows`` one-trace episodes with the same prompt and completion lengths, scored by their algorithm.

    ``grpo``: all rows GRPO (completion = one action). ``mixed``: rows cycle GRPO / ECHO / SFT; ECHO
    completions alternate action and observation quarters, SFT completions are one (teacher) action.
    """
    rng = random.Random(seed)
    out: list[Episode] = []
    quarter = completion_len // 4
    echo_segments = [("action", quarter), ("observation", quarter), ("action", quarter),
                     ("observation", completion_len - 3 * quarter)]
    for i in range(rows):
        algo = "grpo" if kind == "grpo" else ("grpo", "echo", "sft")[i % 3]
        segments = [("prompt", prompt_len)] + (echo_segments if algo == "echo" else [("action", completion_len)])
        env = {"grpo": "a", "echo": "b", "sft": "c"}[algo]
        trace = _trace(rng, vocab, segments, reward=float(i % 4))  # 4 distinct rewards per group: A != 0
        out.append(Episode(id=f"{kind}{i}", task=Task(TaskData()), group=f"{algo}-{i // 12}", env=env,
                           traces=[trace]))
    for algo in ("grpo", "echo", "sft"):
        groups: dict[str, list[Episode]] = {}
        for ep in out:
            if ep.group.startswith(algo):
                groups.setdefault(ep.group, []).append(ep)
        for group in groups.values():
            build_algorithm({"type": algo}).score_group(group)
    return out


def mixed_trainer(model, tok, out_dir: str) -> MixedAlgorithmTrainer:
    def env(name):
        return SingleAgentEnv([{"prompt": "x"}], reward=lambda task, trace: 0.0, name=name)

    scripted = {"model": "scripted", "policy": lambda turn: "ok"}
    experiment = {
        "env": [
            {"id": "a", "instance": env("a"), "algo": {"type": "grpo"}},
            {"id": "b", "instance": env("b"), "algo": {"type": "echo"}},
            {"id": "c", "instance": env("c"), "algo": {"type": "sft"}, "roles": {"agent": scripted}},
        ],
    }
    args = MixedAlgorithmConfig(output_dir=out_dir, report_to=[], save_strategy="no", save_episodes=False,
                                disable_tqdm=True, logging_steps=1, learning_rate=1e-5, max_steps=1)
    return MixedAlgorithmTrainer(experiment, args=args, model=model, processing_class=tok)


def trl_trainer(model, tok, out_dir: str) -> GRPOTrainer:
    def unused(completions, **kwargs):
        return [0.0] * len(completions)

    cpu = not torch.cuda.is_available()
    args = GRPOConfig(output_dir=out_dir, use_cpu=cpu, bf16=not cpu, gradient_checkpointing=False, beta=0.0,
                      loss_type="dapo", scale_rewards="none", per_device_train_batch_size=2, num_generations=2,
                      report_to=[], save_strategy="no", disable_tqdm=True, logging_steps=1, learning_rate=1e-5)
    return GRPOTrainer(model=model, reward_funcs=unused, args=args, processing_class=tok,
                       train_dataset=Dataset.from_dict({"prompt": ["x"] * 8}))


def make_step(trainer, batch):
    """One optimizer step on a prepared batch: training_step (loss + backward) and optimizer.step."""
    trainer._prepare_inputs = lambda inputs: inputs  # no rollout: the batch is already there
    trainer.current_gradient_accumulation_steps = 1
    trainer.create_optimizer()
    model = trainer.model

    def step():
        trainer.training_step(model, batch, None)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)
        if torch.cuda.is_available():
            torch.cuda.synchronize()

    return step


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=24, help="samples in the batch (one micro-batch)")
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--completion-len", type=int, default=96)
    parser.add_argument("--reps", type=int, default=30, help="timed steps per case (median reported)")
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)

    base, tok = load_model_and_tokenizer("tiny")
    vocab = len(tok)
    tmp = tempfile.mkdtemp(prefix="trainer_overhead-")
    mixed = mixed_trainer(copy.deepcopy(base), tok, os.path.join(tmp, "mixed"))
    trl = trl_trainer(copy.deepcopy(base), tok, os.path.join(tmp, "trl"))

    batches = {}
    for kind in ("grpo", "mixed"):
        prepared = episodes(kind, args.rows, args.prompt_len, args.completion_len, vocab, args.seed)

        async def play(step, prepared=prepared):  # no rollout: the rollout engine hands over the prepared episodes
            return copy.deepcopy(prepared)

        mixed.rollout.aplay = play
        batches[kind] = mixed._generate_and_score_completions(None)
    g, m = batches["grpo"], batches["mixed"]
    assert g["completion_ids"].shape == m["completion_ids"].shape and g["prompt_ids"].shape == m["prompt_ids"].shape
    assert set(g["algorithm"]) == {"grpo"} and set(m["algorithm"]) == {"grpo", "echo", "sft"}
    assert g["completion_mask"].sum() == m["completion_mask"].sum()
    trl_batch = {k: g[k] for k in ("prompt_ids", "prompt_mask", "completion_ids", "completion_mask")}
    trl_batch["advantages"] = g["advantages"][:, 0].clone()
    trl_batch["num_items_in_batch"] = g["completion_mask"].sum()

    steps = {
        "trl grpo": make_step(trl, trl_batch),
        "mixed all-grpo": make_step(mixed, g),
        "mixed grpo+echo+sft": make_step(mixed, m),
    }
    times: dict[str, list[float]] = {name: [] for name in steps}
    for rep in range(args.warmup + args.reps):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            if rep >= args.warmup:
                times[name].append(time.perf_counter() - start)

    medians = {name: statistics.median(t) for name, t in times.items()}
    tokens = {
        "trl grpo": (int(trl_batch["num_items_in_batch"]), 0),
        "mixed all-grpo": (int(g["num_rl_tokens"]), int(g["num_ce_tokens"])),
        "mixed grpo+echo+sft": (int(m["num_rl_tokens"]), int(m["num_ce_tokens"])),
    }
    device = next(base.parameters()).device
    print(f"trainer overhead: tiny model on {device} ({torch.get_num_threads()} torch threads), batch "
          f"{args.rows} x ({args.prompt_len} prompt + {args.completion_len} completion) tokens, "
          f"median of {args.reps} steps after {args.warmup} warm-up")
    print(f"{'case':<22}{'median ms':>11}{'p25 ms':>9}{'p75 ms':>9}{'rl tokens':>11}{'ce tokens':>11}")
    for name, t in times.items():
        q = statistics.quantiles(t, n=4)
        print(f"{name:<22}{medians[name] * 1e3:>11.2f}{q[0] * 1e3:>9.2f}{q[2] * 1e3:>9.2f}"
              f"{tokens[name][0]:>11}{tokens[name][1]:>11}")
    vs_trl = medians["mixed all-grpo"] / medians["trl grpo"]
    mix_vs_grpo = medians["mixed grpo+echo+sft"] / medians["mixed all-grpo"]
    print(f"mixed all-grpo / trl grpo:            {vs_trl:.3f}x  (target <= 1.10)")
    print(f"mixed grpo+echo+sft / mixed all-grpo: {mix_vs_grpo:.3f}x  (target <= 1.15)")
    print("reproduce: " + " ".join(["MULTIAGENT_RL_CACHE=/tmp/mrlcache HF_HUB_OFFLINE=1 python",
                                    "bench/trainer_overhead.py", *map(shlex.quote, sys.argv[1:])]))
    return {"medians": medians, "vs_trl": vs_trl, "mixed_vs_grpo": mix_vs_grpo}


if __name__ == "__main__":
    main()
