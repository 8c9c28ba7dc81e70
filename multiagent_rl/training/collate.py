"""Scored traces → training tensors.

One sample per trainable trace that an algorithm scored into some stream: the first prompt segment
is the sample's prompt (left-padded), everything after it the completion (right-padded), with, per
loss stream of [`STREAMS`][multiagent_rl.episodes.streams.STREAMS], its per-token weights and its token-count mask;
the sampling logprobs and temperatures; per-sample tags (algorithm, env, role, policy) for metrics and for routing each row to its policy; and,
when a harness constrained some replies to choices, the allowed token ids of every constrained token.

A token the harness forced (one allowed id) has probability 1 under its restricted softmax: no
gradient, so no stream counts it. A sample scored by an rl algorithm counts its action tokens in
the rl stream's token count even when its advantage is 0 (a tie in its group), as TRL's DAPO
normaliser counts every completion token; ``skip_zero_advantage=True`` leaves such samples out of
the count instead (the rl step then scales with 1 / the share of non-zero-advantage tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..episodes.episode import Episode
from ..episodes.streams import STREAMS
from ..episodes.trace import Trace


@dataclass
class Sample:
    trace: Trace
    env: str


def _in_rl(trace: Trace, skip_zero_advantage: bool) -> bool:
    advantages = trace.streams.advantages
    return advantages is not None and not (skip_zero_advantage and not any(a != 0 for a in advantages))


def trainable_samples(episodes: list[Episode], skip_zero_advantage: bool = False) -> list[Sample]:
    """Traces an algorithm scored (an rl stream, or weight on another stream); the rest never enter the batch."""
    return [
        Sample(t, ep.env)
        for ep in episodes
        if ep.ok
        for t in ep.traces
        if t.trainable and t.token_exact and t.streams is not None
        and (_in_rl(t, skip_zero_advantage) or t.streams.has_weight())
    ]


def _row(s: Sample, temperature: float, skip_zero_advantage: bool) -> dict:
    trace = s.trace
    ids, p = trace.token_ids, trace.prompt_length
    if p == 0 or p == len(ids):
        raise ValueError(f"trace of {trace.role!r} needs a prompt segment followed by completion tokens")
    kinds = trace.token_kinds[p:]
    allowed = trace.allowed_token_ids[p:]
    free = [float(a is None or len(a) > 1) for a in allowed]
    action = [float(k == "action") for k in kinds]
    by_policy = trace.model == "policy"
    sampling = trace.sampling_logprobs[p:]
    row = dict(prompt=ids[:p], completion=ids[p:], allowed=allowed, action_mask=action,
               sampling_logps=[x or 0.0 for x in sampling],
               # tokens the policy sampled (not forced): where the sampler's logprob can be compared to the trainer's
               sampled_mask=[float(by_policy and x is not None) * f for x, f in zip(sampling, free)],
               algorithm=trace.streams.algorithm, env=s.env, role=trace.role, policy=trace.policy)
    row["temperatures"] = trace.loss_temperatures(temperature)[p:]
    for stream in STREAMS:
        values = getattr(trace.streams, stream.field)
        weights = [0.0] * len(kinds) if values is None else list(values[p:])
        if stream.counts_weighted_only:
            weights = [w * f for w, f in zip(weights, free)]
            mask = [float(w != 0) for w in weights]
        else:
            counted = values is not None and _in_rl(trace, skip_zero_advantage)
            mask = [a * f for a, f in zip(action, free)] if counted else [0.0] * len(kinds)
        row[stream.field], row[stream.mask] = weights, mask
        for field in stream.extras:
            extra = getattr(trace.streams, field)
            row[field] = [x or 0.0 for x in extra[p:]] if extra else [0.0] * len(kinds)
    return row


def _padding_row(pad_token_id: int, temperature: float) -> dict:
    row = dict(prompt=[pad_token_id], completion=[pad_token_id], allowed=[None], action_mask=[0.0],
               sampling_logps=[0.0], sampled_mask=[0.0], temperatures=[temperature], algorithm="padding", env="",
               role="", policy=None)
    for stream in STREAMS:
        row[stream.field], row[stream.mask] = [0.0], [0.0]
        for field in stream.extras:
            row[field] = [0.0]
    return row


def collate(
    samples: list[Sample],
    pad_token_id: int,
    multiple_of: int = 1,
    temperature: float = 1.0,
    skip_zero_advantage: bool = False,
) -> dict:
    """Pad samples into the tensor dict the loss reads ([`multiagent_rl.training.loss`][]).

    The batch is padded with weightless rows to a multiple of ``multiple_of`` (TRL splits a
    generation batch into equal micro-batches); padding rows attend to one pad token and carry
    no weight on any stream. ``temperature`` is the trainer's, for tokens the policy did not sample.
    """
    rows = [_row(s, temperature, skip_zero_advantage) for s in samples]
    while not rows or len(rows) % multiple_of:
        rows.append(_padding_row(pad_token_id, temperature))
    P = max(len(r["prompt"]) for r in rows)
    T = max(len(r["completion"]) for r in rows)
    # Padded as Python lists and converted once per field: a tensor per row and field cost more than the rest of
    # the collation (~0.05 s of a 0.36 s Kuhn step).
    batch = {
        "prompt_ids": torch.tensor([[pad_token_id] * (P - len(r["prompt"])) + r["prompt"] for r in rows]),
        "prompt_mask": torch.tensor([[0] * (P - len(r["prompt"])) + [1] * len(r["prompt"]) for r in rows]),
        "completion_ids": torch.tensor([r["completion"] + [pad_token_id] * (T - len(r["completion"])) for r in rows]),
        "completion_mask": torch.tensor([[1] * len(r["completion"]) + [0] * (T - len(r["completion"])) for r in rows]),
    }
    per_token = [k for k, v in rows[0].items() if isinstance(v, list) and k not in ("prompt", "completion", "allowed")]
    for k in per_token:
        fill = float(temperature) if k == "temperatures" else 0.0
        batch[k] = torch.tensor([r[k] + [fill] * (T - len(r[k])) for r in rows], dtype=torch.float32)
    batch.update(algorithm=[r["algorithm"] for r in rows], env=[r["env"] for r in rows], role=[r["role"] for r in rows],
                 policy=[r["policy"] for r in rows])
    K = max((len(a) for r in rows for a in r["allowed"] if a is not None), default=0)
    if K:  # constrained choices in the batch: per token the allowed ids, -1-padded (all -1 = whole vocabulary)
        unconstrained = [-1] * K
        batch["allowed_ids"] = torch.tensor([
            [unconstrained if a is None else list(a) + [-1] * (K - len(a)) for a in r["allowed"]]
            + [unconstrained] * (T - len(r["allowed"]))
            for r in rows
        ], dtype=torch.long)
    return batch
