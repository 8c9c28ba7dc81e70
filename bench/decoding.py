"""The transformers backend's decoding, with and without prompt reuse and continuous batching, on the same episodes.

Two workloads, each played in four ways on the same model, seeds and tasks:

- ``kuhn``: rollouts of the Kuhn recipe's step (the tiny model, the legal-action harness, 16 deals × 8 episodes: one
  token per decision, at most two decisions per seat);
- ``chat``: SmolLM2-135M-Instruct in both seats of the simulated-user env in free text (the assistant and a
  model-played user, each conversation up to ``--turns`` assistant turns of up to 48 tokens, the user's up to 96):
  every turn's prompt is the whole conversation so far.

The four ways: ``before`` (each event-loop tick's requests decoded to the end together, every prompt encoded whole:
the backend as it was), ``prefix cache`` (earlier turns' keys and values reused), ``continuous`` (requests join a
running decode), and ``both`` (the default). Seconds per rollout (median of ``--repeats``), the speed-up over
``before``, and the prompt tokens encoded vs read from the cache.

    python bench/decoding.py                       # both workloads
    python bench/decoding.py --workloads kuhn --repeats 5

Prints a table and one ``RESULT {json}`` line. Wall time on this machine: run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402

from multiagent_rl import Agent, AgentConfig, TransformersBackend, play_episodes, run_sync  # noqa: E402
from multiagent_rl.models import load_model_and_tokenizer  # noqa: E402

MODES = {"before": (False, 0), "prefix cache": (False, 1024), "continuous": (True, 0), "both": (True, 1024)}
"""(continuous batching, prefix cache MB) of each way of decoding."""


def backend_for(model, tok, mode: str) -> TransformersBackend:
    continuous, cache_mb = MODES[mode]
    backend = TransformersBackend(model, tok, prefix_cache_mb=cache_mb)
    backend.continuous_batching = continuous
    return backend


def kuhn_rollout(model, tok, mode: str, seed: int) -> TransformersBackend:
    from multiagent_rl.envs.kuhn_poker import KuhnPokerEnv

    env = KuhnPokerEnv(legal_choices=True)
    backend = backend_for(model, tok, mode)
    agent = Agent(AgentConfig(model="policy", sampling={"temperature": 1.0, "max_new_tokens": 1}), backend)
    tasks = env.sample_tasks(16, random.Random(seed))
    torch.manual_seed(seed)
    run_sync(play_episodes(env, tasks, {"player_0": agent, "player_1": agent}, group_size=8, seed=str(seed)))
    return backend


def chat_rollout(model, tok, mode: str, seed: int, turns: int, user_model) -> TransformersBackend:
    from multiagent_rl.envs.user_sim import UserSimEnv

    env = UserSimEnv(max_turns=turns)
    backend = backend_for(model, tok, mode)
    user_backend = backend_for(user_model, tok, mode)
    assistant = Agent(AgentConfig(model="policy", sampling={"temperature": 0.7, "max_new_tokens": 48}), backend)
    user = Agent(AgentConfig(model="policy", sampling={"temperature": 0.7, "max_new_tokens": 96}), user_backend)
    tasks = env.sample_tasks(8, random.Random(seed))
    torch.manual_seed(seed)
    run_sync(play_episodes(env, tasks, {"user": user, "assistant": assistant}, seed=str(seed)))
    backend.partner = user_backend
    return backend


def measure(name: str, play, repeats: int) -> dict:
    rows = {}
    for mode in MODES:
        seconds, tokens = [], None
        for r in range(repeats):
            start = time.perf_counter()
            backend = play(mode, r)
            seconds.append(time.perf_counter() - start)
            backends = [backend] + ([backend.partner] if hasattr(backend, "partner") else [])
            caches = [b.prefix_cache for b in backends if b.prefix_cache is not None]
            tokens = {"encoded": sum(c.encoded_tokens for c in caches), "reused": sum(c.reused_tokens for c in caches)}
        rows[mode] = {"seconds": statistics.median(seconds), **(tokens if tokens["encoded"] else {})}
    base = rows["before"]["seconds"]
    for row in rows.values():
        row["speed-up"] = round(base / row["seconds"], 2)
    print(f"\n{name}")
    print(f"| way | s per rollout | speed-up over before | prompt tokens encoded / read from the cache |")
    print("|---|---|---|---|")
    for mode, row in rows.items():
        cached = f"{row['encoded']:,} / {row['reused']:,}" if "encoded" in row else "-"
        print(f"| {mode} | {row['seconds']:.2f} | {row['speed-up']}x | {cached} |")
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workloads", nargs="+", default=["kuhn", "chat"], choices=["kuhn", "chat"])
    p.add_argument("--repeats", type=int, default=3, help="rollouts per way (the median is reported)")
    p.add_argument("--turns", type=int, default=4, help="chat: assistant turns per conversation")
    args = p.parse_args()
    result = {}
    if "kuhn" in args.workloads:
        model, tok = load_model_and_tokenizer("tiny")
        model.eval()
        kuhn_rollout(model, tok, "both", 99)  # allocator and import warm-up, not timed
        result["kuhn"] = measure("kuhn: one rollout of the Kuhn recipe's step (tiny model, 128 episodes)",
                                 lambda mode, r: kuhn_rollout(model, tok, mode, r), args.repeats)
    if "chat" in args.workloads:
        model, tok = load_model_and_tokenizer("smollm2-135m")
        user_model, _ = load_model_and_tokenizer("smollm2-135m")
        model.eval()
        user_model.eval()
        result["chat"] = measure(f"chat: 8 simulated-user conversations, SmolLM2-135M-Instruct in both seats, up to "
                                 f"{args.turns} assistant turns",
                                 lambda mode, r: chat_rollout(model, tok, mode, r, args.turns, user_model),
                                 args.repeats)
    print("RESULT " + json.dumps(result))


if __name__ == "__main__":
    main()
