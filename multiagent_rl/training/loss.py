"""The loss: one table of streams, pure functions from log-probabilities and a batch to a loss and metrics.

Each row of the stream table ([`STREAMS`][multiagent_rl.episodes.streams.STREAMS]) says where a stream's per-token
weights live on a trace, under which batch keys the collator puts them and their token-count mask, and which function
here computes its token loss. The loss is

    L = Σ_c (Σ_t loss_c,t) / N_c          N_c = Σ mask_c over the whole generation batch, all processes

so a stream with many tokens (ECHO's observations) never dilutes another's gradient. Adding a
stream is one ``register_stream`` call; the collator, the trainer, the records and the metrics read the
table. With every sample a ``grpo`` sample the loss equals TRL's ``GRPOTrainer`` loss (DAPO, β=0).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..episodes.streams import STREAMS


@dataclass(frozen=True)
class StreamInputs:
    """What a stream's per-token loss may read (all (B, T) tensors over the completion)."""

    logps: torch.Tensor
    """Log-probabilities of the completion tokens under the policy being trained."""
    ratio: torch.Tensor
    """exp(logps − old logps): the importance ratio against the policy that sampled the batch."""
    batch: dict
    epsilon_low: float
    epsilon_high: float


def _sampler_weights(x: StreamInputs) -> torch.Tensor | float:
    """Importance weights for the sampler/trainer mismatch (1 when the sampler is the trainer's own model)."""
    return x.batch.get("importance_weights", 1.0)


def policy_gradient(x: StreamInputs) -> torch.Tensor:
    """The rl stream: PPO's clipped policy gradient, weighted by the per-token advantage."""
    advantages = x.batch["advantages"]
    clipped = torch.clamp(x.ratio, 1 - x.epsilon_low, 1 + x.epsilon_high)
    return -torch.min(x.ratio * advantages, clipped * advantages) * x.batch["rl_mask"] * _sampler_weights(x)


def cross_entropy(x: StreamInputs) -> torch.Tensor:
    """The ce stream: −w · log π."""
    return -x.logps * x.batch["ce_weights"]


def reference_advantage(x: StreamInputs) -> torch.Tensor:
    """log π_T − log π_θ (detached) where the ref_kl stream has weight, 0 elsewhere."""
    weights = x.batch["ref_kl_weights"]
    return torch.where(weights != 0, x.batch["ref_logprobs"] - x.logps, 0.0).detach()


def reverse_kl(x: StreamInputs) -> torch.Tensor:
    """The ref_kl stream: the sampled-token reverse KL toward the teacher's logprobs."""
    # Sampled-token reverse KL to the teacher in policy-gradient form: its gradient is zero when the
    # teacher equals the student.
    return -x.ratio * reference_advantage(x) * x.batch["ref_kl_weights"] * _sampler_weights(x)


def token_logprobs_from_logits(
    logits: torch.Tensor, tokens: torch.Tensor, temperatures: torch.Tensor | float,
    allowed_ids: torch.Tensor | None = None, with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities (and entropies) of ``tokens`` (M,) from the ``logits`` (M, V) that predicted them.

    Each row is read at its temperature and, where ``allowed_ids`` (M, K; -1-padded, all -1 = the
    whole vocabulary) constrains it, by the softmax over its allowed ids only (with the entropy of
    that restricted distribution), exactly as a constrained reply was sampled.
    """
    logits = logits.float() / (temperatures.unsqueeze(-1) if isinstance(temperatures, torch.Tensor) else temperatures)
    full = torch.log_softmax(logits, dim=-1)
    logps = full.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    entropy = -(full.exp() * full).sum(-1) if with_entropy else None
    if allowed_ids is not None:
        allowed = allowed_ids >= 0
        constrained = allowed.any(-1)
        # Unconstrained rows keep finite dummy rows here (their results are discarded below): an all -inf
        # row would put NaN into the backward pass even where torch.where drops it.
        in_set = allowed | ~constrained.unsqueeze(-1)
        sub = logits.gather(-1, allowed_ids.clamp(min=0)).masked_fill(~in_set, float("-inf"))
        restricted = torch.log_softmax(sub, dim=-1)
        chosen = (allowed_ids == tokens.unsqueeze(-1)) & allowed
        logps = torch.where(constrained, restricted.masked_fill(~chosen, 0.0).sum(-1), logps)
        if with_entropy:
            restricted_entropy = -(restricted.exp() * restricted.masked_fill(~in_set, 0.0)).sum(-1)
            entropy = torch.where(constrained, restricted_entropy, entropy)
    return logps, entropy


def kl_to_magnet(
    logits: torch.Tensor, magnet_logits: torch.Tensor | None, temperatures: torch.Tensor | float,
    allowed_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """KL(π_θ ‖ ρ) per row (M,), exactly, over the distribution each token was sampled from.

    π_θ is the softmax of ``logits`` (M, V) at the row's temperature, restricted to its allowed ids where
    ``allowed_ids`` constrains it (as [`token_logprobs_from_logits`][multiagent_rl.training.loss.token_logprobs_from_logits]
    reads it); ρ is the same distribution from ``magnet_logits``, or with ``None`` the uniform distribution over
    the same support (so the KL is log |support| − H(π_θ)). Gradients flow into ``logits`` only.
    """
    scale = temperatures.unsqueeze(-1) if isinstance(temperatures, torch.Tensor) else temperatures
    logits = logits.float() / scale
    magnet = None if magnet_logits is None else magnet_logits.detach().float() / scale

    def kl(policy: torch.Tensor, anchor: torch.Tensor | None, support: torch.Tensor) -> torch.Tensor:
        # Outside the support: a large finite logit (not -inf), so no 0 · inf reaches the backward pass.
        logp = torch.log_softmax(policy.masked_fill(~support, -1e9), -1)
        if anchor is None:
            logq = -torch.log(support.sum(-1, keepdim=True).float()).expand_as(logp)
        else:
            logq = torch.log_softmax(anchor.masked_fill(~support, -1e9), -1)
        return torch.where(support, logp.exp() * (logp - logq), 0.0).sum(-1)

    full = kl(logits, magnet, torch.ones_like(logits, dtype=torch.bool))
    if allowed_ids is None:
        return full
    allowed = allowed_ids >= 0
    constrained = allowed.any(-1)
    index = allowed_ids.clamp(min=0)
    support = allowed | ~constrained.unsqueeze(-1)  # unconstrained rows: a dummy support, discarded below
    restricted = kl(logits.gather(-1, index), None if magnet is None else magnet.gather(-1, index), support)
    return torch.where(constrained, restricted, full)


def importance_weights(
    trainer_logps: torch.Tensor, sampling_logps: torch.Tensor, sampled: torch.Tensor, mode: str = "token_truncate",
    clip_min: float | None = None, clip_max: float | None = 3.0,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Correction for a sampler whose logprobs differ from the trainer's (e.g. vLLM): ρ = π_trainer / μ_sampler.

    Per token (``token_*``) or per sample over its sampled tokens (``sequence_*``, the product of the token
    ratios); ``*_truncate`` clamps ρ to [clip_min, clip_max], ``*_mask`` zeroes ratios outside it (TRL's
    ``vllm_importance_sampling_mode``). The weights (B, T) multiply the rl and ref_kl token losses. Also returns
    the per-unit ratios, log-prob gaps and whether each unit was clipped, for metrics.
    """
    if mode not in ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask"):
        raise ValueError(f"unknown importance sampling mode {mode!r}: token_truncate, token_mask, sequence_truncate "
                         "or sequence_mask")
    sampled = sampled.bool()
    gap = torch.where(sampled, trainer_logps - sampling_logps, 0.0).nan_to_num(0.0)
    per_sequence = mode.startswith("sequence")
    ratio = torch.exp(gap.sum(-1, keepdim=True) if per_sequence else gap)
    low = -math.inf if clip_min is None else clip_min
    high = math.inf if clip_max is None else clip_max
    outside = (ratio < low) | (ratio > high)
    weights = torch.clamp(ratio, min=clip_min, max=clip_max) if mode.endswith("truncate") else ratio.masked_fill(
        outside, 0.0)
    units = sampled.any(-1, keepdim=True) if per_sequence else sampled
    stats = {"ratio": ratio[units], "clipped": outside[units], "gap": gap[sampled].abs()}
    return weights.expand_as(trainer_logps).detach(), stats


def read_positions(batch: dict) -> torch.Tensor:
    """(B, T) completion positions some stream or metric reads (the others need no log-probability)."""
    read = batch["action_mask"] != 0
    for stream in STREAMS:
        read = read | (batch[stream.mask] != 0)
    return batch["completion_mask"].bool() & read


def compute_loss(
    logps: torch.Tensor, batch: dict, normalizer: Callable[[torch.Tensor], torch.Tensor],
    epsilon_low: float, epsilon_high: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The streams' loss of one micro-batch and its per-stream token losses (B, T).

    ``normalizer(count)`` turns a stream's global token count into its divisor for this micro-batch
    ([`normalizer`][multiagent_rl.training.loss.normalizer]: gradient accumulation and the number of processes folded
    in). Regularisers ([`multiagent_rl.training.regularisers`][]) add their terms to it.
    """
    old = batch.get("old_per_token_logps")
    ratio = torch.exp(logps - (logps.detach() if old is None else old))
    inputs = StreamInputs(logps, ratio, batch, epsilon_low, epsilon_high)
    token_losses = {s.name: s.loss_function()(inputs) for s in STREAMS}
    if "policy_index" in batch:  # several policies: each row's stream divided by its own policy's token count
        loss = sum((token_losses[s.name].sum(1) / normalizer(batch[per_policy(s.count)])).sum() for s in STREAMS)
    else:
        loss = sum(token_losses[s.name].sum() / normalizer(batch[s.count]) for s in STREAMS)
    return loss, {"ratio": ratio, "inputs": inputs, **token_losses}


def normalizer(world: int, window: float) -> Callable[[torch.Tensor], torch.Tensor]:
    """A stream's divisor for one micro-batch from its global token count: the counts span the generation batch on
    all processes, so rescale to one accumulation ``window`` (micro-batches per optimizer step over those per
    generation batch) and undo DDP's gradient averaging over ``world`` processes, exactly as TRL does for its DAPO
    loss."""
    return lambda count: count.clamp(min=1.0) / world * window


def per_policy(count: str) -> str:
    """The batch key of a stream's per-row count of that row's policy (several policies)."""
    return f"{count}_of_policy"


def add_global_counts(batch: dict, all_reduce_sum: Callable[[torch.Tensor], torch.Tensor],
                      num_policies: int = 1) -> dict:
    """Write each stream's global token count (and the action tokens', and TRL's ``num_items_in_batch``) into
    ``batch``, summed over all processes in one all-reduce.

    With several policies (``batch["policy_index"]``, one per row) each stream is also counted per policy and every
    row gets its own policy's count (``per_policy(count)``, (B,)): each policy's loss is normalised as if it were
    trained alone, so the loss of k policies is the sum of their single-policy losses."""
    masks = [batch[s.mask] for s in STREAMS] + [batch["action_mask"] * batch["completion_mask"]]
    if "policy_index" in batch:
        index = batch["policy_index"]
        table = torch.stack([torch.stack([m[index == k].sum() for m in masks]) for k in range(num_policies)])
        table = all_reduce_sum(table.float())  # (policies, streams + 1)
        for column, stream in enumerate(STREAMS):
            batch[per_policy(stream.count)] = table[index, column]
        counts = table.sum(0)
    else:
        counts = all_reduce_sum(torch.stack([m.sum() for m in masks]).float())
    for stream, count in zip(STREAMS, counts):
        batch[stream.count] = count
    batch["num_action_tokens"] = counts[-1]
    batch["num_items_in_batch"] = batch["num_rl_tokens"]
    return batch


def sampler_mismatch_metrics(stats: dict, reduce_sum: Callable, reduce_max: Callable) -> dict[str, float]:
    """The logged figures of [`importance_weights`][multiagent_rl.training.loss.importance_weights]' statistics over
    all processes: the importance ratio's mean, min, max and clipped share, the sampler/trainer log-prob gap.

    Empty when no process's batch has a token the policy sampled (e.g. a step of sft on scripted demonstrations):
    there is no ratio to report, and a mean of 0 beside a min and max of 1 would be a figure of nothing. Every
    process reduces before deciding, so they all decide alike.
    """
    ratio, gap = stats["ratio"].float(), stats["gap"].float()
    sums = torch.stack([ratio.sum(), torch.tensor(float(ratio.numel()), device=ratio.device),
                        stats["clipped"].float().sum(), gap.sum(), torch.tensor(float(gap.numel()), device=gap.device)])
    sums = reduce_sum(sums).tolist()
    # the neutral values keep a process without sampled tokens out of the others' extremes
    extremes = torch.stack([ratio.max() if ratio.numel() else ratio.new_tensor(-math.inf),
                            -(ratio.min() if ratio.numel() else ratio.new_tensor(math.inf)),
                            gap.max() if gap.numel() else gap.new_tensor(0.0)])
    top = reduce_max(extremes).tolist()
    if sums[1] == 0:
        return {}
    return {
        "sampling/importance_sampling_ratio/mean": sums[0] / max(sums[1], 1.0),
        "sampling/importance_sampling_ratio/max": top[0],
        "sampling/importance_sampling_ratio/min": -top[1],
        "sampling/importance_sampling_ratio/clipped": sums[2] / max(sums[1], 1.0),
        "sampling/sampling_logp_difference/mean": sums[3] / max(sums[4], 1.0),
        "sampling/sampling_logp_difference/max": top[2],
    }


def metric_sums(
    parts: dict[str, torch.Tensor], entropies: torch.Tensor, batch: dict, tags: list[str],
    streams_of_tag: dict[str, set[str]],
) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """Named (sum over this micro-batch, global count) pairs: the value of each metric is sum / count.

    Per stream and per algorithm tag (for the streams that algorithm writes), the entropy of the
    action tokens, the sampled reverse KL to the teacher and TRL's clip ratios of the rl tokens.
    """
    inputs, ratio = parts["inputs"], parts["ratio"]
    out: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
    for stream in STREAMS:
        per_row = parts[stream.name].detach().float().sum(1)
        count = batch[stream.count]
        out[f"loss/{stream.name}"] = (per_row.sum(), count)
        for tag in tags:
            if stream.name in streams_of_tag[tag]:
                rows = torch.tensor([a == tag for a in batch["algorithm"]], dtype=per_row.dtype, device=per_row.device)
                out[f"loss/{stream.name}/{tag}"] = ((rows * per_row).sum(), count)
    action = batch["completion_mask"] * batch["action_mask"]
    out["entropy"] = ((entropies.detach() * action).sum(), batch["num_action_tokens"])
    if batch["num_ref_kl_tokens"] > 0:
        out["ref_kl/sampled_reverse_kl"] = ((-reference_advantage(inputs) * batch["ref_kl_weights"]).sum(),
                                            batch["num_ref_kl_tokens"])
    if batch["num_rl_tokens"] > 0:
        advantages, rl_mask = batch["advantages"], batch["rl_mask"]
        low = (ratio < 1 - inputs.epsilon_low) & (advantages < 0)
        high = (ratio > 1 + inputs.epsilon_high) & (advantages > 0)
        for name, hit in (("low_mean", low), ("high_mean", high), ("region_mean", low | high)):
            out[f"clip_ratio/{name}"] = ((hit.float() * rl_mask).sum(), batch["num_rl_tokens"])
    return out


def reduce_metrics(
    sums: dict[str, tuple[torch.Tensor, torch.Tensor]], all_reduce: Callable[[torch.Tensor], torch.Tensor],
    scale: float,
) -> dict[str, float]:
    """Sum every metric over all processes in one all-reduce and divide by its global count.

    ``scale`` turns a micro-batch's share into the logged value: the number of micro-batches per
    optimizer step over the accumulation window, so the mean of a step's logged values is the step's
    own value, whatever the gradient accumulation.
    """
    names = list(sums)
    totals = all_reduce(torch.stack([sums[n][0].float() for n in names])).tolist()
    counts = torch.stack([sums[n][1].float() for n in names]).clamp(min=1.0).tolist()
    return {name: total / count * scale for name, total, count in zip(names, totals, counts)}
