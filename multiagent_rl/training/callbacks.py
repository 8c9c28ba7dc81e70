"""Trainer callbacks: run guards, the console line, learning rates per training phase.

- [`RunGuards`][multiagent_rl.training.callbacks.RunGuards] skips an optimizer step whose loss or gradient is not finite (the
weights
  never see a NaN) and, after a Ctrl-C, stops at the end of the step with a checkpoint.
- [`ConsoleProgressCallback`][multiagent_rl.training.callbacks.ConsoleProgressCallback] /
[`ConsolePrinterCallback`][multiagent_rl.training.callbacks.ConsolePrinterCallback] print one readable line per
  logging step instead of transformers' whole log dict (the full metrics still go to the loggers)::

      step 20/500  episodes 5,120  reward kuhn_poker player_0 -0.06 player_1 +0.06  loss rl -0.0031  eval exploitability 0.231

- [`PhaseLearningRate`][multiagent_rl.training.callbacks.PhaseLearningRate] sets the learning rate for given step ranges (e.g. an
sft warm-up
  phase at a higher rate than the RL phase that follows).
- [`FreshOptimizerState`][multiagent_rl.training.callbacks.FreshOptimizerState] forgets the optimizer's moment estimates where one
  phase hands over to the next.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections import defaultdict
from collections.abc import Iterator
from typing import Any

import torch
from accelerate.state import AcceleratorState
from accelerate.utils import DistributedType
from transformers import TrainerCallback
from transformers.trainer_callback import ProgressCallback

from ..episodes.streams import stream_names


class Interrupt:
    """Ctrl-C as a request: while ``catching()``, the first SIGINT only sets
    ``requested`` (the run finishes its step and saves); a second one raises ``KeyboardInterrupt`` at once."""

    def __init__(self, announce: bool = True):
        self.requested, self.announce = False, announce

    def _handle(self, signum, frame):
        if self.requested:
            signal.default_int_handler(signum, frame)
        self.requested = True
        if self.announce:
            print("\nCtrl-C: finishing this step, then saving a checkpoint (press again to stop at once)", flush=True)

    @contextlib.contextmanager
    def catching(self) -> Iterator[Interrupt]:
        self.requested = False
        if threading.current_thread() is not threading.main_thread():  # signals reach the main thread only
            yield self
            return
        previous = signal.signal(signal.SIGINT, self._handle)
        try:
            yield self
        finally:
            signal.signal(signal.SIGINT, previous)


class RunGuards(TrainerCallback):
    """Skip optimizer steps with a non-finite loss or gradient; stop at step end after Ctrl-C.

    ``trainer`` provides ``health`` ([`RunHealth`][multiagent_rl.rollout.health.RunHealth]), ``nonfinite_loss`` (the
    streams whose loss was not finite in this step) and ``interrupt`` (an
    [`Interrupt`][multiagent_rl.training.callbacks.Interrupt]).
    """

    def __init__(self, trainer: Any):
        self.trainer = trainer

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        trainer = self.trainer
        params = [(n, p) for n, p in trainer.model.named_parameters() if p.grad is not None]
        finite = torch.stack([torch.isfinite(p.grad).all() for _, p in params]).all().item() if params else True
        cause = ""
        if trainer.nonfinite_loss:
            cause = f"the loss was not finite ({', '.join(sorted(trainer.nonfinite_loss))})"
        elif not finite:
            bad = [n for n, p in params if not torch.isfinite(p.grad).all()]
            cause = f"the gradient was not finite ({bad[0]}" + (f" and {len(bad) - 1} more)" if len(bad) > 1 else ")")
        trainer.nonfinite_loss.clear()
        if trainer.health.after_gradient(not cause, cause):
            for _, p in params:
                p.grad = None  # an optimizer skips parameters without a gradient: no update, no moment change

    def on_step_end(self, args, state, control, **kwargs):
        trainer = self.trainer
        flag = torch.tensor(float(trainer.interrupt.requested), device=trainer.accelerator.device)
        if trainer.accelerator.num_processes > 1:  # every rank stops at the same step
            flag = trainer.accelerator.reduce(flag, reduction="sum")
        if flag.item() > 0:
            trainer.interrupt.requested = True
            control.should_save = True
            control.should_training_stop = True
        return control


class PhaseLearningRate(TrainerCallback):
    """A fixed learning rate during given step ranges; the scheduler's rate elsewhere.

    ```pycon
    >>> PhaseLearningRate([(0, 100, 3e-3)])  # a higher rate for the first 100 steps (an sft warm-up)  # doctest: +SKIP

    ```
    """

    def __init__(self, phases: list[tuple[int, int, float]]):
        self.phases = [(int(start), int(stop), float(lr)) for start, stop, lr in phases]

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        for start, stop, lr in self.phases:
            if start <= state.global_step < stop and optimizer is not None:
                for group in optimizer.param_groups:
                    group["lr"] = lr


class FreshOptimizerState(TrainerCallback):
    """Forget the optimizer's state (Adam's moment estimates and step count) before the given steps run, as a fresh
    optimizer would start there; the weights, the learning-rate schedule and the data are untouched.

    Where an sft warm-up hands over to RL, Adam's second-moment estimate still holds the warm-up's gradients, which
    are much larger than the RL phase's, and it forgets them with a time constant of 1 / (1 − β₂) steps (1,000 at
    the default β₂): the first few hundred RL steps come out that much smaller, and the momentum still points where
    the warm-up was going. On Kuhn poker it held one seed at exploitability 0.22 (docs/kuhn_poker_results.md); on
    Leduc the reset made no measurable difference (docs/leduc_poker.md).

    ```pycon
    >>> FreshOptimizerState([100])  # the RL phase after a 100-step warm-up starts with a fresh Adam  # doctest: +SKIP

    ```
    Not with DeepSpeed, whose optimizer keeps its own partitioned state.
    """

    def __init__(self, steps: list[int]):
        self.steps = {int(step) for step in steps}

    def on_train_begin(self, args, state, control, **kwargs):
        # the accelerator's state, as the trainer's ZeRO-3 check reads it: it also knows an `accelerate launch` config
        if AcceleratorState().distributed_type == DistributedType.DEEPSPEED:
            raise ValueError("FreshOptimizerState cannot reset a DeepSpeed optimizer's partitioned state; "
                             "leave it out of the callbacks under DeepSpeed")

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        if state.global_step in self.steps and optimizer is not None:
            optimizer.state.clear()  # torch optimizers initialise a parameter's state again when it is missing


def console_line(logs: dict, step: int, max_steps: int) -> str:
    """The one line printed for a log dict (with a non-exact sampler such as vLLM, its importance ratio's mean,
    [min, max], clipped share and largest log-prob gap to the trainer)."""
    parts = [f"step {step}/{max_steps}"]
    if "episodes" in logs:
        parts.append(f"episodes {int(logs['episodes']):,}")
    rewards: dict[str, list[str]] = defaultdict(list)
    for key, value in logs.items():
        bits = key.split("/")
        if len(bits) == 4 and bits[3] == "reward_mean" and isinstance(value, (int, float)):
            env, role, _ = bits[:3]
            rewards[env].append(f"{role} {value:+.3g}")
    for env, items in rewards.items():
        parts.append(f"reward {env} " + " ".join(items))
    failed = sum(v for k, v in logs.items() if k.endswith("/failed_episodes") and isinstance(v, (int, float)))
    if failed:
        parts.append(f"failed {failed:g}")
    losses = [f"{s} {logs[f'loss/{s}']:.4g}" for s in stream_names()
              if isinstance(logs.get(f"loss/{s}"), (int, float)) and (s == "rl" or logs[f"loss/{s}"])]
    if losses:
        parts.append("loss " + " ".join(losses))
    if logs.get("health/skipped_steps"):
        parts.append(f"skipped steps {logs['health/skipped_steps']:g}")
    ratio = {k.rsplit("/", 1)[1]: v for k, v in logs.items() if k.startswith("sampling/importance_sampling_ratio/")}
    if isinstance(ratio.get("mean"), (int, float)):  # logged when a non-exact sampler (vLLM) sampled this step
        sampler = f"sampler ratio {ratio['mean']:.4g}"
        if isinstance(ratio.get("min"), (int, float)) and isinstance(ratio.get("max"), (int, float)):
            sampler += f" [{ratio['min']:.4g}, {ratio['max']:.4g}]"
        if ratio.get("clipped"):
            sampler += f" clipped {ratio['clipped']:.1%}"
        if isinstance(logs.get("sampling/sampling_logp_difference/max"), (int, float)):
            sampler += f" logp gap max {logs['sampling/sampling_logp_difference/max']:.2g}"
        parts.append(sampler)
    evals = [f"{k.split('/')[-1]} {v:.3g}" for k, v in logs.items()
             if k.startswith("eval/") and isinstance(v, (int, float))]
    if evals:
        parts.append("eval " + " ".join(evals))
    return "  ".join(parts)


def _is_training_log(logs: dict) -> bool:
    return "loss" in logs or any(k.startswith("eval/") for k in logs)


class ConsoleProgressCallback(ProgressCallback):
    """Transformers' progress bar, printing [`console_line`][multiagent_rl.training.callbacks.console_line] instead of the whole
    log dict."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and self.training_bar is not None and logs and _is_training_log(logs):
            self.training_bar.write(console_line(logs, state.global_step, state.max_steps))


class ConsolePrinterCallback(TrainerCallback):
    """Without a progress bar (``disable_tqdm``): print [`console_line`][multiagent_rl.training.callbacks.console_line]."""

    def on_log(self, args, state, control, logs=None, **kwargs):
        if state.is_world_process_zero and logs and _is_training_log(logs):
            print(console_line(logs, state.global_step, state.max_steps), flush=True)


def phase_callbacks(phases: list[tuple[int, int | None, Any]], max_steps: int) -> list[TrainerCallback]:
    """The callbacks that carry out an experiment's ``[[phase]]`` list (``ExperimentConfig.phase_boundaries()``): its
    learning rates and its fresh optimizer states."""
    rates = [(start, max_steps if stop is None else stop, p.learning_rate) for start, stop, p in phases
             if p.learning_rate is not None]
    fresh = [start for start, _, p in phases if p.fresh_optimizer]
    return [*([PhaseLearningRate(rates)] if rates else []), *([FreshOptimizerState(fresh)] if fresh else [])]
