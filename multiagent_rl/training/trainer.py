"""MixedAlgorithmTrainer: TRL's GRPOTrainer with environments in place of rollouts and three loss streams.

A thin adapter: its rollout hook asks the rollout engine ([`Orchestrator`][multiagent_rl.rollout.engine.Orchestrator])
to play and score a step and the collator ([`multiagent_rl.training.collate`][]) for tensors; its loss hook
calls the loss module ([`multiagent_rl.training.loss`][]); its checkpoint hooks save and restore the engine's
state. It never learns an algorithm's name. With every sample tagged ``grpo`` the loss equals
``GRPOTrainer``'s own for any rewards.

A run guards itself: an optimizer step whose loss or gradient is not finite is skipped, a run whose
episodes all fail or whose required streams stay empty stops with the cause ([`multiagent_rl.rollout.health`][]);
checkpoints hold everything a resumed run needs to continue exactly; the first Ctrl-C finishes the
current step, saves a checkpoint and raises [`TrainingInterrupted`][multiagent_rl.training.trainer.TrainingInterrupted].
"""

from __future__ import annotations

import logging
import math
import os
from pathlib import Path

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import GRPOTrainer

from ..backends import SamplingParams, build_policy_backend
from ..config import ExperimentConfig
from ..data.hub import base_model_id, fix_adapter_base, model_card_text
from ..data.sinks import JsonlEpisodeSink
from ..data.traces import ParquetEpisodeSink
from ..episodes.episode import Episode
from ..models import load_model_and_tokenizer
from ..rollout.engine import Orchestrator, episode_metrics
from ..rollout.health import RunHealth, RunStopped
from . import loss as loss_module
from .arguments import MixedAlgorithmConfig
from .callbacks import ConsolePrinterCallback, ConsoleProgressCallback, Interrupt, RunGuards
from .checkpoint import load_run_state, save_run_state
from .collate import collate, trainable_samples
from .scoring import frozen_copy, logits_at

logger = logging.getLogger(__name__)

MAGNET_FILE = "magnet.pt"
"""The magnet's weights in a checkpoint folder (when it is a policy copy)."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``train()``: the step in flight finished and a checkpoint was saved (``.checkpoint``)."""

    def __init__(self, message: str, checkpoint: str | None, step: int):
        super().__init__(message)
        self.checkpoint, self.step = checkpoint, step


def _rewards_come_from_environments(*args, **kwargs):
    raise RuntimeError("MixedAlgorithmTrainer takes rewards from environments; this placeholder is never called")


class MixedAlgorithmTrainer(GRPOTrainer):
    """Train one policy on a mix of multi-agent environments with per-env / per-role algorithms.

    ```pycon
    >>> trainer = MixedAlgorithmTrainer({"algo": {"type": "rae"}, "env": [{"id": "kuhn_poker"}],
    ...                                  "trainer": {"max_steps": 10}})  # doctest: +SKIP
    >>> trainer.train()  # doctest: +SKIP

    ```
    """

    def __init__(self, config: ExperimentConfig | dict, args: MixedAlgorithmConfig | None = None, model=None,
                 processing_class=None, callbacks=None):
        experiment = config if isinstance(config, ExperimentConfig) else ExperimentConfig.model_validate(config)
        self.experiment = experiment
        self.model_card_results: str | None = None
        """Markdown results for the model card (recipes set it, e.g. the exploitability table)."""
        args = args or MixedAlgorithmConfig(**{"output_dir": "outputs/mixed", **experiment.trainer})
        if model is None:
            model, tok = load_model_and_tokenizer(experiment.model.name, device="cpu" if args.use_cpu else None)
            processing_class = processing_class or tok
        elif processing_class is None:
            raise ValueError("Pass processing_class (the tokenizer) together with a model object")
        peft_config = None
        if experiment.model.lora is not None:
            from peft import LoraConfig

            peft_config = LoraConfig(task_type="CAUSAL_LM", **experiment.model.lora)
        super().__init__(model=model, reward_funcs=_rewards_come_from_environments, args=args,
                         train_dataset=Dataset.from_dict({"prompt": [""] * 1024}), processing_class=processing_class,
                         callbacks=callbacks, peft_config=peft_config)
        if self.pop_callback(ProgressCallback) is not None:
            self.add_callback(ConsoleProgressCallback)
        if self.pop_callback(PrinterCallback) is not None:
            self.add_callback(ConsolePrinterCallback)
        self.add_callback(RunGuards(self))
        self.tokenizer = processing_class
        policy = self.accelerator.unwrap_model(self.model)
        rank = self.accelerator.process_index
        self.rollout = Orchestrator(
            experiment, build_policy_backend(experiment.model, policy, processing_class, seed=args.seed,
                                             max_batch_size=args.max_concurrency, endpoints=experiment.endpoints),
            policy_model=policy, device=self.accelerator.device, seed=args.seed, rank=rank,
            groups_per_step=args.groups_per_step, max_concurrency=args.max_concurrency,
            sampling=SamplingParams(temperature=args.temperature, top_p=args.top_p,
                                    max_new_tokens=args.max_completion_length),
            sink=episode_sink(args, rank),
            health=RunHealth(args.max_failed_steps, args.max_skipped_steps),
        )
        self.health = self.rollout.health
        self.streams_of_tag: dict[str, set[str]] = {}
        for algo in self.rollout.algorithms.values():
            self.streams_of_tag.setdefault(algo.name, set()).update(algo.loss_types)
        self.step_tags: list[str] = []
        self.nonfinite_loss: set[str] = set()
        self.interrupt = Interrupt(announce=self.accelerator.is_main_process)
        self._synced_step: int | None = None
        self.magnet: torch.nn.Module | None = None
        """The frozen policy copy the magnet term pulls toward (``magnet_every``); None while it is uniform."""
        self._magnet_step: int | None = None
        self._full_logits_models: set[type] = set()
        """Model classes whose logits are not just the output embeddings of the last hidden state (see _logits_at)."""
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        if args.magnet_coef and plugin is not None and plugin.zero_stage == 3:
            raise ValueError("magnet_coef needs a full copy of the policy, which DeepSpeed ZeRO-3 shards away; use "
                             "ZeRO-2, FSDP off, or magnet_coef = 0")

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

    def _sync_policy(self) -> None:
        """Hand the current weights to the policy backend once per optimizer step, before it samples again."""
        if self._synced_step != self.state.global_step:
            self.rollout.policy.sync_weights(self.accelerator.unwrap_model(self.model))
            self._synced_step = self.state.global_step

    def _update_magnet(self, step: int) -> None:
        """At each ``magnet_every`` boundary the magnet becomes a frozen copy of the current policy (R-NaD's
        regularisation policy); every process copies its own replica, which DDP keeps identical."""
        if self.args.magnet_resets_at(step) and self._magnet_step != step:
            policy = self.accelerator.unwrap_model(self.model)
            if self.magnet is None:
                self.magnet = frozen_copy(policy)
            else:
                self.magnet.load_state_dict(policy.state_dict())
            self._magnet_step = step

    def _generate_and_score_completions(self, inputs):
        step = self.state.global_step
        self._update_magnet(step)
        self._sync_policy()
        everyone = self.rollout.score(self.rollout.play(step), step, gather=self._gather)
        local = self.rollout.last_episodes
        for name, value in episode_metrics(everyone).items():
            self._metrics["train"][name].append(value)
        self.step_tags = sorted({t.streams.algorithm for ep in everyone if ep.ok for t in ep.traces
                                 if t.trainable and t.streams is not None})
        batch = collate(trainable_samples(local, self.args.skip_zero_advantage), self.tokenizer.pad_token_id,
                        multiple_of=self.args.steps_per_generation, temperature=self.temperature,
                        skip_zero_advantage=self.args.skip_zero_advantage)
        batch = {k: v.to(self.accelerator.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        counts = [batch[s.mask].sum() for s in loss_module.STREAMS]
        counts.append((batch["action_mask"] * batch["completion_mask"]).sum())
        counts = self.accelerator.reduce(torch.stack(counts).float(), reduction="sum")  # the one all-reduce
        for stream, count in zip(loss_module.STREAMS, counts):
            batch[stream.count] = count
        batch["num_action_tokens"] = counts[-1]
        batch["num_items_in_batch"] = batch["num_rl_tokens"]
        correct = self.args.vllm_importance_sampling_correction and not self.rollout.policy.exact_logprobs
        if correct or self.args.steps_per_generation > self.args.gradient_accumulation_steps or self.num_iterations > 1:
            # Several optimizer steps reuse this batch, or another engine sampled it: freeze the trainer's logprobs
            # of the policy that sampled it.
            with torch.no_grad():
                batch["old_per_token_logps"], _, _ = self._token_logps(self.model, batch)
        if correct:
            args = self.args
            batch["importance_weights"], stats = loss_module.importance_weights(
                batch["old_per_token_logps"], batch["sampling_logps"], batch["sampled_mask"],
                args.vllm_importance_sampling_mode, args.vllm_importance_sampling_clip_min,
                args.vllm_importance_sampling_clip_max)
            self._log_sampler_mismatch(stats)
        return batch

    def _log_sampler_mismatch(self, stats: dict) -> None:
        ratio, gap = stats["ratio"].float(), stats["gap"].float()
        sums = torch.stack([ratio.sum(), torch.tensor(float(ratio.numel()), device=ratio.device),
                            stats["clipped"].float().sum(), gap.sum(), torch.tensor(float(gap.numel()), device=gap.device)])
        sums = self.accelerator.reduce(sums, reduction="sum").tolist()
        extremes = torch.stack([ratio.max() if ratio.numel() else ratio.new_tensor(1.0),
                                -(ratio.min() if ratio.numel() else ratio.new_tensor(1.0)),
                                gap.max() if gap.numel() else gap.new_tensor(0.0)])
        top = self.accelerator.reduce(extremes, reduction="max").tolist() if self.accelerator.num_processes > 1 \
            else extremes.tolist()
        metrics = self._metrics["train"]
        metrics["sampling/importance_sampling_ratio/mean"].append(sums[0] / max(sums[1], 1.0))
        metrics["sampling/importance_sampling_ratio/max"].append(top[0])
        metrics["sampling/importance_sampling_ratio/min"].append(-top[1])
        metrics["sampling/importance_sampling_ratio/clipped"].append(sums[2] / max(sums[1], 1.0))
        metrics["sampling/sampling_logp_difference/mean"].append(sums[3] / max(sums[4], 1.0))
        metrics["sampling/sampling_logp_difference/max"].append(top[2])

    # -- loss -------------------------------------------------------------------------------
    def _token_logps(self, model, batch, compute_entropy=False, magnet_kl=False):
        """Log-probabilities (and entropies, and with ``magnet_kl`` the KL to the magnet) of the completion tokens
        as they were sampled: at their temperature and, if a harness constrained them, with the softmax over their
        allowed ids. When every token has the trainer's temperature, none is constrained and no magnet is read,
        this is TRL's own scoring (fused LM head); otherwise only the positions some stream or metric reads are
        scored (0 elsewhere)."""
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        T = batch["completion_ids"].size(1)
        allowed, temperatures = batch.get("allowed_ids"), batch["temperatures"]
        if allowed is None and not magnet_kl and bool((temperatures == self.temperature).all()):
            logps, entropies, _ = self._get_per_token_logps_and_entropies(model, ids, mask, T,
                                                                          compute_entropy=compute_entropy)
            return logps, entropies, None
        read = loss_module.read_positions(batch)
        read_logits = self._logits_at(model, ids, mask, T, read)
        allowed_read = None if allowed is None else allowed[read]
        logps, entropy = loss_module.token_logprobs_from_logits(
            read_logits, batch["completion_ids"][read], temperatures[read], allowed_read, with_entropy=compute_entropy)
        out = torch.zeros(read.shape, dtype=logps.dtype, device=logps.device).masked_scatter(read, logps)
        kl = None
        if magnet_kl:
            magnet_logits = None
            if self.magnet is not None:
                with torch.no_grad():
                    magnet_logits = self._logits_at(self.magnet, ids, mask, T, read)
            per_row = loss_module.kl_to_magnet(read_logits, magnet_logits, temperatures[read], allowed_read)
            kl = torch.zeros_like(out).masked_scatter(read, per_row)
        return out, (torch.zeros_like(out).masked_scatter(read, entropy) if compute_entropy else None), kl

    def _logits_at(self, model, ids, mask, T, read):
        """The logits (M, V) at the completion positions ``read`` (B, T): the LM head on just those positions'
        hidden states ([`logits_at`][multiagent_rl.training.scoring.logits_at]), or the model's logits at all T + 1 kept
        positions for a model whose logits are not its head on its last hidden state (checked on every call; one
        warning per model class) and under FSDP or ZeRO-3 (whose sharded head cannot run outside the forward)."""
        plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        head = self.accelerator.unwrap_model(model).get_output_embeddings()
        if self.is_fsdp_enabled or (plugin is not None and plugin.zero_stage == 3) or type(model) in self._full_logits_models:
            head = None
        with self.accelerator.autocast():
            logits = logits_at(model, head, ids, mask, T, read)
        if logits is None:
            self._full_logits_models.add(type(model))
            logger.warning("%s's logits are not its output embeddings applied to its last hidden state: the loss "
                           "reads its logits at every completion position instead", type(model).__name__)
            return self._logits_at(model, ids, mask, T, read)
        return logits

    def _compute_loss(self, model, inputs):
        step = self.state.global_step
        magnet_coef = self.args.magnet_coef_at(step)
        logps, entropies, magnet_kl = self._token_logps(model, inputs, compute_entropy=True,
                                                        magnet_kl=bool(magnet_coef))
        mode = "train" if self.model.training else "eval"
        # Token counts span the generation batch on all ranks; rescale to one accumulation window and
        # undo DDP's gradient averaging, exactly as TRL does for its DAPO loss.
        window = self.current_gradient_accumulation_steps / self.args.steps_per_generation if mode == "train" else 1.0
        world = self.accelerator.num_processes
        loss, parts = loss_module.compute_loss(
            logps, entropies, inputs, lambda count: count.clamp(min=1.0) / world * window,
            self.epsilon_low, self.epsilon_high, self.args.entropy_coef_at(step), magnet_kl, magnet_coef)
        sums = loss_module.metric_sums(parts, entropies, inputs, self.step_tags, self.streams_of_tag, magnet_kl)
        values = loss_module.reduce_metrics(sums, lambda t: self.accelerator.reduce(t, reduction="sum"),
                                            scale=self.args.steps_per_generation if mode == "train" else 1.0)
        for name, value in values.items():
            if name.startswith("loss/") and not math.isfinite(value):
                self.nonfinite_loss.add(name.split("/")[1])
            self._metrics[mode][name].append(value)
        return loss

    # -- logging, checkpoints, interruption ---------------------------------------------------
    def record_metric(self, name: str, value: float) -> None:
        """Add a value to the next log (e.g. ``eval/...`` from an evaluation callback; shown on the console line)."""
        self._metrics["train"][name].append(float(value))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        logs["episodes"] = self.rollout.episodes_played
        if self.health.total_skipped:
            logs["health/skipped_steps"] = self.health.total_skipped
        if self.args.entropy_coef_final is not None:
            logs["entropy_coef"] = self.args.entropy_coef_at(self.state.global_step)
        super().log(logs, start_time)

    def create_model_card(self, model_name=None, dataset_name=None, tags=None):
        """The model card (``output_dir/README.md``, pushed with the model): the real base model's Hub id, the
        environments, roles and algorithms, `model_card_results` and the command."""
        if self.is_world_process_zero():
            text = model_card_text(self.experiment, hub_model_id=self.hub_model_id, results=self.model_card_results,
                                   adapter=self.experiment.model.lora is not None)
            Path(self.args.output_dir, "README.md").write_text(text, encoding="utf-8")

    def push_to_hub(self, commit_message: str | None = "End of training", blocking: bool = True, **kwargs):
        """TRL's ``push_to_hub`` (weights, tokenizer, the model card), without the run's traces and episode logs:
        push those to a dataset repository with [`multiagent_rl.data.hub.push_traces`][]."""
        from transformers.utils import hub as transformers_hub

        # Trainer.push_to_hub uploads output_dir with fixed ignore patterns; the traces are a dataset of their own
        api = transformers_hub.hf_api()
        original = api.upload_folder

        def upload_folder(*args, ignore_patterns=None, **kw):
            return original(*args, ignore_patterns=list(ignore_patterns or []) + ["traces/*", "episodes/*"], **kw)

        api.upload_folder = upload_folder
        try:
            return super().push_to_hub(commit_message=commit_message, blocking=blocking, **kwargs)
        finally:
            api.upload_folder = original

    def save_model(self, output_dir: str | None = None, _internal_call: bool = False):
        super().save_model(output_dir, _internal_call)
        if self.is_world_process_zero():  # a LoRA adapter names its base by Hub id, not the local path it came from
            fix_adapter_base(output_dir or self.args.output_dir, base_model_id(self.experiment.model.name))

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        if os.path.isdir(folder):
            save_run_state(folder, self.rollout, self.callback_handler.callbacks, self.accelerator.process_index,
                           self.accelerator.is_main_process)
            if self.magnet is not None and self.accelerator.is_main_process:
                torch.save(self.magnet.state_dict(), os.path.join(folder, MAGNET_FILE))

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if checkpoint:
            load_run_state(checkpoint, self.rollout, self.callback_handler.callbacks, self.accelerator.process_index)
            self._load_magnet(checkpoint)
            if self.rollout.sink is not None:
                self.rollout.sink.resume(self.state.global_step)  # the steps about to be replayed are logged again

    def _load_magnet(self, checkpoint: str) -> None:
        path = os.path.join(checkpoint, MAGNET_FILE)
        step = self.state.global_step
        # The magnet saved with the checkpoint is the one the last completed step (step - 1) pulled toward.
        if self.args.magnet_coef and not self.args.magnet_is_uniform_at(step - 1):
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{checkpoint} has no {MAGNET_FILE}, but the magnet at step {step} is a copy of "
                                        "an earlier policy (magnet_every): resume from a checkpoint written with the "
                                        "magnet settings of this run")
            self.magnet = frozen_copy(self.accelerator.unwrap_model(self.model))
            self.magnet.load_state_dict(torch.load(path, map_location=self.accelerator.device, weights_only=True))

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """TRL's ``train()``, plus: the first Ctrl-C finishes the step in flight, saves a checkpoint and raises
        [`TrainingInterrupted`][multiagent_rl.training.trainer.TrainingInterrupted] (a second one stops at once); a run stopped
        by its health checks ([`RunStopped`][multiagent_rl.rollout.health.RunStopped]) saves a checkpoint first."""
        if self.rollout.sink is not None and not resume_from_checkpoint:
            self.rollout.sink.resume(0)  # a fresh run in this folder starts a fresh log (the old one is kept aside)
        with self.interrupt.catching():
            try:
                output = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
            except RunStopped as exc:
                folder = self._save_now()
                raise RunStopped(f"{exc}\nThe weights after step {self.state.global_step} are saved in {folder}.") from None
        if self.interrupt.requested:
            folder = self._checkpoint_folder()
            raise TrainingInterrupted(f"interrupted at step {self.state.global_step}: checkpoint saved in {folder}; "
                                      "resume with train(resume_from_checkpoint=True) (recipes: --resume)",
                                      folder, self.state.global_step)
        return output

    def _checkpoint_folder(self) -> str:
        return os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")

    def _save_now(self) -> str:
        folder = self._checkpoint_folder()
        if not os.path.isdir(folder):
            self._save_checkpoint(self.model_wrapped, trial=None)
        return folder


__all__ = ["MixedAlgorithmConfig", "MixedAlgorithmTrainer", "TrainingInterrupted"]


def episode_sink(args, rank: int):
    """Where the played episodes go: ``args.episode_format`` under ``args.output_dir`` (None when not saved)."""
    if not args.save_episodes or not args.output_dir:
        return None
    if args.episode_format == "jsonl":
        return JsonlEpisodeSink(os.path.join(args.output_dir, "episodes"), rank)
    return ParquetEpisodeSink(os.path.join(args.output_dir, "traces"), rank,
                              run=os.path.basename(os.path.normpath(args.output_dir)))
