"""``MixedAlgorithmConfig``: TRL's ``GRPOConfig`` plus the settings of multi-agent rollouts and run guards.

Checked when built: ``max_steps`` is required (the trainer's dataset is a placeholder), the
temperature must be positive (the policy is trained on its samples), and TRL loss variants the
three-stream loss does not implement are refused. On a machine without CUDA the GPU defaults are
switched off (fp32, no gradient checkpointing).
"""

from __future__ import annotations

import difflib
import functools
import logging
import os
import typing
from dataclasses import dataclass, field
from typing import Any

import torch
from pydantic import TypeAdapter, ValidationError
from trl import GRPOConfig

from ..backends.base import check_trained_temperature

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
    async_rollouts: int = field(
        default=0,
        metadata={"help": "Play up to this many steps ahead of training, in a background thread, so that step k + 1's "
                          "episodes are sampled while step k trains: each batch is at most this many optimizer steps "
                          "off-policy, corrected by truncated importance sampling (vllm_importance_sampling_*). "
                          "0: on-policy (multiagent_rl.training.rollouts_ahead)."},
    )
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
        if self.entropy_coef:
            raise ValueError(f"entropy_coef={self.entropy_coef}: the entropy bonus is a regulariser here, "
                             f"[[regulariser]] type = 'entropy', coef = {self.entropy_coef} (with an optional schedule: "
                             "final, anneal_start, anneal_end); see multiagent_rl.training.regularisers")
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
        check_trained_temperature(self.temperature, "temperature")
        if self.async_rollouts < 0:
            raise ValueError(f"async_rollouts={self.async_rollouts}: the most steps rollouts may run ahead, >= 0")
        super().__post_init__()
        one_rollout_per_step = self.num_iterations == 1 and self.steps_per_generation == self.gradient_accumulation_steps
        if self.async_rollouts and not one_rollout_per_step:
            raise ValueError(f"async_rollouts={self.async_rollouts} plays one rollout per optimizer step: leave "
                             "num_iterations at 1 and steps_per_generation at gradient_accumulation_steps")
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
        for name in ("groups_per_step", "max_failed_steps", "max_skipped_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")


@functools.lru_cache(maxsize=1)
def _trainer_fields() -> dict[str, Any]:
    return typing.get_type_hints(MixedAlgorithmConfig)


@functools.lru_cache(maxsize=None)
def _adapter(key: str) -> TypeAdapter | None:
    try:
        return TypeAdapter(_trainer_fields()[key])
    except Exception:  # an annotation pydantic cannot check: leave it to TRL
        return None


def check_trainer_field(key: str, value: Any) -> None:
    """Raise a ValueError naming ``[trainer] key`` when it is not a field of ``MixedAlgorithmConfig`` or has the
    wrong type (strictly: ``"1e-4"`` is not a float)."""
    fields = _trainer_fields()
    if key not in fields:
        close = difflib.get_close_matches(key, list(fields), n=3)
        hint = f"; did you mean {', '.join(map(repr, close))}?" if close else ""
        raise ValueError(f"[trainer] {key!r} is not a field of MixedAlgorithmConfig (a TRL GRPOConfig){hint}")
    adapter = _adapter(key)
    if adapter is None:
        return
    try:
        adapter.validate_python(value, strict=True)
    except ValidationError:
        raise ValueError(
            f"[trainer] {key} = {value!r} ({type(value).__name__}) is not a valid {fields[key]}; "
            "write numbers without quotes"
        ) from None
