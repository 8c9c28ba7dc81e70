"""Scored traces → training tensors.

One sample per trainable trace that an algorithm scored into some stream: the first prompt segment
is the sample's prompt (left-padded), everything after it the completion (right-padded), with
per-token weights for the three loss streams (rl advantages, ce weights, ref_kl weights + teacher
logprobs), the sampling logprobs and temperatures, per-sample tags (algorithm, env, role) for
metrics and, when a harness constrained some replies to choices, the allowed token ids of every
constrained token.

A sample scored by an rl algorithm counts its action tokens in the rl stream's token count even
when its advantage is 0 (a tie in its group), as TRL's DAPO normaliser counts every completion
token; ``skip_zero_advantage=True`` leaves such samples out of the count instead (the rl step then
scales with 1 / the share of non-zero-advantage tokens).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .episode import Episode
from .trace import Trace

STREAMS = ("rl", "ce", "ref_kl")


@dataclass
class Sample:
    trace: Trace
    env: str


def trainable_samples(episodes: list[Episode], skip_zero_advantage: bool = False) -> list[Sample]:
    """Traces an algorithm scored (an rl stream, or weight on ce / ref_kl); the rest never enter the batch."""
    return [
        Sample(t, ep.env)
        for ep in episodes
        if ep.ok
        for t in ep.traces
        if t.trainable and t.streams is not None
        and ((t.streams.rl is not None and not skip_zero_advantage) or t.streams.has_weight())
    ]


def collate(
    samples: list[Sample],
    pad_token_id: int,
    multiple_of: int = 1,
    temperature: float = 1.0,
    skip_zero_advantage: bool = False,
) -> dict:
    """Pad samples into the tensor dict ``MixedAlgorithmTrainer._compute_loss`` reads.

    The batch is padded with weightless rows to a multiple of ``multiple_of`` (TRL splits a
    generation batch into equal micro-batches); padding rows attend to one pad token and carry
    no weight on any stream. ``temperatures`` holds, per completion token, the temperature the loss
    scores it at: the one it was sampled at when the policy sampled it, else ``temperature`` (the
    trainer's).
    """
    rows = []
    for s in samples:
        ids, streams, p = s.trace.token_ids, s.trace.streams, s.trace.prompt_length
        if p == 0 or p == len(ids):
            raise ValueError(f"trace of {s.trace.agent!r} needs a prompt segment followed by completion tokens")
        kinds = s.trace.token_kinds[p:]
        allowed = s.trace.allowed_token_ids[p:]
        # A token the harness forced (one allowed id) has probability 1 under its restricted softmax:
        # no gradient, so no stream counts it in its token normalisation either.
        free = [float(a is None or len(a) > 1) for a in allowed]
        rl = streams.rl[p:] if streams.rl is not None else [0.0] * (len(ids) - p)
        in_rl = streams.rl is not None and not (skip_zero_advantage and not any(a != 0 for a in rl))
        sampled_by_policy = s.trace.model == "policy"
        temps = [t if (t is not None and sampled_by_policy) else temperature for t in s.trace.token_temperatures[p:]]
        rows.append(
            dict(
                prompt=ids[:p],
                completion=ids[p:],
                rl=rl,
                rl_mask=[float(k == "action") * f for k, f in zip(kinds, free)] if in_rl else [0.0] * len(kinds),
                ce=[w * f for w, f in zip(streams.ce[p:], free)] if streams.ce is not None else [0.0] * len(kinds),
                ref_kl=[w * f for w, f in zip(streams.ref_kl[p:], free)] if streams.ref_kl is not None
                else [0.0] * len(kinds),
                allowed=allowed,
                ref_logps=[x or 0.0 for x in streams.ref_logprobs[p:]] if streams.ref_logprobs else [0.0] * len(kinds),
                sampling_logps=[x or 0.0 for x in s.trace.sampling_logprobs[p:]],
                action=[float(k == "action") for k in kinds],
                temperature=temps,
                algorithm=streams.algorithm,
                env=s.env,
                role=s.trace.agent,
            )
        )
    while not rows or len(rows) % multiple_of:
        rows.append(
            dict(prompt=[pad_token_id], completion=[pad_token_id], rl=[0.0], rl_mask=[0.0], ce=[0.0], ref_kl=[0.0],
                 allowed=[None], ref_logps=[0.0], sampling_logps=[0.0], action=[0.0], temperature=[temperature],
                 algorithm="padding", env="",
                 role="")
        )
    P = max(len(r["prompt"]) for r in rows)
    T = max(len(r["completion"]) for r in rows)
    B = len(rows)
    prompt_ids = torch.full((B, P), pad_token_id, dtype=torch.long)
    prompt_mask = torch.zeros((B, P), dtype=torch.long)
    completion_ids = torch.full((B, T), pad_token_id, dtype=torch.long)
    completion_mask = torch.zeros((B, T), dtype=torch.long)
    floats = {k: torch.zeros((B, T)) for k in ("rl", "rl_mask", "ce", "ref_kl", "ref_logps", "sampling_logps", "action")}
    floats["temperature"] = torch.full((B, T), float(temperature))
    for i, r in enumerate(rows):
        p, c = len(r["prompt"]), len(r["completion"])
        prompt_ids[i, P - p :] = torch.tensor(r["prompt"])
        prompt_mask[i, P - p :] = 1
        completion_ids[i, :c] = torch.tensor(r["completion"])
        completion_mask[i, :c] = 1
        for k, t in floats.items():
            t[i, :c] = torch.tensor(r[k], dtype=torch.float32)
    batch = {
        "prompt_ids": prompt_ids,
        "prompt_mask": prompt_mask,
        "completion_ids": completion_ids,
        "completion_mask": completion_mask,
        "advantages": floats["rl"],
        "rl_mask": floats["rl_mask"],
        "ce_weights": floats["ce"],
        "ref_kl_weights": floats["ref_kl"],
        "ref_logps": floats["ref_logps"],
        "sampling_logps": floats["sampling_logps"],
        "action_mask": floats["action"],
        "temperatures": floats["temperature"],
        "algorithm": [r["algorithm"] for r in rows],
        "env": [r["env"] for r in rows],
        "role": [r["role"] for r in rows],
    }
    K = max((len(a) for r in rows for a in r["allowed"] if a is not None), default=0)
    if K:  # constrained choices in the batch: per token the allowed ids, -1-padded (all -1 = whole vocabulary)
        allowed_ids = torch.full((B, T, K), -1, dtype=torch.long)
        for i, r in enumerate(rows):
            for j, a in enumerate(r["allowed"]):
                if a is not None:
                    allowed_ids[i, j, : len(a)] = torch.tensor(a)
        batch["allowed_ids"] = allowed_ids
    return batch
