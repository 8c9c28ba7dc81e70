"""``MixedAlgorithmConfig``: TRL's ``GRPOConfig`` plus the settings of multi-agent rollouts and run guards.

Checked when built: ``max_steps`` is required (the trainer's dataset is a placeholder), the
temperature must be positive (the policy is trained on its samples), and TRL loss variants the
three-stream loss does not implement are refused. On a machine without CUDA the GPU defaults are
switched off (fp32, no gradient checkpointing).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch
from trl import GRPOConfig

logger = logging.getLogger(__name__)

MAX_STEPS_ENV = "MULTIAGENT_RL_MAX_STEPS"
"""Environment variable that caps ``max_steps`` (smoke tests of docs, notebooks and recipes)."""


@dataclass
class MixedAlgorithmConfig(GRPOConfig):
    """TRL ``GRPOConfig`` plus the rollout settings of multi-agent training.

    Rollout size comes from ``groups_per_step`` × each environment's ``group_size``, not from
    ``per_device_train_batch_size``/``num_generations`` (those only size TRL's placeholder
    dataloader). ``max_steps`` is required. On a machine without CUDA the GPU defaults are switched
    off automatically (fp32, no gradient checkpointing).
    """

    max_steps: int = field(default=-1, metadata={"help": "Training steps (required: the dataset is a placeholder)."})
    groups_per_step: int = field(default=4, metadata={"help": "Task groups each process plays per generation round."})
    max_concurrency: int = field(default=256, metadata={"help": "Most episodes in flight at once per process."})
    save_episodes: bool = field(
        default=True, metadata={"help": "Keep every played episode (see episode_format) under output_dir."}
    )
    episode_format: str = field(
        default="parquet",
        metadata={"help": "'parquet': one zstd Parquet shard of trace rows per step in output_dir/traces/ "
                          "(multiagent_rl.data.traces.load_traces); 'jsonl': one JSON line per episode in "
                          "output_dir/episodes/ (multiagent_rl.data.sinks.load_episode_logs)."},
    )
    max_failed_steps: int = field(
        default=3,
        metadata={"help": "Stop when every episode of an env failed, or a stream its algorithms need got no "
                          "tokens, in this many consecutive steps."},
    )
    max_skipped_steps: int = field(
        default=3, metadata={"help": "Stop after this many consecutive steps skipped for a non-finite loss/gradient."}
    )
    entropy_coef_final: float | None = field(
        default=None,
        metadata={"help": "Anneal the entropy bonus: entropy_coef at entropy_anneal_start, this value from "
                          "entropy_anneal_end on, linear in between (None: a constant entropy_coef)."},
    )
    entropy_anneal_start: int = field(default=0, metadata={"help": "Step where the entropy annealing starts."})
    entropy_anneal_end: int | None = field(
        default=None, metadata={"help": "Step where the entropy bonus reaches entropy_coef_final (None: max_steps)."}
    )
    magnet_coef: float = field(
        default=0.0,
        metadata={"help": "Weight β of a KL pull toward a magnet policy, β · Σ KL(π_θ ‖ ρ) over the rl tokens / N_rl "
                          "(R-NaD-style regularisation; 0: off)."},
    )
    magnet_start: int = field(default=0, metadata={"help": "Step where the magnet term starts."})
    magnet_every: int | None = field(
        default=None,
        metadata={"help": "Every this many steps from magnet_start + magnet_every on, the magnet becomes a frozen "
                          "copy of the current policy; before that it is the uniform distribution over each token's "
                          "choices (the term is then an entropy bonus). None: the magnet stays uniform."},
    )
    skip_zero_advantage: bool = field(
        default=False,
        metadata={"help": "Leave zero-advantage samples out of the rl token count (default: count them, as TRL's "
                          "DAPO normaliser does, so the rl step does not grow when a group ties)."},
    )
    vllm_importance_sampling_mode: str = field(
        default="token_truncate",
        metadata={"help": "How the sampler/trainer mismatch is corrected when the policy backend's logprobs are not "
                          "the trainer's own (vLLM, a served policy): token_truncate (default: truncated importance "
                          "sampling per token, capped at vllm_importance_sampling_clip_max), token_mask, "
                          "sequence_truncate or sequence_mask, as in TRL."},
    )
    logging_steps: float = field(default=1, metadata={"help": "Log every N steps (TRL's default is 10)."})
    num_generations: int | None = field(default=2, metadata={"help": "Placeholder dataloader grouping; unused."})
    per_device_train_batch_size: int = field(default=2, metadata={"help": "Placeholder dataloader rows; unused."})
    max_completion_length: int | None = field(default=64, metadata={"help": "Default max new tokens per reply."})

    def __post_init__(self):
        if self.entropy_coef_final is not None:
            end = self.entropy_anneal_end if self.entropy_anneal_end is not None else self.max_steps
            if self.entropy_coef_final < 0 or end <= self.entropy_anneal_start:
                raise ValueError(f"entropy annealing: entropy_anneal_start={self.entropy_anneal_start}, "
                                 f"entropy_anneal_end={end} (None means max_steps), entropy_coef_final="
                                 f"{self.entropy_coef_final}: the end must come after the start, the value be >= 0")
        if self.episode_format not in ("parquet", "jsonl"):
            raise ValueError(f"episode_format={self.episode_format!r}: 'parquet' or 'jsonl'")
        if not torch.cuda.is_available():
            self.use_cpu = True
            self.bf16 = False
            self.fp16 = False
            # transformers 5 names it activation_checkpointing; clearing the old alias avoids its deprecation warning
            self.activation_checkpointing, self.gradient_checkpointing = False, None
        cap = os.environ.get(MAX_STEPS_ENV)
        if cap and self.max_steps > int(cap):
            logger.warning("%s=%s caps max_steps (was %d)", MAX_STEPS_ENV, cap, self.max_steps)
            self.max_steps = int(cap)
        if self.max_steps is None or self.max_steps <= 0:
            raise ValueError(
                "max_steps is required ([trainer] max_steps = N, or MixedAlgorithmConfig(max_steps=N)): the trainer's "
                "dataset is a placeholder, so without it a run would silently take 3 epochs of 1,024 rows"
            )
        if self.temperature <= 0:
            raise ValueError(
                f"temperature={self.temperature}: the policy is trained on its own samples, which needs temperature > 0 "
                "(greedy decoding is for evaluation; frozen seats may use 0)"
            )
        super().__post_init__()
        if self.beta != 0.0:
            raise ValueError(
                "MixedAlgorithmConfig.beta must be 0: for a KL anchor to a reference model use the `opd` algorithm "
                "with that model as teacher (the ref_kl stream)"
            )
        unsupported = {
            "loss_type": (self.loss_type, "dapo"),
            "importance_sampling_level": (self.importance_sampling_level, "token"),
            "top_entropy_quantile": (self.top_entropy_quantile, 1.0),
            "off_policy_mask_threshold": (self.off_policy_mask_threshold, None),
            "delta": (self.delta, None),
            "use_adaptive_entropy": (self.use_adaptive_entropy, False),
        }
        for name, (value, default) in unsupported.items():
            if value != default:
                raise ValueError(
                    f"MixedAlgorithmConfig.{name}={value!r} is not supported: the rl stream is TRL's clipped policy "
                    f"gradient with DAPO normalisation per stream; leave {name} at {default!r}"
                )
        if self.magnet_coef < 0 or (self.magnet_every is not None and self.magnet_every < 1) or self.magnet_start < 0:
            raise ValueError(f"magnet: magnet_coef={self.magnet_coef}, magnet_start={self.magnet_start}, magnet_every="
                             f"{self.magnet_every}: the weight and the start must be >= 0, the period >= 1 (or None)")
        for name in ("groups_per_step", "max_failed_steps", "max_skipped_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")

    def entropy_coef_at(self, step: int) -> float:
        """The entropy bonus at ``step``: ``entropy_coef``, or its linear anneal to ``entropy_coef_final``."""
        if self.entropy_coef_final is None:
            return self.entropy_coef
        start = self.entropy_anneal_start
        end = self.entropy_anneal_end if self.entropy_anneal_end is not None else self.max_steps
        frac = min(1.0, max(0.0, (step - start) / (end - start)))
        return self.entropy_coef + frac * (self.entropy_coef_final - self.entropy_coef)

    def magnet_coef_at(self, step: int) -> float:
        """The magnet term's weight at ``step``: ``magnet_coef`` from ``magnet_start`` on, else 0."""
        return self.magnet_coef if step >= self.magnet_start else 0.0

    def magnet_resets_at(self, step: int) -> bool:
        """Whether the magnet becomes a copy of the current policy at the start of ``step``."""
        if not self.magnet_coef or self.magnet_is_uniform_at(step):
            return False
        return (step - self.magnet_start) % self.magnet_every == 0

    def magnet_is_uniform_at(self, step: int) -> bool:
        """Whether the magnet at ``step`` is still the uniform distribution (no reset has happened yet)."""
        return self.magnet_every is None or step < self.magnet_start + self.magnet_every
