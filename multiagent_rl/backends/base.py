"""The one interface every generation backend implements: token ids in, sampled ids + logprobs out."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field, field_validator


def check_trained_temperature(temperature: float, where: str) -> None:
    """Raise a ValueError naming ``where`` unless a policy trained on its samples can sample at ``temperature``."""
    if temperature <= 0:
        raise ValueError(f"{where} = {temperature}: the policy is trained on its own samples, which needs "
                         "temperature > 0 (greedy decoding is for evaluation; frozen seats may use 0)")


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
    """One sampled reply. ``logprobs[i]`` is log π(token_ids[i]) under the sampling temperature.

    ``exact`` is False when the tokens are a re-tokenisation of text the model returned (a chat endpoint),
    not the ids it sampled: such a reply has no logprobs and must not be trained on.
    """

    token_ids: list[int]
    logprobs: list[float] | None
    finish_reason: FinishReason
    exact: bool = True


class GenerationBackend(Protocol):
    """What agents, teachers and the trainer need from a model, wherever it runs.

    Build one from a model reference with [`multiagent_rl.backends.build_backend`][].
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

    async def generate(self, prompt_ids: list[int], params: SamplingParams,
                       messages: list[dict] | None = None) -> Generation:
        """Sample a reply to ``prompt_ids`` (``messages``: the same conversation as chat messages, for text
        endpoints): its token ids and their logprobs at ``params.temperature``."""

    async def score(
        self,
        sequences: list[list[int]],
        allowed: list[list[list[int] | None]] | None = None,
        temperatures: list[list[float | None]] | None = None,
    ) -> list[list[float | None]]:
        """Log-probability of every token of every sequence given its prefix (element 0 is None), each
        token read with the softmax over its allowed ids if given and at its temperature (teachers)."""

    def sync_weights(self, model) -> None:
        """Policy backends: take the trainer's current weights (called after every optimizer step; a served backend
        defers the push to its next request, [`DeferredWeightPush`][multiagent_rl.backends.base.DeferredWeightPush])."""


class DeferredWeightPush:
    """For backends whose weights live elsewhere (a vLLM engine, a server): ``sync_weights(model)`` only notes that
    the sampler is behind, and the weights move right before it next samples or scores (``push_pending_weights``,
    called at the start of every request). A step where the policy samples nothing — a scripted warm-up, an
    imitation phase — moves no weights, and several optimizer steps without sampling move them once.

    A subclass implements ``push_weights(model)`` (the eager push). A push that fails leaves the weights pending,
    so every later request retries it and fails the same way: the sampler never samples silently with old weights.
    """

    _pending_model: Any = None
    num_weight_pushes: int = 0
    """Pushes made so far (what the deferral saves shows in it)."""

    def sync_weights(self, model) -> None:
        self._pending_model = model

    def push_weights(self, model) -> None:
        raise NotImplementedError

    def push_pending_weights(self) -> None:
        """Push the weights noted by the last ``sync_weights``, if any are still pending."""
        model = self._pending_model
        if model is None:
            return
        self.push_weights(model)
        self._pending_model = None
        self.num_weight_pushes += 1


def check_context(prompt_tokens: int, max_new_tokens: int, limit: int | None, model_id: str) -> None:
    """Refuse a request whose prompt plus reply would not fit the model's context."""
    if limit is not None and prompt_tokens + max_new_tokens > limit:
        raise ValueError(
            f"prompt of {prompt_tokens} tokens + max_new_tokens {max_new_tokens} exceeds the context of model "
            f"{model_id!r} ({limit} positions); shorten the prompt or the conversation, or lower max_new_tokens"
        )


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future


class TickBatcher:
    """Serves ``generate`` requests in batches: those that arrive in the same event-loop tick are served by one
    call of [`generate_batch`][multiagent_rl.backends.base.TickBatcher.generate_batch] per distinct sampling setting (at
    most ``max_batch_size`` prompts each), so 64 concurrent episodes cost about one model call per turn instead of 64.
    Subclasses set ``max_context``, ``model_id``, ``max_batch_size`` and ``gather_ticks`` and implement
    ``generate_batch``."""

    max_context: int | None = None
    max_batch_size: int = 256
    gather_ticks: int = 3

    def __init__(self) -> None:
        self._pending: list[_Request] = []
        self._worker: asyncio.Task | None = None

    def generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one continuation per prompt (token ids) with ``params``, in the prompts' order."""
        raise NotImplementedError

    async def generate(self, prompt_ids: list[int], params: SamplingParams, messages=None) -> Generation:
        if not prompt_ids:
            raise ValueError("generate() needs at least one prompt token")
        check_context(len(prompt_ids), params.max_new_tokens, self.max_context, self.model_id)
        future = asyncio.get_running_loop().create_future()
        self._pending.append(_Request(list(prompt_ids), params, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.ensure_future(self._serve())
        return await future

    async def _gather(self) -> None:
        """Let every episode that is about to ask for tokens reach its ``generate()`` call first: return once the
        pending requests stayed the same for ``gather_ticks`` event-loop ticks."""
        stable, seen = 0, -1
        while stable < self.gather_ticks:
            await asyncio.sleep(0)
            stable = stable + 1 if len(self._pending) == seen else 0
            seen = len(self._pending)

    async def _serve(self) -> None:
        while self._pending:
            await self._gather()
            batch, self._pending = self._pending, []
            groups: dict[SamplingParams, list[_Request]] = defaultdict(list)
            for req in batch:
                if not req.future.cancelled():
                    groups[req.params].append(req)
            for params, reqs in groups.items():
                for start in range(0, len(reqs), self.max_batch_size):
                    chunk = reqs[start : start + self.max_batch_size]
                    try:
                        results = self.generate_batch([r.prompt_ids for r in chunk], params)
                    except Exception as exc:  # surface the error in every waiting episode, keep serving
                        for r in chunk:
                            if not r.future.done():
                                r.future.set_exception(exc)
                        continue
                    for r, res in zip(chunk, results):
                        if not r.future.done():
                            r.future.set_result(res)
