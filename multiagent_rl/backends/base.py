"""The one interface every generation backend implements: token ids in, sampled ids + logprobs out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator


class SamplingParams(BaseModel):
    """How to sample one reply."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    temperature: float = Field(1.0, ge=0.0)
    """Softmax temperature; 0 means greedy decoding."""
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    """Nucleus sampling mass."""
    max_new_tokens: int = Field(64, ge=1)
    """Most tokens sampled in one turn."""
    stop: tuple[str, ...] = ()
    """Stop strings: the reply text ends before the first of them (the sampled tokens are kept)."""
    seed: int | None = None
    """Seed for this call's sampling (requests sharing a seed are served in one seeded batch)."""
    allowed_token_ids: tuple[int, ...] | None = None
    """Sample only these tokens (every other logit is masked to -inf before sampling, so the
    returned logprobs are over this set). Harnesses use it for constrained choices."""

    @field_validator("allowed_token_ids")
    @classmethod
    def _non_empty(cls, ids):
        if ids is not None and not ids:
            raise ValueError("allowed_token_ids must name at least one token (None = the whole vocabulary)")
        return ids

    def with_overrides(self, **overrides) -> SamplingParams:
        return self if not overrides else self.model_copy(update=overrides)


FinishReason = Literal["stop", "stop_string", "length"]


@dataclass
class Generation:
    """One sampled reply. ``logprobs[i]`` is log π(token_ids[i]) under the sampling temperature."""

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason


class GenerationBackend(Protocol):
    """What agents, teachers and the trainer need from a model, wherever it runs.

    Build one from a model reference with :func:`multiagent_rl.backends.build_backend`.
    """

    model_id: str
    """How traces name the model (``"policy"`` for the live policy)."""
    tokenizer: object
    """The tokenizer whose ids ``generate`` and ``score`` take and return."""
    supports_choices: bool
    """Whether ``SamplingParams.allowed_token_ids`` is honoured (the legal-action harness needs it)."""
    max_context: int | None
    """Most positions a request may use (prompt + reply); None when unknown."""
    exact_logprobs: bool
    """True when its sampling logprobs are the trainer's own (same weights, same numerics); otherwise a policy
    served by it gets the truncated importance-sampling correction."""

    async def generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        """Sample a reply to ``prompt_ids``: its token ids and their logprobs at ``params.temperature``."""

    async def score(
        self,
        sequences: list[list[int]],
        allowed: list[list[list[int] | None]] | None = None,
        temperatures: list[list[float | None]] | None = None,
    ) -> list[list[float | None]]:
        """Log-probability of every token of every sequence given its prefix (element 0 is None), each
        token read with the softmax over its allowed ids if given and at its temperature (teachers)."""

    def sync_weights(self, model) -> None:
        """Policy backends: take the trainer's current weights (called after every optimizer step)."""


def check_context(prompt_tokens: int, max_new_tokens: int, limit: int | None, model_id: str) -> None:
    """Refuse a request whose prompt plus reply would not fit the model's context."""
    if limit is not None and prompt_tokens + max_new_tokens > limit:
        raise ValueError(
            f"prompt of {prompt_tokens} tokens + max_new_tokens {max_new_tokens} exceeds the context of model "
            f"{model_id!r} ({limit} positions); shorten the prompt or the conversation, or lower max_new_tokens"
        )
