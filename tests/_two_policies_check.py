"""Helper of ``tests/test_policies.py::test_two_policies_on_two_processes_match_one_process`` (not a test module).

Two LoRA policies (``alice`` plays player_0, ``bob`` player_1) — or, with ``--full-models``, two full models — trained
for two steps on a fixed, hand-built rollout, so one process and two processes see the same data:

    torchrun --nproc_per_node 2 tests/_two_policies_check.py OUT_DIR [--full-models]  # rank r trains on its share
    python tests/_two_policies_check.py OUT_DIR [--full-models]                        # one process trains on all

Each rank writes ``OUT_DIR/rank{r}.pt``: both policies' final weights (adapters or models), the logged losses and the
model class the trainer wrapped.
"""

from __future__ import annotations

import copy
import os
import random
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from conftest import feed, make_episode, make_trace  # noqa: E402  (this script's folder is on sys.path)

from multiagent_rl.models import load_model_and_tokenizer  # noqa: E402
from multiagent_rl.models.adapters import adapter_state  # noqa: E402
from multiagent_rl.training.trainer import MixedAlgorithmConfig, MixedAlgorithmTrainer  # noqa: E402

LORA = {"r": 4, "lora_alpha": 8, "target_modules": "all-linear", "init_lora_weights": False}


def shares(step: int, world: int) -> list[list]:
    """One round: two Kuhn-shaped groups of 4 episodes (whole groups per share; their concatenation is fixed)."""
    rng = random.Random(2000 + step)
    eps = []
    for g in range(2):
        for k in range(4):
            p0 = make_trace("player_0", [("prompt", [rng.randrange(3, 500) for _ in range(5 + k)]),
                                         ("action", [rng.randrange(3, 500)])], float(k - 1.5 + step))
            p1 = make_trace("player_1", [("prompt", [rng.randrange(3, 500) for _ in range(4)]),
                                         ("action", [rng.randrange(3, 500) for _ in range(2)])], float((3 * k) % 4))
            p0.policy, p1.policy = "alice", "bob"
            eps.append(make_episode(f"s{step}-g{g}-{k}", f"s{step}-g{g}", "kuhn_poker", [p0, p1]))
    size = len(eps) // world
    return [eps[r * size:(r + 1) * size] for r in range(world)]


def main(out_dir: str, full_models: bool) -> None:
    os.makedirs(out_dir, exist_ok=True)
    model, tok = load_model_and_tokenizer("tiny", device="cpu")
    torch.manual_seed(0)  # the same adapter initialisation on every rank and in the one-process run
    policies = {name: {"model": "tiny"} if full_models else {"lora": LORA} for name in ("alice", "bob")}
    if full_models:  # two different models (bob's weights moved), the same on every rank
        bob = copy.deepcopy(model)
        with torch.no_grad():
            for p in bob.parameters():
                p.add_(0.02 * torch.randn_like(p))
        model = {"alice": model, "bob": bob}
    experiment = {"algo": {"type": "grpo"}, "policies": policies, "model": {"name": "tiny"},
                  "env": [{"id": "kuhn_poker", "group_size": 4,
                           "roles": {"player_0": {"policy": "alice"}, "player_1": {"policy": "bob"}}}]}
    with tempfile.TemporaryDirectory() as tmp:
        args = MixedAlgorithmConfig(output_dir=tmp, report_to=[], save_strategy="no", save_episodes=False, max_steps=2,
                                    learning_rate=1e-2, logging_steps=1, disable_tqdm=True, seed=0)
        trainer = MixedAlgorithmTrainer(experiment, args=args, model=model, processing_class=tok)
        world, rank = trainer.accelerator.num_processes, trainer.accelerator.process_index
        feed(trainer, lambda step: shares(step, world)[rank])
        trainer.train()
    live = trainer.accelerator.unwrap_model(trainer.model)
    weights = {name: live[name].state_dict() if full_models else adapter_state(live, name) for name in ("alice", "bob")}
    torch.save({"world": world, "model_class": type(trainer.model_wrapped).__name__,
                "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h], "policies": weights},
               os.path.join(out_dir, f"rank{rank}.pt"))
    trainer.accelerator.end_training()


if __name__ == "__main__":
    main(sys.argv[1], "--full-models" in sys.argv[2:])
