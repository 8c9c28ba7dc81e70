"""MixedAlgorithmTrainer: TRL's GRPOTrainer with environments in place of rollouts and three loss streams.

Per generation round each process plays ``groups_per_step`` task groups (environments drawn by
weight among those active at the step), every algorithm scores the episodes of the roles it owns,
and the collator turns the traces into tensors. The loss is

    L = Σ_c (Σ token losses of stream c) / N_c,    c ∈ {rl, ce, ref_kl}

with N_c the number of tokens stream c puts weight on over the whole generation batch on all
processes (one all-reduce), so a stream with many tokens never dilutes another's gradient. The rl
stream is TRL's clipped policy gradient (DAPO normalisation); with every sample tagged ``grpo`` it
equals ``GRPOTrainer``'s own loss. The trainer never branches on an algorithm's name.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
from collections import defaultdict
from dataclasses import dataclass, field

import torch
from accelerate.utils import gather_object
from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from .agent import AgentConfig, frozen_backend, make_agent
from .algorithms import Algorithm, AlgorithmContext, build_algorithm
from .backends import SamplingParams, TransformersBackend
from .collate import collate, trainable_samples
from .config import ExperimentConfig
from .env import play_episodes, run_sync
from .episode import Episode
from .models import load_model_and_tokenizer, resolve_model

logger = logging.getLogger(__name__)

ALGORITHM_STATE_FILE = "algorithms_state.json"


@dataclass
class MixedAlgorithmConfig(GRPOConfig):
    """TRL ``GRPOConfig`` plus the rollout settings of multi-agent training.

    Rollout size comes from ``groups_per_step`` × each environment's ``group_size``, not from
    ``per_device_train_batch_size``/``num_generations`` (those only size TRL's placeholder
    dataloader). On a machine without CUDA the GPU defaults are switched off automatically
    (fp32, no gradient checkpointing).
    """

    groups_per_step: int = field(default=4, metadata={"help": "Task groups each process plays per generation round."})
    max_concurrency: int = field(default=256, metadata={"help": "Most episodes in flight at once per process."})
    save_episodes: bool = field(
        default=True, metadata={"help": "Append every played episode (JSON lines) to output_dir/episodes/."}
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
        if self.groups_per_step < 1:
            raise ValueError(f"groups_per_step={self.groups_per_step} must be at least 1")


class WarmupLearningRate(TrainerCallback):
    """A higher learning rate during the sft warm-up: imitation from a random init needs it, self-play RL at
    that rate collapses to always bet/call. Set on the optimizer before each step; the scheduler's base
    rate takes over again afterwards."""

    def __init__(self, warmup_steps: int, lr: float):
        self.warmup_steps, self.lr = warmup_steps, lr

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        if state.global_step < self.warmup_steps and optimizer is not None:
            for group in optimizer.param_groups:
                group["lr"] = self.lr


def _rewards_come_from_environments(*args, **kwargs):
    raise RuntimeError("MixedAlgorithmTrainer takes rewards from environments; this placeholder is never called")


class MixedAlgorithmTrainer(GRPOTrainer):
    """Train one policy on a mix of multi-agent environments with per-env / per-role algorithms.

    >>> trainer = MixedAlgorithmTrainer({"algo": {"type": "rae"}, "env": [{"id": "kuhn_poker"}]})  # doctest: +SKIP
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
        self.agents: list[dict] = []
        self.trainable: list[dict[str, bool]] = []
        for spec, env in zip(experiment.env, self.envs):
            self._bind(spec, env)
        ctx = AlgorithmContext(
            policy_model=self.accelerator.unwrap_model(self.model), tokenizer=processing_class,
            load_model=self._load_teacher,
        )
        run_sync(_gather(*(a.setup(ctx) for a in self.algorithms.values())))
        self._rollout_rng = random.Random(args.seed * 1000 + self.accelerator.process_index)
        self.last_episodes: list[Episode] = []
        self.episodes_played = 0

    # -- building ---------------------------------------------------------------------------
    def _bind(self, spec, env) -> None:
        unknown = set(spec.roles) - set(env.roles)
        if unknown:
            raise ValueError(f"env {spec.id!r} has seats {list(env.roles)}; [env.roles] names unknown {sorted(unknown)}")
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
            )
            agents[role] = make_agent(agent_cfg, policy_backend=self.policy_backend, device=self.accelerator.device)
            trainable[role] = rc.is_trainable if rc else True
            if trainable[role]:
                algo_cfg = self.experiment.algorithm_for(spec, role)
                if algo_cfg.type == "sft" and model == "policy":
                    raise ValueError(
                        f"env {spec.id!r} seat {role!r} plays the policy but its algo is 'sft'; bind it in "
                        f"[env.roles.{role}] to a frozen model or scripted policy"
                    )
                key = algo_cfg.model_dump_json()
                if key not in self.algorithms:
                    self.algorithms[key] = build_algorithm(algo_cfg)
                assignment[key].add(role)
        env.setup(agents)
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
            for key, roles in self.assignments[ep.info["env_index"]].items():
                scoring.append(self.algorithms[key].score_episode(ep, roles))
        await asyncio.gather(*scoring)
        return episodes

    async def _play_group(self, i: int, task, group: str) -> list[Episode]:
        spec = self.experiment.env[i]
        episodes = await play_episodes(
            self.envs[i], [task], self.agents[i], group_size=spec.group_size, trainable=self.trainable[i],
            max_concurrency=self.args.max_concurrency, timeout=spec.timeout,
        )
        for k, ep in enumerate(episodes):
            ep.id, ep.group, ep.env = f"{group}-{k}", group, self.env_labels[i]
            ep.info["env_index"] = i
        return episodes

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
        self._save_episodes(local, step)

        batch = collate(trainable_samples(local), self.tokenizer.pad_token_id, multiple_of=self.args.steps_per_generation)
        device = self.accelerator.device
        batch = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}
        counts = torch.stack(
            [batch["rl_mask"].sum(), (batch["ce_weights"] != 0).sum().float(), (batch["ref_kl_weights"] != 0).sum().float()]
        )
        counts = self.accelerator.reduce(counts, reduction="sum")  # the one all-reduce of the token counts
        batch["num_rl_tokens"], batch["num_ce_tokens"], batch["num_ref_kl_tokens"] = counts[0], counts[1], counts[2]
        batch["num_items_in_batch"] = counts[0]
        if self.args.steps_per_generation > self.args.gradient_accumulation_steps or self.num_iterations > 1:
            # Several optimizer steps reuse this batch: freeze the logprobs of the policy that sampled it.
            with torch.no_grad():
                ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
                mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
                batch["old_per_token_logps"], _ = self._token_logps(self.model, ids, mask, batch)
        return batch

    # -- loss -------------------------------------------------------------------------------
    def _token_logps(self, model, input_ids, attention_mask, inputs, compute_entropy=False):
        """Log-probabilities (and entropies) of the completion tokens, as they were sampled.

        Without constrained choices in the batch this is TRL's own scoring (fused LM head). With
        them (``inputs["allowed_ids"]``), a constrained token is scored by the softmax over its
        allowed ids only, exactly as the harness sampled it, and its entropy is that of the
        restricted distribution. This path computes the model's logits over the completion and then
        scores only the positions some stream or metric reads (0 elsewhere): fine for game moves,
        heavier than TRL's fused head for long completions with a large vocabulary.
        """
        completion_ids, allowed_ids = inputs["completion_ids"], inputs.get("allowed_ids")
        T = completion_ids.size(1)
        if allowed_ids is None:
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
        logits = logits[:, :-1][read].float() / self.temperature  # (M, vocab): only the positions read
        tokens, allowed_ids = completion_ids[read], allowed_ids[read]
        full = torch.log_softmax(logits, dim=-1)
        logps = full.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
        allowed = allowed_ids >= 0
        constrained = allowed.any(-1)
        # Unconstrained positions keep finite dummy rows here (their results are discarded below):
        # an all -inf row would put NaN into the backward pass even where torch.where drops it.
        in_set = allowed | ~constrained.unsqueeze(-1)
        sub = logits.gather(-1, allowed_ids.clamp(min=0)).masked_fill(~in_set, float("-inf"))
        restricted = torch.log_softmax(sub, dim=-1)
        chosen = (allowed_ids == tokens.unsqueeze(-1)) & allowed
        logps = torch.where(constrained, restricted.masked_fill(~chosen, 0.0).sum(-1), logps)
        per_token = torch.zeros(read.shape, dtype=logps.dtype, device=logps.device)
        per_token = per_token.masked_scatter(read, logps)
        if not compute_entropy:
            return per_token, None
        full_entropy = -(full.exp() * full).sum(-1)
        restricted_entropy = -(restricted.exp() * restricted.masked_fill(~in_set, 0.0)).sum(-1)
        entropies = torch.zeros_like(per_token).masked_scatter(
            read, torch.where(constrained, restricted_entropy, full_entropy)
        )
        return per_token, entropies

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
        ref_advantage = (inputs["ref_logps"] - logps).detach()
        ref_tokens = -ratio * ref_advantage * inputs["ref_kl_weights"]
        streams = {
            "rl": (rl_tokens, normalizer(inputs["num_rl_tokens"])),
            "ce": (ce_tokens, normalizer(inputs["num_ce_tokens"])),
            "ref_kl": (ref_tokens, normalizer(inputs["num_ref_kl_tokens"])),
        }
        loss = sum(tokens.sum() / norm for tokens, norm in streams.values())
        if self.args.entropy_coef:
            # TRL's static entropy bonus, over the tokens the policy gradient acts on and normalised like
            # the rl stream (TRL averages per micro-batch instead): keeps self-play from collapsing early.
            loss = loss - self.args.entropy_coef * (entropies * inputs["rl_mask"]).sum() / streams["rl"][1]

        # Metrics, summed over all ranks in one all-reduce. The tags come from the config (the same list on
        # every rank), so per-algorithm losses are global numbers like loss/{stream}, not one rank's share.
        tags = sorted({algo.name for algo in self.algorithms.values()})
        rows = torch.tensor(
            [[a == tag for a in inputs["algorithm"]] for tag in tags], dtype=torch.float32, device=logps.device
        ).reshape(len(tags), len(inputs["algorithm"]))
        mask = inputs["completion_mask"] * inputs["action_mask"]
        ref_w = inputs["ref_kl_weights"]
        local = [rows.sum(1)]
        for tokens, _ in streams.values():
            per_row = tokens.detach().float().sum(1)
            local += [per_row.sum().reshape(1), rows @ per_row, rows @ tokens.detach().float().abs().sum(1)]
        extras = [(entropies * mask).sum(), mask.sum(), (-ref_advantage * ref_w).sum(), ref_w.sum()]
        local.append(torch.stack(extras).detach().float())
        totals = self.accelerator.reduce(torch.cat(local), reduction="sum")
        norms = torch.stack([norm for _, norm in streams.values()]).float().reshape(-1)
        values = torch.cat([totals, norms]).tolist()
        n = len(tags)
        present, i = values[:n], n
        metrics = self._metrics[mode]
        for s, name in enumerate(streams):
            denominator = values[-len(streams) + s] * world
            total, sums, abs_sums = values[i], values[i + 1 : i + 1 + n], values[i + 1 + n : i + 1 + 2 * n]
            i += 1 + 2 * n
            metrics[f"loss/{name}"].append(total / denominator)
            for t, tag in enumerate(tags):
                if present[t] and (name == "rl" or abs_sums[t] > 0):
                    metrics[f"loss/{name}/{tag}"].append(sums[t] / denominator)
        entropy_sum, mask_sum, ref_sum, ref_w_sum = values[i : i + 4]
        metrics["entropy"].append(entropy_sum / max(mask_sum, 1.0))
        if ref_w_sum > 0:
            metrics["ref_kl/sampled_reverse_kl"].append(ref_sum / ref_w_sum)
        return loss

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
                rewards = torch.tensor([t.reward for t in traces])
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
                    vals = [t.metrics[key] for t in traces if key in t.metrics]
                    metrics[f"{prefix}/{key}"].append(sum(vals) / len(vals))

    def _save_episodes(self, episodes: list[Episode], step: int) -> None:
        if not self.args.save_episodes or not self.args.output_dir:
            return
        folder = os.path.join(self.args.output_dir, "episodes")
        os.makedirs(folder, exist_ok=True)
        path = os.path.join(folder, f"rank{self.accelerator.process_index}.jsonl")
        with open(path, "a") as f:  # appended every step, so a crash loses nothing already played
            for ep in episodes:
                f.write(json.dumps({"step": step, **ep.to_dict()}) + "\n")

    def algorithm_state(self) -> dict:
        return {key: algo.state_dict() for key, algo in self.algorithms.items()}

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = os.path.join(self._get_output_dir(trial=trial), f"checkpoint-{self.state.global_step}")
        if self.accelerator.is_main_process and os.path.isdir(folder):
            with open(os.path.join(folder, ALGORITHM_STATE_FILE), "w") as f:
                json.dump(self.algorithm_state(), f)

    def _load_optimizer_and_scheduler(self, checkpoint):
        super()._load_optimizer_and_scheduler(checkpoint)
        path = os.path.join(checkpoint, ALGORITHM_STATE_FILE) if checkpoint else None
        if path and os.path.exists(path):
            with open(path) as f:
                for key, state in json.load(f).items():
                    if key in self.algorithms:
                        self.algorithms[key].load_state_dict(state)


async def _gather(*coros):
    return await asyncio.gather(*coros)


def _labels(experiment: ExperimentConfig) -> list[str]:
    """Metric/baseline label per env entry: its id, suffixed when the same id appears twice."""
    ids = [spec.name or spec.id for spec in experiment.env]
    return [i if ids.count(i) == 1 else f"{i}#{n}" for n, i in enumerate(ids)]


__all__ = ["MixedAlgorithmConfig", "MixedAlgorithmTrainer", "resolve_model"]
