"""MixedAlgorithmTrainer: TRL's GRPOTrainer with environments in place of rollouts and loss streams in place of its loss.

A thin adapter: its rollout hook asks the rollout engine ([`Orchestrator`][multiagent_rl.rollout.engine.Orchestrator])
for a played and scored step and the collator ([`multiagent_rl.training.collate`][]) for tensors; its loss hook scores
the policy ([`PolicyScorer`][multiagent_rl.training.logits.PolicyScorer]) and adds the loss module's streams
([`multiagent_rl.training.loss`][]) and the experiment's regularisers ([`multiagent_rl.training.regularisers`][]); its
checkpoint hooks save and restore the engine's and the regularisers' state. It knows no algorithm or regulariser by
name. With every sample tagged ``grpo`` the loss equals ``GRPOTrainer``'s own for any rewards. A run guards itself
([`multiagent_rl.rollout.health`][], [`RunGuards`][multiagent_rl.training.callbacks.RunGuards]); the first Ctrl-C
finishes the step, saves a checkpoint and raises [`TrainingInterrupted`][multiagent_rl.training.trainer.TrainingInterrupted].
"""

from __future__ import annotations

import math
import os

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import GRPOTrainer

from ..backends import SamplingParams
from ..config import ExperimentConfig
from ..data.traces import episode_sink
from ..episodes.episode import Episode
from ..rollout.engine import Orchestrator, RolloutStep
from ..rollout.health import RunHealth, RunStopped
from . import loss as loss_module
from .arguments import MixedAlgorithmConfig
from .callbacks import ConsolePrinterCallback, ConsoleProgressCallback, Interrupt, RunGuards, phase_callbacks
from .checkpoint import load_run_state, save_run_state
from .collate import collate, trainable_samples
from .logits import PolicyScorer
from .policies import PoliciesMixin
from .publishing import PublishingMixin
from .regularisers import build_regulariser
from .rollouts_ahead import RolloutsAhead, play_and_score


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``train()``: the step in flight finished and a checkpoint was saved (``.checkpoint``)."""

    def __init__(self, message: str, checkpoint: str | None, step: int):
        super().__init__(message)
        self.checkpoint, self.step = checkpoint, step


def _rewards_come_from_environments(*args, **kwargs):
    raise RuntimeError("MixedAlgorithmTrainer takes rewards from environments; this placeholder is never called")


class MixedAlgorithmTrainer(PoliciesMixin, PublishingMixin, GRPOTrainer):
    """Train one policy or several (``[policies]``) on a mix of multi-agent environments, per-env / per-role algorithms.

    ```pycon
    >>> trainer = MixedAlgorithmTrainer({"algo": {"type": "rae"}, "env": [{"id": "kuhn_poker"}],
    ...                                  "trainer": {"max_steps": 10}})  # doctest: +SKIP
    >>> trainer.train()  # doctest: +SKIP

    ```
    """

    def __init__(self, config: ExperimentConfig | dict, args: MixedAlgorithmConfig | None = None, model=None,
                 processing_class=None, callbacks=None):
        """``model``: the policy to train (default: loaded from ``[model] name``, or each full-model policy's
        ``model``), given with its tokenizer as ``processing_class``; for full-model ``[policies]`` a dict
        ``{name: model}`` in the config's order."""
        experiment = config if isinstance(config, ExperimentConfig) else ExperimentConfig.model_validate(config)
        self.experiment = experiment
        self.model_card_results: str | None = None
        """Markdown results for the model card (recipes set it, e.g. the exploitability table)."""
        args = args or MixedAlgorithmConfig(**{"output_dir": "outputs/mixed", **experiment.trainer})
        model, processing_class, peft_config = self.policy_to_train(model, processing_class, args.use_cpu)
        super().__init__(model=model, reward_funcs=_rewards_come_from_environments, args=args,
                         train_dataset=Dataset.from_dict({"prompt": [""] * 1024}), processing_class=processing_class,
                         callbacks=callbacks, peft_config=peft_config)
        self.fuse_policy_heads()
        if self.pop_callback(ProgressCallback) is not None:
            self.add_callback(ConsoleProgressCallback)
        if self.pop_callback(PrinterCallback) is not None:
            self.add_callback(ConsolePrinterCallback)
        self.add_callback(RunGuards(self))
        for callback in phase_callbacks(experiment.phase_boundaries(), args.max_steps):
            self.add_callback(callback)
        self.tokenizer = processing_class
        policy = self.accelerator.unwrap_model(self.model)
        rank = self.accelerator.process_index
        policies = self.policy_backends(policy, processing_class)
        self.rollout = Orchestrator(
            experiment, next(iter(policies.values())), policies=policies,
            policy_model=policy, device=self.accelerator.device, seed=args.seed, rank=rank,
            groups_per_step=args.groups_per_step, max_concurrency=args.max_concurrency,
            sampling=SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                    max_new_tokens=args.max_completion_length),
            sink=episode_sink(args.output_dir, args.episode_format, rank, experiment) if args.save_episodes else None,
            health=RunHealth(args.max_failed_steps, args.max_skipped_steps),
        )
        self.health = self.rollout.health
        self.rollout_step: RolloutStep | None = None
        self.nonfinite_loss: set[str] = set()
        self.interrupt = Interrupt(announce=self.accelerator.is_main_process)
        self._synced_step: int | None = None
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        sharded = self.is_fsdp_enabled or (plugin is not None and plugin.zero_stage == 3)
        self.ahead = RolloutsAhead.for_run(self.rollout, policy, args, sharded)
        self.regularisers = [build_regulariser(c, args.max_steps) for c in experiment.regulariser]
        self.check_policies_supported()
        if sharded and any(r.needs_logits for r in self.regularisers):
            raise ValueError("a regulariser that reads the policy's logits needs its full LM head, which "
                             "FSDP and DeepSpeed ZeRO-3 shard away; use ZeRO-2 or DDP, or drop the regulariser")
        self.scorer = PolicyScorer(self.accelerator, self.temperature, self._get_per_token_logps_and_entropies,
                                   head_outside_forward=not sharded)

    @classmethod
    def from_toml(cls, path, **kwargs) -> MixedAlgorithmTrainer:
        """A trainer for the experiment in a TOML file (``ExperimentConfig.from_toml``)."""
        return cls(ExperimentConfig.from_toml(path), **kwargs)

    # -- rollout ----------------------------------------------------------------------------
    def _gather(self, local: list[Episode]) -> tuple[list[Episode], int]:
        # Group credit (and RAE's baselines) see every process's episodes, in rank order.
        if self.accelerator.num_processes == 1:
            return local, 0
        counts = gather_object([len(local)])
        return gather_object(local), sum(counts[: self.accelerator.process_index])

    def _generate_and_score_completions(self, inputs):
        step = self.state.global_step
        policy = self.accelerator.unwrap_model(self.model)
        for regulariser in self.regularisers:
            regulariser.before_step(step, policy)
        self.rollout_step, lag = play_and_score(self, step, policy)
        for name, value in self.rollout_step.metrics().items():
            self._metrics["train"][name].append(value)
        args = self.args
        batch = collate(trainable_samples(self.rollout_step.local, args.skip_zero_advantage),
                        self.tokenizer.pad_token_id, multiple_of=args.steps_per_generation,
                        temperature=self.temperature, skip_zero_advantage=args.skip_zero_advantage)
        batch = {k: v.to(self.accelerator.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        self.count_tokens(batch, lambda t: self.accelerator.reduce(t, reduction="sum"))
        correct = args.vllm_importance_sampling_correction and (lag > 0 or not self.rollout.policy.exact_logprobs)
        if correct or args.steps_per_generation > args.gradient_accumulation_steps or self.num_iterations > 1:
            # Several optimizer steps reuse this batch, or another engine sampled it: freeze the trainer's logprobs
            # of the policy that sampled it.
            with torch.no_grad():
                batch["old_per_token_logps"] = self.score_policies(self.model, batch).logps
        if correct:
            batch["importance_weights"], stats = loss_module.importance_weights(
                batch["old_per_token_logps"], batch["sampling_logps"], batch["sampled_mask"],
                args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_min,
                args.vllm_importance_sampling_clip_max)
            one = self.accelerator.num_processes == 1
            reduce_max = (lambda t: t) if one else (lambda t: self.accelerator.reduce(t, reduction="max"))
            for name, value in loss_module.sampler_mismatch_metrics(
                    stats, lambda t: self.accelerator.reduce(t, reduction="sum"), reduce_max).items():
                self._metrics["train"][name].append(value)
        return batch

    # -- loss -------------------------------------------------------------------------------
    def _needs_logits(self, step: int) -> bool:
        return any(r.needs_logits and r.coef_at(step) for r in self.regularisers)

    def _compute_loss(self, model, inputs):
        step = self.state.global_step
        scored = self.score_policies(model, inputs, compute_entropy=True, need_logits=self._needs_logits(step))
        mode = "train" if self.model.training else "eval"
        window = self.current_gradient_accumulation_steps / self.args.steps_per_generation if mode == "train" else 1.0
        normalizer = loss_module.normalizer(self.accelerator.num_processes, window)
        loss, parts = loss_module.compute_loss(scored.logps, inputs, normalizer, self.epsilon_low, self.epsilon_high)
        played = self.rollout_step  # None for a batch collated elsewhere (tests, evaluation): no per-algorithm split
        sums = loss_module.metric_sums(parts, scored.entropies, inputs, played.tags if played else [],
                                       self.rollout.streams_of_tag())
        for regulariser in self.regularisers:
            if regulariser.coef_at(step):
                term, metrics = regulariser.term(step, scored, inputs, normalizer,
                                                 lambda m: self.scorer.read_logits_of(m, scored))
                loss = loss + term
                sums.update(metrics)
        values = loss_module.reduce_metrics(sums, lambda t: self.accelerator.reduce(t, reduction="sum"),
                                            scale=self.args.steps_per_generation if mode == "train" else 1.0)
        for name, value in values.items():
            if name.startswith("loss/") and not math.isfinite(value):
                self.nonfinite_loss.add(name.split("/")[1])
            self._metrics[mode][name].append(value)
        return loss

    # -- logging, saving, checkpoints, interruption ---------------------------------------------
    def record_metric(self, name: str, value: float) -> None:
        """Add a value to the next log (e.g. ``eval/...`` from an evaluation callback; shown on the console line)."""
        self._metrics["train"][name].append(float(value))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        logs["episodes"] = self.rollout.episodes_played
        if self.health.total_skipped:
            logs["health/skipped_steps"] = self.health.total_skipped
        for regulariser in self.regularisers:
            logs.update(regulariser.logs(self.state.global_step))
        super().log(logs, start_time)

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        if os.path.isdir(folder):
            save_run_state(folder, self.rollout, self.callback_handler.callbacks, self.accelerator.process_index,
                           self.accelerator.is_main_process, self.ahead, self.state.global_step)
            if self.accelerator.is_main_process:
                for regulariser in self.regularisers:
                    regulariser.save(folder)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint:
            load_run_state(checkpoint, self.rollout, self.callback_handler.callbacks, self.accelerator.process_index)
            policy = self.accelerator.unwrap_model(self.model)
            for regulariser in self.regularisers:
                regulariser.load(checkpoint, self.state.global_step, policy, self.accelerator.device)
            if self.rollout.sink is not None:
                self.rollout.sink.resume(self.state.global_step)  # the steps about to be replayed are logged again

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """TRL's ``train()``, plus: the first Ctrl-C finishes the step in flight, saves a checkpoint and raises
        [`TrainingInterrupted`][multiagent_rl.training.trainer.TrainingInterrupted] (a second one stops at once); a
        run stopped by its health checks ([`RunStopped`][multiagent_rl.rollout.health.RunStopped]) saves a checkpoint
        first."""
        if self.rollout.sink is not None and not resume_from_checkpoint:
            self.rollout.sink.resume(0)  # a fresh run in this folder starts a fresh log (the old one is kept aside)
        with self.interrupt.catching():
            try:
                output = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
            except RunStopped as exc:
                folder = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
                if not os.path.isdir(folder):
                    self._save_checkpoint(self.model_wrapped, trial=None)
                raise RunStopped(f"{exc}\nThe weights after step {self.state.global_step} are saved in {folder}.") from None
            finally:
                if self.ahead is not None:
                    self.ahead.close()
        if self.interrupt.requested:
            folder = os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")
            raise TrainingInterrupted(f"interrupted at step {self.state.global_step}: checkpoint saved in {folder}; "
                                      "resume with train(resume_from_checkpoint=True) (recipes: --resume)",
                                      folder, self.state.global_step)
        return output


__all__ = ["MixedAlgorithmConfig", "MixedAlgorithmTrainer", "TrainingInterrupted"]
