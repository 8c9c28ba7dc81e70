"""MixedAlgorithmTrainer: TRL's GRPOTrainer with environments in place of rollouts and three loss streams.

Per generation round each process plays ``groups_per_step`` task groups (environments drawn by
weight among those active at the step), every algorithm scores the episodes of the roles it owns,
and the collator turns the traces into tensors. The loss is

    L = Σ_c (Σ token losses of stream c) / N_c,    c ∈ {rl, ce, ref_kl}

with N_c the number of tokens stream c puts weight on over the whole generation batch on all
processes (one all-reduce), so a stream with many tokens never dilutes another's gradient. The rl
stream is TRL's clipped policy gradient (DAPO normalisation); with every sample tagged ``grpo`` it
equals ``GRPOTrainer``'s own loss for any rewards. The trainer never branches on an algorithm's name.

A run guards itself: an episode with a non-finite or missing reward fails (it never reaches an
advantage), an optimizer step whose loss or gradient is not finite is skipped, and a run where an
environment's every episode fails or a required stream stays empty stops with the cause
(:mod:`multiagent_rl.health`). Checkpoints hold everything a resumed run needs to continue exactly
(the rollout random stream, the environments' samplers, the algorithms' state, stateful callbacks);
the first Ctrl-C finishes the current step, saves a checkpoint and raises :class:`TrainingInterrupted`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import signal
import math
import threading
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from transformers import TrainerCallback
from transformers.trainer_callback import PrinterCallback, ProgressCallback
from trl import GRPOConfig, GRPOTrainer

from .agent import AgentConfig, frozen_backend, make_agent
from .algorithms import Algorithm, AlgorithmContext, build_algorithm
from .backends import SamplingParams, TransformersBackend
from .collate import collate, trainable_samples
from .config import ExperimentConfig
from .console import ConsolePrinterCallback, ConsoleProgressCallback
from .env import DEFAULT_EPISODE_TIMEOUT, play_episodes, run_sync
from .episode import Episode
from .health import RunHealth, RunStopped
from .models import load_model_and_tokenizer, resolve_model
from .sinks import JsonlEpisodeSink

logger = logging.getLogger(__name__)

ALGORITHM_STATE_FILE = "algorithms_state.json"
ROLLOUT_STATE_FILE = "rollout_state_rank{rank}.json"
CALLBACK_STATE_FILE = "callbacks_state.json"
MAX_STEPS_ENV = "MULTIAGENT_RL_MAX_STEPS"
"""Environment variable that caps ``max_steps`` (smoke tests of docs, notebooks and recipes)."""


class TrainingInterrupted(KeyboardInterrupt):
    """Ctrl-C during ``train()``: the step in flight finished and a checkpoint was saved (``.checkpoint``)."""

    def __init__(self, message: str, checkpoint: str | None, step: int):
        super().__init__(message)
        self.checkpoint, self.step = checkpoint, step


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
        default=True, metadata={"help": "Append every played episode (JSON lines) to output_dir/episodes/."}
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
    logging_steps: float = field(default=1, metadata={"help": "Log every N steps (TRL's default is 10)."})
    num_generations: int | None = field(default=2, metadata={"help": "Placeholder dataloader grouping; unused."})
    per_device_train_batch_size: int = field(default=2, metadata={"help": "Placeholder dataloader rows; unused."})
    max_completion_length: int | None = field(default=64, metadata={"help": "Default max new tokens per reply."})

    def __post_init__(self):
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
        for name in ("groups_per_step", "max_failed_steps", "max_skipped_steps"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)} must be at least 1")


class WarmupLearningRate(TrainerCallback):
    """A different learning rate for the first ``warmup_steps`` steps (e.g. an sft warm-up phase before RL).

    Set on the optimizer before each of those steps; the scheduler's rate takes over afterwards.
    """

    def __init__(self, warmup_steps: int, lr: float):
        self.warmup_steps, self.lr = warmup_steps, lr

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        if state.global_step < self.warmup_steps and optimizer is not None:
            for group in optimizer.param_groups:
                group["lr"] = self.lr


class _RunGuards(TrainerCallback):
    """Skip optimizer steps with a non-finite loss or gradient; stop at step end after Ctrl-C."""

    def __init__(self, trainer: MixedAlgorithmTrainer):
        self.trainer = trainer

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        trainer = self.trainer
        params = [(n, p) for n, p in trainer.model.named_parameters() if p.grad is not None]
        finite = torch.stack([torch.isfinite(p.grad).all() for _, p in params]).all().item() if params else True
        cause = ""
        if trainer._nonfinite_loss:
            cause = f"the loss was not finite ({', '.join(sorted(trainer._nonfinite_loss))})"
        elif not finite:
            bad = [n for n, p in params if not torch.isfinite(p.grad).all()]
            cause = f"the gradient was not finite ({bad[0]}" + (f" and {len(bad) - 1} more)" if len(bad) > 1 else ")")
        trainer._nonfinite_loss.clear()
        if trainer.health.after_gradient(not cause, cause):
            for _, p in trainer.model.named_parameters():
                p.grad = None  # an optimizer skips parameters without a gradient: no update, no moment change

    def on_step_end(self, args, state, control, **kwargs):
        trainer = self.trainer
        flag = torch.tensor(float(trainer._interrupt_requested), device=trainer.accelerator.device)
        if trainer.accelerator.num_processes > 1:  # every rank stops at the same step
            flag = trainer.accelerator.reduce(flag, reduction="sum")
        if flag.item() > 0:
            trainer._interrupt_requested = True
            control.should_save = True
            control.should_training_stop = True
        return control


def _rewards_come_from_environments(*args, **kwargs):
    raise RuntimeError("MixedAlgorithmTrainer takes rewards from environments; this placeholder is never called")


class MixedAlgorithmTrainer(GRPOTrainer):
    """Train one policy on a mix of multi-agent environments with per-env / per-role algorithms.

    >>> trainer = MixedAlgorithmTrainer({"algo": {"type": "rae"}, "env": [{"id": "kuhn_poker"}],
    ...                                  "trainer": {"max_steps": 10}})  # doctest: +SKIP
    >>> trainer.train()  # doctest: +SKIP
    """

    def __init__(
        self,
        config: ExperimentConfig | dict,
        args: MixedAlgorithmConfig | None = None,
        model=None,
        processing_class=None,
        callbacks=None,
    ):
        experiment = config if isinstance(config, ExperimentConfig) else ExperimentConfig.model_validate(config)
        if args is None:
            args = MixedAlgorithmConfig(**{"output_dir": "outputs/mixed", **experiment.trainer})
        if model is None:
            model, tok = load_model_and_tokenizer(experiment.model.name, device="cpu" if args.use_cpu else None)
            processing_class = processing_class or tok
        elif processing_class is None:
            raise ValueError("Pass processing_class (the tokenizer) together with a model object")
        peft_config = None
        if experiment.model.lora is not None:
            from peft import LoraConfig

            peft_config = LoraConfig(task_type="CAUSAL_LM", **experiment.model.lora)
        placeholder = Dataset.from_dict({"prompt": [""] * 1024})
        super().__init__(
            model=model,
            reward_funcs=_rewards_come_from_environments,
            args=args,
            train_dataset=placeholder,
            processing_class=processing_class,
            callbacks=callbacks,
            peft_config=peft_config,
        )
        if self.pop_callback(ProgressCallback) is not None:
            self.add_callback(ConsoleProgressCallback)
        if self.pop_callback(PrinterCallback) is not None:
            self.add_callback(ConsolePrinterCallback)
        self.add_callback(_RunGuards(self))
        self.experiment = experiment
        self.tokenizer = processing_class
        self.envs = [spec.build() for spec in experiment.env]
        self.env_labels = _labels(experiment)
        self.policy_backend = TransformersBackend(
            self.accelerator.unwrap_model(self.model), processing_class, model_id="policy",
            max_batch_size=args.max_concurrency,
        )
        self.algorithms: dict[str, Algorithm] = {}
        self.assignments: list[dict[str, set[str]]] = []  # per env: algorithm key -> roles it scores
        self.required_streams: dict[str, dict[str, list[str]]] = {}  # env label -> stream -> who needs it
        self.agents: list[dict] = []
        self.trainable: list[dict[str, bool]] = []
        for i, (spec, env) in enumerate(zip(experiment.env, self.envs)):
            self._bind(i, spec, env)
        self._streams_of_tag: dict[str, set[str]] = defaultdict(set)
        for algo in self.algorithms.values():
            self._streams_of_tag[algo.name] |= set(algo.loss_types)
        ctx = AlgorithmContext(
            policy_model=self.accelerator.unwrap_model(self.model), tokenizer=processing_class,
            load_model=self._load_teacher,
        )
        run_sync(_gather(*(a.setup(ctx) for a in self.algorithms.values())))
        self._rollout_rng = random.Random(args.seed * 1000 + self.accelerator.process_index)
        self.health = RunHealth(args.max_failed_steps, args.max_skipped_steps)
        self.episode_sink = (
            JsonlEpisodeSink(os.path.join(args.output_dir, "episodes"), self.accelerator.process_index)
            if args.save_episodes and args.output_dir else None
        )
        self.last_episodes: list[Episode] = []
        self.episodes_played = 0
        self._step_tags: list[str] = []
        self._nonfinite_loss: set[str] = set()
        self._interrupt_requested = False
        self._resumed = False

    # -- building ---------------------------------------------------------------------------
    def _bind(self, index: int, spec, env) -> None:
        self.experiment.check_env_seats(index, env.roles)
        base = SamplingParams(
            temperature=self.args.temperature, top_p=self.args.top_p, max_new_tokens=self.args.max_completion_length
        )
        agents, trainable, assignment = {}, {}, defaultdict(set)
        for role in env.roles:
            rc = spec.roles.get(role)
            model = rc.model if rc else "policy"
            agent_cfg = AgentConfig(
                model=model,
                sampling=base.with_overrides(**(rc.sampling if rc else {})),
                policy=rc.scripted_policy() if rc and rc.model == "scripted" else None,
                timeout=rc.timeout if rc else None,
            )
            agents[role] = make_agent(agent_cfg, policy_backend=self.policy_backend, device=self.accelerator.device)
            trainable[role] = rc.is_trainable if rc else True
            if trainable[role]:
                algo_cfg = self.experiment.algorithm_for(spec, role)
                key = algo_cfg.model_dump_json()
                if key not in self.algorithms:
                    self.algorithms[key] = build_algorithm(algo_cfg)
                assignment[key].add(role)
        env.setup(agents)
        label = self.env_labels[index]
        required: dict[str, list[str]] = defaultdict(list)
        for key, roles in assignment.items():
            algo = self.algorithms[key]
            for stream in algo.streams_required():
                required[stream].append(f"{'/'.join(sorted(roles))} ({algo.name})")
        self.required_streams[label] = dict(required)
        self.agents.append(agents)
        self.trainable.append(trainable)
        self.assignments.append(dict(assignment))

    def _load_teacher(self, model_id: str):
        """Frozen teachers share the frozen seats' cache: a model named twice is loaded once."""
        return frozen_backend(model_id, self.accelerator.device).model

    # -- rollout ----------------------------------------------------------------------------
    async def _rollout(self, step: int) -> list[Episode]:
        specs = self.experiment.env
        active = [i for i, s in enumerate(specs) if s.active(step)]
        if not active:
            raise RuntimeError(f"no environment is active at step {step}: check start_step/stop_step")
        picks = self._rollout_rng.choices(active, weights=[specs[i].weight for i in active], k=self.args.groups_per_step)
        rank = self.accelerator.process_index
        jobs = []
        for g, i in enumerate(picks):
            (task,) = self.envs[i].sample_tasks(1, self._rollout_rng)
            jobs.append(self._play_group(i, task, f"s{step}-r{rank}-g{g}"))
        episodes = [ep for group in await asyncio.gather(*jobs) for ep in group]
        scoring = []
        for ep in episodes:
            self._check_episode(ep)
            for key, roles in self.assignments[ep.info["env_index"]].items():
                scoring.append(self.algorithms[key].score_episode(ep, roles))
        await asyncio.gather(*scoring)
        return episodes

    async def _play_group(self, i: int, task, group: str) -> list[Episode]:
        spec = self.experiment.env[i]
        episodes = await play_episodes(
            self.envs[i], [task], self.agents[i], group_size=spec.group_size, trainable=self.trainable[i],
            max_concurrency=self.args.max_concurrency, groups=[group], seed=str(self.args.seed),
            timeout=DEFAULT_EPISODE_TIMEOUT if spec.timeout is None else spec.timeout, name=self.env_labels[i],
        )
        for ep in episodes:
            ep.info["env_index"] = i
        return episodes

    def _check_episode(self, episode: Episode) -> None:
        """Fail an episode whose trained traces an algorithm cannot use (no reward, out of range, too long)."""
        if not episode.ok:
            return
        problems = []
        limit = self.policy_backend.max_context
        for key, roles in self.assignments[episode.info["env_index"]].items():
            algo = self.algorithms[key]
            for trace in episode.traces:
                if trace.trainable and trace.agent in roles:
                    if problem := algo.reward_problem(trace):
                        problems.append(problem)
                    if limit is not None and len(trace.token_ids) > limit:
                        problems.append(f"role {trace.agent!r}: trace of {len(trace.token_ids)} tokens exceeds the "
                                        f"policy's context of {limit} positions")
        if problems:
            episode.ok = False
            episode.errors.append(f"env {episode.env!r}: " + "; ".join(problems))

    def _generate_and_score_completions(self, inputs):
        step = self.state.global_step
        local = run_sync(self._rollout(step))
        everyone = local
        if self.accelerator.num_processes > 1:
            # Group credit (and RAE's baselines) see every process's episodes, in rank order, so the
            # state they update is identical everywhere; each process then trains its own traces.
            counts = gather_object([len(local)])
            everyone = gather_object(local)
            start = sum(counts[: self.accelerator.process_index])
            local = everyone[start : start + len(local)]
        groups: dict[str, list[Episode]] = defaultdict(list)
        for ep in everyone:
            groups[ep.group].append(ep)
        for group in groups.values():
            for key, roles in self.assignments[group[0].info["env_index"]].items():
                self.algorithms[key].score_group(group, roles)
        self.last_episodes = local
        self.episodes_played += len(everyone)
        self._log_rollout(everyone)
        if self.episode_sink is not None:
            self.episode_sink.write(local, step)
        self.health.after_rollout(everyone, self.required_streams)
        self._step_tags = sorted({t.streams.algorithm for ep in everyone if ep.ok for t in ep.traces
                                  if t.trainable and t.streams is not None})

        batch = collate(
            trainable_samples(local, self.args.skip_zero_advantage), self.tokenizer.pad_token_id,
            multiple_of=self.args.steps_per_generation, temperature=self.temperature,
            skip_zero_advantage=self.args.skip_zero_advantage,
        )
        device = self.accelerator.device
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        mask = batch["completion_mask"].float()
        counts = torch.stack([
            batch["rl_mask"].sum(), (batch["ce_weights"] != 0).sum().float(), (batch["ref_kl_weights"] != 0).sum().float(),
            (batch["action_mask"] * mask).sum(),
        ])
        counts = self.accelerator.reduce(counts, reduction="sum")  # the one all-reduce of the token counts
        batch["num_rl_tokens"], batch["num_ce_tokens"], batch["num_ref_kl_tokens"] = counts[0], counts[1], counts[2]
        batch["num_action_tokens"] = counts[3]
        batch["num_items_in_batch"] = counts[0]
        if self.args.steps_per_generation > self.args.gradient_accumulation_steps or self.num_iterations > 1:
            # Several optimizer steps reuse this batch: freeze the logprobs of the policy that sampled it.
            with torch.no_grad():
                ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
                attention = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
                batch["old_per_token_logps"], _ = self._token_logps(self.model, ids, attention, batch)
        return batch

    # -- loss -------------------------------------------------------------------------------
    def _token_logps(self, model, input_ids, attention_mask, inputs, compute_entropy=False):
        """Log-probabilities (and entropies) of the completion tokens, as they were sampled.

        Each token is scored at the temperature it was sampled at (``inputs["temperatures"]``) and,
        when a harness constrained it to choices (``inputs["allowed_ids"]``), by the softmax over its
        allowed ids only, with the entropy of that restricted distribution. When every token has the
        trainer's temperature and none is constrained this is TRL's own scoring (fused LM head).
        Otherwise the model's logits are computed over the completion and only the positions some
        stream or metric reads are scored (0 elsewhere).
        """
        completion_ids, allowed_ids = inputs["completion_ids"], inputs.get("allowed_ids")
        temperatures = inputs.get("temperatures")
        T = completion_ids.size(1)
        if allowed_ids is None and (temperatures is None or bool((temperatures == self.temperature).all())):
            logps, entropies, _ = self._get_per_token_logps_and_entropies(
                model, input_ids, attention_mask, T, compute_entropy=compute_entropy
            )
            return logps, entropies
        with self.accelerator.autocast():
            logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=T + 1).logits
        read = inputs["completion_mask"].bool() & (
            (inputs["action_mask"] != 0) | (inputs["rl_mask"] != 0) | (inputs["ce_weights"] != 0)
            | (inputs["ref_kl_weights"] != 0)
        )
        scale = temperatures[read].unsqueeze(-1) if temperatures is not None else self.temperature
        logits = logits[:, :-1][read].float() / scale  # (M, vocab): only the positions read
        tokens = completion_ids[read]
        full = torch.log_softmax(logits, dim=-1)
        logps = full.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        entropy = -(full.exp() * full).sum(-1) if compute_entropy else None
        if allowed_ids is not None:
            allowed_ids = allowed_ids[read]
            allowed = allowed_ids >= 0
            constrained = allowed.any(-1)
            # Unconstrained positions keep finite dummy rows here (their results are discarded below):
            # an all -inf row would put NaN into the backward pass even where torch.where drops it.
            in_set = allowed | ~constrained.unsqueeze(-1)
            sub = logits.gather(-1, allowed_ids.clamp(min=0)).masked_fill(~in_set, float("-inf"))
            restricted = torch.log_softmax(sub, dim=-1)
            chosen = (allowed_ids == tokens.unsqueeze(-1)) & allowed
            logps = torch.where(constrained, restricted.masked_fill(~chosen, 0.0).sum(-1), logps)
            if compute_entropy:
                restricted_entropy = -(restricted.exp() * restricted.masked_fill(~in_set, 0.0)).sum(-1)
                entropy = torch.where(constrained, restricted_entropy, entropy)
        per_token = torch.zeros(read.shape, dtype=logps.dtype, device=logps.device).masked_scatter(read, logps)
        if not compute_entropy:
            return per_token, None
        return per_token, torch.zeros_like(per_token).masked_scatter(read, entropy)

    def _compute_loss(self, model, inputs):
        prompt_ids, completion_ids = inputs["prompt_ids"], inputs["completion_ids"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([inputs["prompt_mask"], inputs["completion_mask"]], dim=1)
        logps, entropies = self._token_logps(model, input_ids, attention_mask, inputs, compute_entropy=True)
        mode = "train" if self.model.training else "eval"
        # Token counts span the generation batch on all ranks; rescale to one accumulation window and
        # undo DDP's gradient averaging, exactly as TRL does for its DAPO loss.
        window = self.current_gradient_accumulation_steps / self.args.steps_per_generation if mode == "train" else 1.0
        world = self.accelerator.num_processes

        def normalizer(count):
            return count.clamp(min=1.0) / world * window

        old = inputs.get("old_per_token_logps")
        old = logps.detach() if old is None else old
        ratio = torch.exp(logps - old)
        advantages = inputs["advantages"]
        clipped = torch.clamp(ratio, 1 - self.epsilon_low, 1 + self.epsilon_high)
        rl_tokens = -torch.min(ratio * advantages, clipped * advantages) * inputs["rl_mask"]
        ce_tokens = -logps * inputs["ce_weights"]
        # Sampled-token reverse KL to the teacher in policy-gradient form: per-token advantage
        # log π_T − log π_θ (detached), so its gradient is zero when the teacher equals the student.
        ref_weights = inputs["ref_kl_weights"]
        ref_advantage = torch.where(ref_weights != 0, inputs["ref_logps"] - logps, 0.0).detach()
        ref_tokens = -ratio * ref_advantage * ref_weights
        streams = {
            "rl": (rl_tokens, inputs["num_rl_tokens"]),
            "ce": (ce_tokens, inputs["num_ce_tokens"]),
            "ref_kl": (ref_tokens, inputs["num_ref_kl_tokens"]),
        }
        loss = sum(tokens.sum() / normalizer(count) for tokens, count in streams.values())
        if self.args.entropy_coef:
            # TRL's static entropy bonus, over the tokens the policy gradient acts on and normalised like
            # the rl stream (TRL averages per micro-batch instead): keeps self-play from collapsing early.
            loss = loss - self.args.entropy_coef * (entropies * inputs["rl_mask"]).sum() / normalizer(
                inputs["num_rl_tokens"])
        self._log_loss_metrics(mode, inputs, streams, entropies, ratio, ref_advantage, window)
        return loss

    def _log_loss_metrics(self, mode, inputs, streams, entropies, ratio, ref_advantage, window) -> None:
        """Per-stream and per-algorithm losses, entropy, reverse KL and clip ratios, summed over all ranks in one
        all-reduce and built and read by name. Each value is this micro-batch's share of the step's total, times the
        number of micro-batches per step, so the logged mean over a step's micro-batches is the step's value:
        identical for any gradient accumulation (when steps_per_generation equals it, TRL's default)."""
        rl_mask, action = inputs["rl_mask"], inputs["completion_mask"] * inputs["action_mask"]
        advantages = inputs["advantages"]
        low = (ratio < 1 - self.epsilon_low) & (advantages < 0)
        high = (ratio > 1 + self.epsilon_high) & (advantages > 0)
        sums: dict[str, torch.Tensor] = {}
        counts: dict[str, torch.Tensor] = {}
        tags = self._step_tags
        tag_of_row = inputs["algorithm"]
        for name, (tokens, count) in streams.items():
            per_row = tokens.detach().float().sum(1)
            sums[f"loss/{name}"], counts[f"loss/{name}"] = per_row.sum(), count
            for tag in tags:
                if name not in self._streams_of_tag[tag]:
                    continue  # per-algorithm losses only for the streams an algorithm writes
                rows = torch.tensor([a == tag for a in tag_of_row], dtype=per_row.dtype, device=per_row.device)
                sums[f"loss/{name}/{tag}"], counts[f"loss/{name}/{tag}"] = (rows * per_row).sum(), count
        sums["entropy"], counts["entropy"] = (entropies.detach() * action).sum(), inputs["num_action_tokens"]
        if inputs["num_ref_kl_tokens"] > 0:
            sums["ref_kl/sampled_reverse_kl"] = (-ref_advantage * inputs["ref_kl_weights"]).sum()
            counts["ref_kl/sampled_reverse_kl"] = inputs["num_ref_kl_tokens"]
        if inputs["num_rl_tokens"] > 0:
            for name, hit in (("low_mean", low), ("high_mean", high), ("region_mean", low | high)):
                sums[f"clip_ratio/{name}"], counts[f"clip_ratio/{name}"] = (hit.float() * rl_mask).sum(), inputs[
                    "num_rl_tokens"]
        names = list(sums)
        totals = self.accelerator.reduce(torch.stack([sums[n].float() for n in names]), reduction="sum").tolist()
        denominators = torch.stack([counts[n].float() for n in names]).clamp(min=1.0).tolist()
        per_step = self.current_gradient_accumulation_steps if mode == "train" else 1
        metrics = self._metrics[mode]
        for name, total, count in zip(names, totals, denominators):
            if name.startswith("loss/") and not math.isfinite(total):
                self._nonfinite_loss.add(name.split("/")[1])
            metrics[name].append(total / (count * window) * per_step)

    # -- metrics, traces, checkpoints --------------------------------------------------------
    def _log_rollout(self, episodes: list[Episode]) -> None:
        metrics = self._metrics["train"]
        per_env: dict[str, list[Episode]] = defaultdict(list)
        for ep in episodes:
            per_env[ep.env].append(ep)
        for env, eps in per_env.items():
            metrics[f"{env}/failed_episodes"].append(float(sum(not e.ok for e in eps)))
            by_key = defaultdict(list)
            for ep in eps:
                if ep.ok:
                    for t in ep.traces:
                        by_key[(t.streams.algorithm if t.streams else "untrained", t.agent)].append(t)
            for (algo, role), traces in by_key.items():
                prefix = f"{env}/{role}/{algo}"
                rewards = torch.tensor([t.reward for t in traces], dtype=torch.float64)
                metrics[f"{prefix}/reward_mean"].append(rewards.mean().item())
                metrics[f"{prefix}/reward_std"].append(rewards.std(unbiased=False).item())
                for name in ("rl", "ce", "ref_kl"):
                    values = [w for t in traces if t.streams and getattr(t.streams, name) for w in getattr(t.streams, name)]
                    nonzero = [w for w in values if w != 0]
                    metrics[f"{prefix}/tokens_{name}"].append(float(len(nonzero)))
                    if name == "rl" and nonzero:
                        adv = torch.tensor(nonzero)
                        metrics[f"{prefix}/advantage_mean"].append(adv.mean().item())
                        metrics[f"{prefix}/advantage_std"].append(adv.std(unbiased=False).item())
                for key in sorted({k for t in traces for k in t.metrics}):
                    vals = [float(t.metrics[key]) for t in traces if key in t.metrics]
                    metrics[f"{prefix}/{key}"].append(sum(vals) / len(vals))

    def record_metric(self, name: str, value: float) -> None:
        """Add a value to the next log (e.g. ``eval/...`` from an evaluation callback; printed on the console line)."""
        self._metrics["train"][name].append(float(value))

    def log(self, logs: dict[str, float], start_time: float | None = None) -> None:
        logs["episodes"] = self.episodes_played
        if self.health.total_skipped:
            logs["health/skipped_steps"] = self.health.total_skipped
        super().log(logs, start_time)

    def algorithm_state(self) -> dict:
        return {key: algo.state_dict() for key, algo in self.algorithms.items()}

    def rollout_state(self) -> dict:
        """This process's rollout state: its random stream, the environments' samplers, episodes played."""
        version, internal, gauss = self._rollout_rng.getstate()
        return {
            "rng": [version, list(internal), gauss],
            "episodes_played": self.episodes_played,
            "envs": {label: env.state_dict() for label, env in zip(self.env_labels, self.envs)},
        }

    def load_rollout_state(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self._rollout_rng.setstate((version, tuple(internal), gauss))
        self.episodes_played = state["episodes_played"]
        for label, env in zip(self.env_labels, self.envs):
            env.load_state_dict(state["envs"].get(label, {}))

    def _stateful_callbacks(self) -> dict[str, TrainerCallback]:
        return {type(cb).__name__: cb for cb in self.callback_handler.callbacks
                if hasattr(cb, "state_dict") and hasattr(cb, "load_state_dict")}

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        if not os.path.isdir(folder):
            return
        rank = self.accelerator.process_index
        _write_json(os.path.join(folder, ROLLOUT_STATE_FILE.format(rank=rank)), self.rollout_state())
        if self.accelerator.is_main_process:
            _write_json(os.path.join(folder, ALGORITHM_STATE_FILE), self.algorithm_state())
            _write_json(os.path.join(folder, CALLBACK_STATE_FILE),
                        {name: cb.state_dict() for name, cb in self._stateful_callbacks().items()})

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        if not checkpoint:
            return
        self._resumed = True
        path = os.path.join(checkpoint, ALGORITHM_STATE_FILE)
        if os.path.exists(path):
            with open(path) as f:
                for key, state in json.load(f).items():
                    if key in self.algorithms:
                        self.algorithms[key].load_state_dict(state)
        path = os.path.join(checkpoint, ROLLOUT_STATE_FILE.format(rank=self.accelerator.process_index))
        if os.path.exists(path):
            with open(path) as f:
                self.load_rollout_state(json.load(f))
        else:
            logger.warning("%s has no rollout state: task sampling restarts from the seed", checkpoint)
        path = os.path.join(checkpoint, CALLBACK_STATE_FILE)
        if os.path.exists(path):
            with open(path) as f:
                saved = json.load(f)
            for name, cb in self._stateful_callbacks().items():
                if name in saved:
                    cb.load_state_dict(saved[name])
        if self.episode_sink is not None:
            self.episode_sink.resume(self.state.global_step)  # the steps about to be replayed are logged again

    def train(self, resume_from_checkpoint: str | bool | None = None, **kwargs):
        """TRL's ``train()``, plus: the first Ctrl-C finishes the step in flight, saves a checkpoint and raises
        :class:`TrainingInterrupted` (a second one stops at once); a run stopped by its health checks
        (:class:`~multiagent_rl.health.RunStopped`) saves a checkpoint first."""
        if self.episode_sink is not None and not resume_from_checkpoint:
            self.episode_sink.resume(0)  # a fresh run in this folder starts a fresh log (the old one is kept aside)
        self._interrupt_requested = False
        previous = None
        if threading.current_thread() is threading.main_thread():
            previous = signal.signal(signal.SIGINT, self._on_sigint)
        try:
            output = super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)
        except RunStopped as exc:
            folder = self._save_now()
            raise RunStopped(f"{exc}\nThe weights after step {self.state.global_step} are saved in {folder}.") from None
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        if self._interrupt_requested:
            folder = self._checkpoint_folder()
            message = (f"interrupted at step {self.state.global_step}: checkpoint saved in {folder}; resume with "
                       "train(resume_from_checkpoint=True) (recipes: --resume)")
            raise TrainingInterrupted(message, folder, self.state.global_step)
        return output

    def _on_sigint(self, signum, frame):
        if self._interrupt_requested:  # the second Ctrl-C: stop now
            signal.default_int_handler(signum, frame)
        self._interrupt_requested = True
        if self.accelerator.is_main_process:
            print("\nCtrl-C: finishing this step, then saving a checkpoint (press again to stop at once)", flush=True)

    def _checkpoint_folder(self) -> str:
        return os.path.join(self.args.output_dir, f"checkpoint-{self.state.global_step}")

    def _save_now(self) -> str:
        folder = self._checkpoint_folder()
        if not os.path.isdir(folder):
            self._save_checkpoint(self.model_wrapped, trial=None)
        return folder


def _write_json(path: str, data) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.replace(tmp, path)


async def _gather(*coros):
    return await asyncio.gather(*coros)


def _labels(experiment: ExperimentConfig) -> list[str]:
    """Metric/baseline label per env entry: its ``name`` or id, suffixed when the same label appears twice."""
    ids = [spec.name or spec.id for spec in experiment.env]
    return [i if ids.count(i) == 1 else f"{i}#{n}" for n, i in enumerate(ids)]


__all__ = ["MixedAlgorithmConfig", "MixedAlgorithmTrainer", "TrainingInterrupted", "WarmupLearningRate",
           "resolve_model"]
