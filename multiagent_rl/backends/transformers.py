"""Local generation with transformers, batched across every concurrently running episode.

Agents ``await backend.generate(ids, params)``; the backend gathers the requests that arrive in the
same event-loop tick and serves them as one batched decode loop (one per distinct sampling setting),
so 64 concurrent episodes cost about one batched call per turn instead of 64. Logprobs come from the
raw logits of the very forward passes that sampled the tokens. A multi-turn conversation's next prompt
extends its last one token for token, so the keys and values computed for the earlier turns are kept
([`PrefixCache`][multiagent_rl.backends.prefix_cache.PrefixCache]) and only the new tokens are encoded.
"""

from __future__ import annotations

import asyncio
import inspect

import torch

from ..models.adapters import use_adapter
from .base import Generation, SamplingParams, TickBatcher
from .decoding import Decoding, Row
from .prefix_cache import PrefixCache
from .scoring import eval_mode, model_device, token_logprobs


class TransformersBackend(TickBatcher):
    """Serve a (live or frozen) transformers causal LM to many agents at once.

    The trainer's policy backend wraps the very module being trained, so its weights are always
    current (``sync_weights`` has nothing to copy); frozen seats and teachers get their own copy.

    ```pycon
    >>> backend = TransformersBackend(model, tokenizer)  # doctest: +SKIP
    >>> gen = await backend.generate(prompt_ids, SamplingParams(max_new_tokens=8))  # doctest: +SKIP

    ```
    """

    supports_choices = True
    exact_logprobs = True
    """Its logprobs come from the trainer's own forward passes: no sampler/trainer mismatch to correct."""
    join_every = 8
    """Requests that arrive during a decode join it once they have waited this many tokens (or are as many as the
    running rows): each join copies the running rows' keys and values, so joining one by one would cost more."""
    prefix_min_tokens = 128
    """Conversations shorter than this are not kept in the prefix cache: encoding them again costs less than keeping
    them (a game's one-line prompts)."""

    def __init__(self, model, tokenizer, model_id: str = "policy", max_batch_size: int = 256, gather_ticks: int = 3,
                 adapter: str | None = None, policy_name: str | None = None, prefix_cache_mb: int = 1024,
                 continuous_batching: bool | None = None):
        super().__init__()
        self.model = model
        self.adapter = adapter
        """The LoRA adapter of ``model`` this backend samples with (several policies share one base model); None:
        the model as it is."""
        self.policy_name = policy_name
        """Which policy (or pool snapshot) this backend plays, recorded on every trace (its ``policy`` column)."""
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.max_batch_size = max_batch_size
        self.gather_ticks = gather_ticks
        self.eos_token_ids = _eos_ids(model, tokenizer)
        self.pad_token_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_token_ids[0]
        self.max_context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
        """Most positions the model takes (prompt + reply); None when the model does not say."""
        self.num_generate_calls = 0
        self.num_requests = 0
        self.cache_argument = _cache_argument(model)
        self.reusable_cache = _reusable_cache(model)
        """Whether every layer attends to the whole sequence, so cached keys and values can be reused and batches merged
        (else each batch decodes alone with the cache the model's config asks for)."""
        if continuous_batching is None:  # on a CPU each join's copies cost about what batching saves: off by default
            continuous_batching = model_device(model).type == "cuda"
        self.continuous_batching = continuous_batching and self.reusable_cache
        """Requests join a running decode between two tokens (default: for a model on a GPU; on a CPU it depends on the
        workload, docs/speed_results.md); False, and for a model whose cache cannot be merged: the requests of one tick
        are decoded to the end together while later ones wait."""
        self.prefix_cache = PrefixCache(prefix_cache_mb << 20) if prefix_cache_mb and self.reusable_cache else None
        """The keys and values of the conversations so far (``prefix_cache_mb``; None: every prompt encoded whole, and
        for models with sliding-window or recurrent layers)."""
        self.num_forward_passes = 0

    async def score(self, sequences, allowed=None, temperatures=None) -> list[list[float | None]]:
        with use_adapter(self.model, self.adapter):
            return token_logprobs(self.model, sequences, batch_size=16, allowed=allowed, temperatures=temperatures)

    def sync_weights(self, model) -> None:
        if model is self.model or any(part is self.model for part in model.modules()):
            return  # it samples the live module (or one policy's model in it): nothing to copy
        self.model.load_state_dict(model.state_dict())

    def generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Sample one reply per prompt with ``params``: one batched forward pass per new token, each prompt's longest
        cached prefix read from ``prefix_cache`` (the episodes' requests take ``generate``, where later requests join
        a running decode)."""
        replies: list[Generation | None] = [None] * len(prompts)

        def deliver_to(i):
            return lambda reply: replies.__setitem__(i, reply)

        decoding = Decoding(self, params)
        decoding.join([Row(list(p), deliver_to(i)) for i, p in enumerate(prompts)])
        while decoding.rows:
            decoding.step()
        self.num_generate_calls += 1
        self.num_requests += len(prompts)
        return replies

    async def _serve(self) -> None:
        """The requests gathered in a few event-loop ticks decode together, one sampling setting at a time; every
        finished reply is delivered at once, and a cancelled one leaves. With ``continuous_batching`` requests with the
        running decode's setting join it between two tokens, so an episode's next request can join the same decode
        (other settings wait until it empties; none joins while they wait); without it, later requests wait for it to
        end."""
        while self._pending:
            await self._gather()
            params = self._pending[0].params
            decoding = Decoding(self, params)
            self.num_generate_calls += 1
            waited = 0  # tokens decoded since requests started waiting to join
            while True:
                joining = [r for r in self._pending if r.params == params and not r.future.cancelled()]
                others = any(r.params != params for r in self._pending)
                room = self.max_batch_size - len(decoding.rows)
                waited = waited + 1 if joining else 0
                # a join copies the running rows' keys and values once, so joiners gather for a few tokens first
                due = not decoding.rows or self.continuous_batching and (
                    waited > self.join_every or len(joining) >= len(decoding.rows))
                if joining and room > 0 and due and not (others and decoding.rows):
                    waited = 0
                    joining = joining[:room]
                    taken = set(map(id, joining))
                    self._pending = [r for r in self._pending if id(r) not in taken]
                    self.num_requests += len(joining)
                    self._run(decoding, decoding.join, [Row(r.prompt_ids, _settle(r.future, "set_result"),
                                                            cancelled=r.future.cancelled,
                                                            fail=_settle(r.future, "set_exception"))
                                                        for r in joining])
                elif decoding.rows:
                    self._run(decoding, decoding.step)
                if not decoding.rows:
                    break
                await asyncio.sleep(0)  # the episodes whose replies arrived go on, and may ask again
            self._pending = [r for r in self._pending if not r.future.cancelled()]

    @staticmethod
    def _run(decoding: Decoding, method, *args) -> None:
        """``method(*args)``, surfacing an error in every request it touched and serving on: a failed join fails its
        joiners (the running rows go on), a failed step every row of the decode."""
        joiners = args[0] if args else []
        running = len(decoding.rows)
        try:
            method(*args)
        except Exception as exc:
            failed = joiners if joiners and len(decoding.rows) == running else [*decoding.rows, *joiners]
            for row in failed:
                row.fail(exc)
            if failed is not joiners:
                decoding.rows = []

    def finish(self, ids: list[int], logps: list[float], params: SamplingParams) -> Generation:
        eos = next((i for i, t in enumerate(ids) if t in self.eos_token_ids), None)
        end, reason = (eos + 1, "stop") if eos is not None else (len(ids), "length")
        if params.stop:
            # The reply ends at the token that completed the first stop string.
            for i in range(end):
                text = self.tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
                if any(s in text for s in params.stop):
                    end, reason = i + 1, "stop_string"
                    break
        return Generation(ids[:end], logps[:end], reason)


def _settle(future: asyncio.Future, how: str):
    """A callback that settles ``future`` (``set_result`` or ``set_exception``) unless it is already done."""
    return lambda value: None if future.done() else getattr(future, how)(value)


def _eos_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else ([ids] if isinstance(ids, int) else list(ids))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("The model has no end-of-sequence token: set generation_config.eos_token_id")
    return ids


def _cache_argument(model) -> str:
    """The forward argument that takes a cache: ``cache`` (transformers 5.20 and later) or ``past_key_values``."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return "cache" if "cache" in inspect.signature(base.forward).parameters else "past_key_values"


def _reusable_cache(model) -> bool:
    """Whether every layer attends to the whole sequence (a sliding-window or recurrent layer keeps other state)."""
    config = getattr(model, "config", None)
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    types = getattr(config, "layer_types", None)
    return types is None or all(t == "full_attention" for t in types)
