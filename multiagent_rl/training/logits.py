"""Scoring the policy for the loss: the logits it reads, at the completion positions some stream, metric or
regulariser reads only ([`PolicyScorer`][multiagent_rl.training.logits.PolicyScorer]).

[`hidden_at`][multiagent_rl.training.logits.hidden_at] runs the model's body once per length bucket;
[`logits_at`][multiagent_rl.training.logits.logits_at] applies the LM head to just the positions read, after checking
that the head on the last hidden state reproduces the model's own logits.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from .loss import read_positions, token_logprobs_from_logits

logger = logging.getLogger(__name__)


def hidden_at(model: Any, ids: torch.Tensor, mask: torch.Tensor, T: int, read: torch.Tensor, buckets: int = 4):
    """The final hidden states (M, H) at the positions that predict the ``read`` (B, T) completion tokens of the
    left-padded prompt + right-padded completion rows ``ids`` (B, L), in ``read``'s row-major order; plus the last
    position's hidden state and logits of one run (for [`logits_at`][multiagent_rl.training.logits.logits_at]'s check).

    Rows without a read position are not run at all; the rest run in up to ``buckets`` groups of similar length,
    each cut to its own span of columns (on the Kuhn recipe half the padded positions were padding). Cutting left
    padding shifts a row's absolute positions, which rotary attention does not see (scores depend on relative
    positions only), so the hidden states equal the padded run's up to float rounding.
    """
    P = ids.shape[1] - T
    columns = torch.arange(T, device=read.device)
    starts = P - mask[:, :P].sum(1)  # a row's first real column
    ends = P + torch.where(read, columns, -1).max(1).values  # one past the column predicting its last read token
    rows = read.any(1).nonzero().squeeze(1)
    rows = rows[(ends - starts)[rows].argsort(stable=True)]
    hidden, flat, last = [], [], None
    for group in rows.tensor_split(min(buckets, len(rows))) if len(rows) else []:
        left, right = int(starts[group].min()), int(ends[group].max())
        out = model(input_ids=ids[group, left:right], attention_mask=mask[group, left:right], logits_to_keep=1,
                    output_hidden_states=True)
        r, j = read[group].nonzero(as_tuple=True)
        hidden.append(out.hidden_states[-1][r, P + j - 1 - left])
        flat.append(group[r] * T + j)
        if last is None:
            last = (out.hidden_states[-1][:, -1], out.logits[:, -1])
    if last is None:  # nothing to read: an empty result that still belongs to the graph
        out = model(input_ids=ids[:1], attention_mask=mask[:1], logits_to_keep=1, output_hidden_states=True)
        return out.hidden_states[-1][:0, 0], out.hidden_states[-1][:, -1], out.logits[:, -1]
    order = torch.cat(flat).argsort()
    return torch.cat(hidden)[order], *last


def logits_at(model: Any, head: Any, ids: torch.Tensor, mask: torch.Tensor, T: int, read: torch.Tensor):
    """The logits (M, V) at the ``read`` completion positions: ``head`` (the model's output embeddings) applied to
    just those positions' hidden states ([`hidden_at`][multiagent_rl.training.logits.hidden_at]) — on the Kuhn recipe the
    head over all T + 1 kept positions was ~30% of the step's forward and backward, and with a large vocabulary it
    is most of the logits' memory. ``None`` when ``head`` on the last hidden state does not reproduce the model's
    own logits (a model that scales or caps its logits after the head); with ``head=None`` the model's logits at
    all kept positions, indexed."""
    if head is None:
        return model(input_ids=ids, attention_mask=mask, logits_to_keep=T + 1).logits[:, :-1][read]
    hidden, last_hidden, last_logits = hidden_at(model, ids, mask, T, read)
    if not torch.allclose(head(last_hidden).float(), last_logits.float(), rtol=1e-3, atol=1e-3):
        return None
    return head(hidden)


@dataclass
class Scored:
    """A micro-batch scored by the policy: per-token log-probabilities and entropies (B, T), and when read through
    the loss's own path, the positions read, their logits (M, V), temperatures and allowed ids."""

    logps: torch.Tensor
    entropies: torch.Tensor | None
    read: torch.Tensor | None = None
    read_logits: torch.Tensor | None = None
    temperatures: torch.Tensor | None = None
    allowed: torch.Tensor | None = None
    inputs: tuple | None = None
    """(ids, mask, T): what another model reads at the same positions (``PolicyScorer.read_logits_of``)."""


class PolicyScorer:
    """The trainer's scoring of completion tokens as they were sampled: at their temperature and, where a harness
    constrained them, with the softmax over their allowed ids.

    When every token has the trainer's temperature, none is constrained, no regulariser reads logits and at least
    half the completion positions are read, this is TRL's own scoring (``fused`` is the trainer's
    ``_get_per_token_logps_and_entropies``, whose fused LM head never builds the full logits); otherwise (multi-turn
    traces whose completions are mostly observations among them) only the positions some stream, metric or
    regulariser reads are scored (0 elsewhere), with the LM head applied to just their hidden states ([`logits_at`][multiagent_rl.training.logits.logits_at]),
    or, for a model whose logits are not its head on its last hidden state (checked on every call; one warning per
    model class) and under FSDP or ZeRO-3 (whose sharded head cannot run outside the forward), the model's logits at
    every kept position.
    """

    def __init__(self, accelerator, temperature: float, fused: Callable, head_outside_forward: bool):
        self.accelerator, self.temperature, self.fused = accelerator, temperature, fused
        self.head_outside_forward = head_outside_forward
        self.full_logits_models: set[type] = set()

    def score(self, model, batch: dict, compute_entropy: bool = False, need_logits: bool = False) -> Scored:
        ids = torch.cat([batch["prompt_ids"], batch["completion_ids"]], 1)
        mask = torch.cat([batch["prompt_mask"], batch["completion_mask"]], 1)
        T = batch["completion_ids"].size(1)
        allowed, temperatures = batch.get("allowed_ids"), batch["temperatures"]
        read = read_positions(batch)
        # TRL's fused pass scores every completion position; where most of them are observations (tool results, the
        # other seat's turns) the head on just the read positions, in length buckets, is the cheaper pass
        mostly_read = 2 * int(read.sum()) >= int(batch["completion_mask"].sum())
        if allowed is None and not need_logits and mostly_read and bool((temperatures == self.temperature).all()):
            logps, entropies, _ = self.fused(model, ids, mask, T, compute_entropy=compute_entropy)
            return Scored(logps, entropies)
        read_logits = self.logits(model, ids, mask, T, read)
        allowed_read = None if allowed is None else allowed[read]
        logps, entropy = token_logprobs_from_logits(
            read_logits, batch["completion_ids"][read], temperatures[read], allowed_read, with_entropy=compute_entropy)
        out = torch.zeros(read.shape, dtype=logps.dtype, device=logps.device).masked_scatter(read, logps)
        entropies = torch.zeros_like(out).masked_scatter(read, entropy) if compute_entropy else None
        return Scored(out, entropies, read, read_logits, temperatures[read], allowed_read, (ids, mask, T))

    def read_logits_of(self, model, scored: Scored):
        """Another model's logits at the positions ``scored`` read (a regulariser's anchor)."""
        ids, mask, T = scored.inputs
        return self.logits(model, ids, mask, T, scored.read)

    def logits(self, model, ids, mask, T, read):
        """The logits (M, V) at the completion positions ``read`` (B, T)."""
        head = self.accelerator.unwrap_model(model).get_output_embeddings()
        if not self.head_outside_forward or type(model) in self.full_logits_models:
            head = None
        with self.accelerator.autocast():
            logits = logits_at(model, head, ids, mask, T, read)
        if logits is None:
            self.full_logits_models.add(type(model))
            logger.warning("%s's logits are not its output embeddings applied to its last hidden state: the loss "
                           "reads its logits at every completion position instead", type(model).__name__)
            return self.logits(model, ids, mask, T, read)
        return logits
