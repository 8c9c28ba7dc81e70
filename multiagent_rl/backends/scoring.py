"""Per-token log-probabilities of given sequences under a causal LM (teacher scoring, evaluation), and the small
model helpers every module that runs a model shares (eval mode, device, vocabulary, a frozen copy).

``token_logprobs(model, sequences)[i][j] = log p(sequences[i][j] | sequences[i][:j])`` with
element 0 ``None`` (the first token has no context). Sequences are batched with right padding
and an attention mask, one no-grad forward per batch; the log-softmax is taken in float32.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any

import torch


@contextlib.contextmanager
def eval_mode(model: Any) -> Iterator[Any]:
    """Put ``model`` in eval mode for the block and restore its training flag afterwards."""
    was_training = bool(getattr(model, "training", False))
    model.eval()
    try:
        yield model
    finally:
        model.train(was_training)


def model_device(model: Any) -> torch.device:
    """The device of ``model``'s parameters (``model.device`` when it has one)."""
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    try:
        return next(model.parameters()).device
    except (StopIteration, AttributeError):
        return torch.device("cpu")


def vocab_size(model: Any) -> int | None:
    """Number of logits the model produces per position (its output vocabulary), if known."""
    try:
        out = model.get_output_embeddings()
        if out is not None and getattr(out, "weight", None) is not None:
            return int(out.weight.shape[0])
    except (AttributeError, NotImplementedError):
        pass
    config = getattr(model, "config", None)
    size = getattr(config, "vocab_size", None)
    if size is None and config is not None and hasattr(config, "get_text_config"):
        size = getattr(config.get_text_config(), "vocab_size", None)
    return int(size) if size is not None else None


def check_vocab(model: Any, sequences: list[list[int]], who: str = "the scoring model") -> None:
    """Raise a clear error when a token id is outside ``model``'s vocabulary (it must share the tokenizer)."""
    size = vocab_size(model)
    if size is None:
        return
    bad = next((t for seq in sequences for t in seq if not 0 <= t < size), None)
    if bad is not None:
        raise ValueError(
            f"{who} has a vocabulary of {size} tokens but the sequences contain token id {bad}: "
            "it must share the tokenizer that produced them"
        )


def token_logprobs(
    model: Any,
    sequences: list[list[int]],
    batch_size: int = 16,
    allowed: list[list[list[int] | None]] | None = None,
    temperatures: list[list[float | None]] | None = None,
) -> list[list[float | None]]:
    """Log-probability of every token of every sequence given its prefix.

    Args:
        model: a Hugging Face causal LM (``model(input_ids=..., attention_mask=...).logits``).
        sequences: token id lists, possibly of different lengths.
        batch_size: sequences per forward pass (sequences are length-sorted to limit padding).
        allowed: per sequence, per token, the ids a constrained choice allowed (``None``: the
            whole vocabulary), e.g. ``trace.allowed_token_ids``; such a token is scored with the
            softmax over its allowed ids, as the policy sampled it.
        temperatures: per sequence, per token, the softmax temperature to score it at (``None``:
            1.0), e.g. ``trace.token_temperatures``, so a teacher is read at the temperature the
            policy sampled (and is trained) at.

    Returns:
        one list per sequence, aligned with it: ``[None, log p(t1|t0), log p(t2|t0 t1), ...]``.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    check_vocab(model, sequences)

    # sequences of 0 or 1 tokens need no forward pass
    results: list[list[float | None]] = [[None] * min(len(seq), 1) for seq in sequences]
    order = sorted((i for i, seq in enumerate(sequences) if len(seq) > 1), key=lambda i: -len(sequences[i]))
    if not order:
        return results

    device = model_device(model)
    with eval_mode(model), torch.no_grad():
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            width = max(len(sequences[i]) for i in idx)
            input_ids = torch.zeros((len(idx), width), dtype=torch.long)
            attention_mask = torch.zeros((len(idx), width), dtype=torch.long)
            for row, i in enumerate(idx):
                n = len(sequences[i])
                input_ids[row, :n] = torch.tensor(sequences[i], dtype=torch.long)
                attention_mask[row, :n] = 1
            input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
            logits = model(input_ids=input_ids, attention_mask=attention_mask).logits
            for row, i in enumerate(idx):
                n = len(sequences[i])
                # one row at a time keeps the float32 copy of the logits to (n, vocab)
                scaled = logits[row, : n - 1].float()
                if temperatures is not None:
                    temps = [1.0 if x is None else float(x) for x in temperatures[i][1:n]]
                    scaled = scaled / torch.tensor(temps, device=scaled.device).unsqueeze(-1)
                logp = torch.log_softmax(scaled, dim=-1)
                picked = logp.gather(-1, input_ids[row, 1:n].unsqueeze(-1)).squeeze(-1)
                scores = [None, *picked.cpu().tolist()]
                for j, ids in enumerate(allowed[i] if allowed is not None else ()):
                    if ids is not None and j > 0:
                        scores[j] = scores[j] - torch.logsumexp(logp[j - 1, ids], -1).item()
                results[i] = scores
            del logits
    return results


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """An independent, frozen copy of ``model`` for reading only (the magnet regulariser, OPSD's frozen teacher).

    TRL and accelerate replace a prepared model's ``forward`` on the instance with closures over the original
    model (TRL's fused LM head, accelerate's fp32 output wrapper); a deep copy would keep calling the original's
    forward, so the copy gets its class's own forward back.
    """
    duplicate = copy.deepcopy(model)
    for module in duplicate.modules():
        module.__dict__.pop("forward", None)
        module.__dict__.pop("_original_forward", None)
    return duplicate.eval().requires_grad_(False)
