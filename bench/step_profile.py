"""Where a training step's time goes: generation, scoring, loss, backward, optimizer, evaluation, logging.

Runs the Kuhn recipe's experiment for a few RL steps (no warm-up: every step samples) and times, inside each
step, the rollout (``rollout.step``: sampling and the game's own logic), the trainer's extra scoring passes
(``score_policies`` outside the loss: old-policy logprobs where a batch is reused or another engine sampled it),
the loss with its forward (``compute_loss``), the backward, the optimizer step (with gradient clipping), the exact evaluation callback and
the trainer's logging. ``other`` is the rest of the step (collation, metrics, the Trainer's own loop). Steps are
timed from one ``on_step_begin`` to the next, so every share is of the same wall time. The first step is left out
(warm-up of allocators and caches).

    python bench/step_profile.py                                   # Kuhn, tiny model, the recipe's batch
    python bench/step_profile.py --model smollm2-135m --lora 16 --groups-per-step 4 --group-size 4 --steps 4

Prints a table and one ``RESULT {json}`` line. Time is wall time on this machine: run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections import defaultdict
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "recipes"))

from transformers import TrainerCallback  # noqa: E402

PARTS = ("generation", "scoring", "loss", "backward", "optimizer", "evaluation", "logging")


class StepClock(TrainerCallback):
    """Wall time per step (``on_step_begin`` to the next) and the optimizer's share (pre-optimizer → optimizer)."""

    def __init__(self, spent: dict[str, float]):
        self.spent, self.steps, self._begin, self._optimizer = spent, [], None, None

    def _close(self):
        if self._begin is not None:
            self.steps.append(time.perf_counter() - self._begin)

    def on_step_begin(self, args, state, control, **kwargs):
        self._close()
        self._begin = time.perf_counter()

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        self._optimizer = time.perf_counter()

    def on_optimizer_step(self, args, state, control, **kwargs):
        self.spent["optimizer"] += time.perf_counter() - self._optimizer

    def on_train_end(self, args, state, control, **kwargs):
        self._close()


def timed(spent: dict[str, float], part: str, function, inside: set[str] | None = None, unless: str | None = None):
    """``function``, its time added to ``spent[part]``; with ``unless``, not while ``unless`` is running (the
    policy's forward inside the loss is the loss's time, not scoring's)."""
    inside = set() if inside is None else inside

    def wrapper(*args, **kwargs):
        if unless in inside:
            return function(*args, **kwargs)
        start = time.perf_counter()
        inside.add(part)
        try:
            return function(*args, **kwargs)
        finally:
            inside.discard(part)
            spent[part] += time.perf_counter() - start

    return wrapper


def profile(argv: list[str], steps: int) -> dict:
    import kuhn_poker

    from multiagent_rl.envs.kuhn_poker.evaluation import KuhnEvaluation
    from multiagent_rl.training.trainer import MixedAlgorithmTrainer

    args, _ = kuhn_poker.parse(["--warmup-steps", "0", "--steps", str(steps), "--save-every", "0", *argv])
    config = kuhn_poker.experiment(args)
    config.trainer.update(save_strategy="no", save_episodes=False, output_dir=str(Path(os.environ.get(
        "TMPDIR", "/tmp")) / "step_profile"), disable_tqdm=True)
    spent: dict[str, float] = defaultdict(float)
    evaluation = KuhnEvaluation(args.eval_every)
    clock = StepClock(spent)
    trainer = MixedAlgorithmTrainer(config, callbacks=[evaluation, clock])
    evaluation.trainer = trainer
    evaluation.legal_choices = not args.free_text
    evaluation.on_step_end = timed(spent, "evaluation", evaluation.on_step_end)
    trainer.rollout.step = timed(spent, "generation", trainer.rollout.step)
    running: set[str] = set()
    trainer.score_policies = timed(spent, "scoring", trainer.score_policies, running, unless="loss")
    trainer.compute_loss = timed(spent, "loss", trainer.compute_loss, running)
    trainer.accelerator.backward = timed(spent, "backward", trainer.accelerator.backward)
    trainer.log = timed(spent, "logging", trainer.log)
    first: dict[str, float] = {}

    class ForgetFirstStep(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if state.global_step == 1:
                first.update(spent)

    trainer.add_callback(ForgetFirstStep())
    trainer.train()
    # step 1 (and its share of every part) is left out
    measured = {part: spent[part] - first.get(part, 0.0) for part in PARTS}
    wall = sum(clock.steps[1:])
    measured["other"] = wall - sum(measured.values())
    return {"steps": len(clock.steps) - 1, "seconds_per_step": wall / max(1, len(clock.steps) - 1),
            "share": {part: value / wall for part, value in measured.items()},
            "command": "python bench/step_profile.py " + " ".join(argv)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=21, help="steps to run (the first is left out)")
    known, rest = p.parse_known_args(argv)  # the rest are the Kuhn recipe's own flags
    if "--eval-every" not in rest:
        rest += ["--eval-every", "10"]
    result = profile(rest, known.steps)
    print(f"{result['steps']} steps, {result['seconds_per_step']:.3f} s a step ({result['command']})")
    print("| part | share of the step |\n|---|---|")
    for part, share in result["share"].items():
        print(f"| {part} | {share:.1%} |")
    print("RESULT " + json.dumps(result))
    return result


if __name__ == "__main__":
    main()
