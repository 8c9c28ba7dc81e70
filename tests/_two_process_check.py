"""Helper of ``tests/test_trainer.py::test_two_processes_match_one_process`` (not a test module).

Trains ``MixedAlgorithmTrainer`` for two steps on a fixed, hand-built rollout instead of played
episodes, so one process and two processes see exactly the same data:

    torchrun --nproc_per_node 2 tests/_two_process_check.py OUT_DIR    # rank r plays its share
    python tests/_two_process_check.py OUT_DIR                          # one process plays all of it

Each rank writes ``OUT_DIR/rank{r}.json``: the all-reduced per-stream token counts of every
generation round, the algorithms' state (RAE baselines), the logged loss, grad norm and per-algorithm
metrics, and the streams written on its own traces. The data mixes RAE, ECHO (rl + ce) and OPD (ref_kl) over two
environments, and one GRPO/ECHO task group is split across the two ranks, so group credit has to
see the other rank's episodes to come out right.
"""

from __future__ import annotations

import json
import os
import random
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from conftest import feed, make_episode, make_trace  # noqa: E402  (this script's folder is on sys.path)

from multiagent_rl.envs.base import SingleAgentEnv  # noqa: E402
from multiagent_rl.models import load_model_and_tokenizer, resolve_model  # noqa: E402
from multiagent_rl.training.trainer import MixedAlgorithmConfig, MixedAlgorithmTrainer  # noqa: E402

VOCAB_LOW, VOCAB_HIGH = 3, 500  # ordinary tokens of the tiny tokenizer (0-2 are special; 622 in all)


class CountingTrainer(MixedAlgorithmTrainer):
    """Records the all-reduced per-stream token counts of every generation round."""

    rounds: list[dict]

    def _generate_and_score_completions(self, inputs):
        batch = super()._generate_and_score_completions(inputs)
        self.rounds.append({k: batch[k].item() for k in ("num_rl_tokens", "num_ce_tokens", "num_ref_kl_tokens")})
        return batch


def shares(step: int, world: int) -> list[list]:
    """One round's episodes in ``world`` consecutive shares (their concatenation is the same for any world)."""
    rng = random.Random(1000 + step)

    def ids(n):
        return [rng.randrange(VOCAB_LOW, VOCAB_HIGH) for _ in range(n)]

    eps = []
    # Kuhn-shaped group of 4: player_0 (RAE) one decision, player_1 (ECHO) decision, observation, decision.
    for k in range(4):
        p0 = make_trace("player_0", [("prompt", ids(5 + k)), ("action", ids(1 + k % 2))], float(k - 1 + step))
        p1 = make_trace(
            "player_1",
            [("prompt", ids(4)), ("action", ids(2)), ("observation", ids(3 + k)), ("action", ids(1))],
            float((3 * k) % 4 - step),
        )
        eps.append(make_episode(f"s{step}-kuhn-{k}", f"s{step}-kuhn", "kuhn_poker", [p0, p1]))
    # A second Kuhn group whose rewards tie for player_1: ECHO's rl is zero there, its ce is not.
    for k in range(2):
        p0 = make_trace("player_0", [("prompt", ids(6)), ("action", ids(2))], float(2 * k))
        p1 = make_trace(
            "player_1", [("prompt", ids(4)), ("action", ids(1)), ("observation", ids(2)), ("action", ids(2))], 1.0
        )
        eps.append(make_episode(f"s{step}-kuhn2-{k}", f"s{step}-kuhn2", "kuhn_poker", [p0, p1]))
    # OPD group on the single-agent env.
    for k in range(2):
        t = make_trace("agent", [("prompt", ids(3 + k)), ("action", ids(3 + k))], 0.0)
        eps.append(make_episode(f"s{step}-single-{k}", f"s{step}-single", "single", [t]))
    # 8 episodes in one fixed order; with 2 processes rank 0 gets kuhn episodes 0-1 and rank 1 gets 2-3
    # (that group spans the ranks).
    order = eps[:2] + eps[4:6] + eps[2:4] + eps[6:]
    size = len(order) // world
    return [order[r * size : (r + 1) * size] for r in range(world)]


def build(output_dir: str) -> CountingTrainer:
    model, tok = load_model_and_tokenizer("tiny", device="cpu")
    assert len(tok) > VOCAB_HIGH, f"the tiny tokenizer shrank to {len(tok)} tokens: lower VOCAB_HIGH"
    experiment = {
        "algo": {"type": "grpo"},
        "env": [
            {
                "id": "kuhn_poker",
                "roles": {"player_0": {"algo": {"type": "rae"}}, "player_1": {"algo": {"type": "echo", "alpha": 0.5}}},
            },
            {
                "id": "single",
                "instance": SingleAgentEnv([{"prompt": "hi"}], reward=lambda task, trace: 0.0),
                "algo": {"type": "opd", "teacher": resolve_model("tiny")},
            },
        ],
    }
    # the magnet makes the loss read the logits itself (PolicyScorer.logits), under DDP here
    experiment["regulariser"] = [{"type": "magnet", "coef": 0.1}]
    args = MixedAlgorithmConfig(
        output_dir=output_dir, report_to=[], save_strategy="no", save_episodes=False, max_steps=2,
        learning_rate=1e-3, logging_steps=1, disable_tqdm=True, seed=0,
    )
    trainer = CountingTrainer(experiment, args=args, model=model, processing_class=tok)
    trainer.rounds = []
    world, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
    return feed(trainer, lambda step: shares(step, world)[rank])


def run(out_dir: str) -> dict:
    os.makedirs(out_dir, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = build(tmp)
        trainer.train()
    rank = trainer.accelerator.process_index
    streams = {}
    for ep in trainer.rollout.last_episodes:
        for i, t in enumerate(ep.traces):
            if t.streams is not None:
                streams[f"{ep.id}/{t.role}/{i}"] = {
                    name: sum(getattr(t.streams, field) or [])
                    for name, field in (("rl", "advantages"), ("ce", "ce_weights"), ("ref_kl", "ref_kl_weights"))
                }
    result = {
        "world": trainer.accelerator.num_processes,
        "rank": rank,
        "rounds": trainer.rounds,
        "state": trainer.rollout.algorithm_state(),
        "logs": [
            {k: v for k, v in h.items() if k in ("loss", "grad_norm", "entropy") or k.startswith(("loss/", "ref_kl/", "magnet/"))}
            for h in trainer.state.log_history
            if "loss" in h
        ],
        "streams": streams,
        "model_class": type(trainer.model_wrapped).__name__,  # what the loss was given
        "full_logits_models": sorted(t.__name__ for t in trainer.scorer.full_logits_models),
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    trainer.accelerator.end_training()  # tear the process group down: left to exit, gloo can abort a finished rank
    return result


if __name__ == "__main__":
    torch.set_num_threads(1)
    run(sys.argv[1])
