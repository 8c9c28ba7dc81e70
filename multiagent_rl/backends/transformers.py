"""Local generation with transformers, batched across every concurrently running episode.

Agents ``await backend.generate(ids, params)``; the backend gathers the requests that arrive in the
same event-loop tick and serves them as one left-padded ``model.generate`` call (one call per
distinct sampling setting), so 64 concurrent episodes cost about one batched call per turn instead
of 64. Logprobs come from the raw logits of the very forward passes that sampled the tokens.
"""

from __future__ import annotations

import contextlib

import torch

from ..models.adapters import use_adapter
from .base import Generation, SamplingParams, TickBatcher
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

    def __init__(self, model, tokenizer, model_id: str = "policy", max_batch_size: int = 256, gather_ticks: int = 3,
                 adapter: str | None = None, policy_name: str | None = None):
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

    async def score(self, sequences, allowed=None, temperatures=None) -> list[list[float | None]]:
        with use_adapter(self.model, self.adapter):
            return token_logprobs(self.model, sequences, batch_size=16, allowed=allowed, temperatures=temperatures)

    def sync_weights(self, model) -> None:
        if model is not self.model:
            self.model.load_state_dict(model.state_dict())

    logits_budget_bytes: int = 1 << 30
    """Most bytes of per-step logits one ``generate`` call may hold (rows × new tokens × vocabulary × 4):
    a larger batch is split into calls that fit, so a 49k-word vocabulary does not hold gigabytes."""

    @torch.no_grad()
    def generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """Padded ``generate`` calls for prompts sharing the same sampling params (split to fit
        `logits_budget_bytes`; each later part gets its own seed derived from ``params.seed``)."""
        vocab = getattr(getattr(self.model, "config", None), "vocab_size", None) or 1
        rows = max(1, self.logits_budget_bytes // (4 * vocab * max(params.max_new_tokens, 1)))
        out = []
        with use_adapter(self.model, self.adapter):
            for k, start in enumerate(range(0, len(prompts), rows)):
                part = params if params.seed is None or k == 0 else params.model_copy(
                    update={"seed": (params.seed + 1_000_003 * k) % 2**63})
                out.extend(self._generate_part(prompts[start:start + rows], part))
        return out

    def _generate_part(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        model = self.model
        device = model_device(model)
        width = max(len(p) for p in prompts)
        input_ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every row's next token lands in the last column
            input_ids[i, width - len(p) :] = torch.tensor(p)
            attention_mask[i, width - len(p) :] = 1
        if params.max_new_tokens == 1:
            return self._one_token(input_ids.to(device), attention_mask.to(device), params)
        greedy = params.temperature == 0
        kwargs = dict(
            do_sample=not greedy,
            max_new_tokens=params.max_new_tokens,
            output_logits=True,
            return_dict_in_generate=True,
            eos_token_id=self.eos_token_ids,
            pad_token_id=self.pad_token_id,
            top_k=0,
            use_cache=True,
        )
        if not greedy:
            kwargs.update(temperature=params.temperature, top_p=params.top_p)
        if params.stop:
            kwargs.update(stop_strings=list(params.stop), tokenizer=self.tokenizer)
        if params.allowed_token_ids is not None:
            from transformers import LogitsProcessorList

            kwargs.update(logits_processor=LogitsProcessorList([_AllowOnly(params.allowed_token_ids)]))
        seed_ctx = contextlib.nullcontext()
        if params.seed is not None:
            seed_ctx = torch.random.fork_rng(devices=[device] if device.type == "cuda" else [])
        with eval_mode(model), seed_ctx:
            if params.seed is not None:
                torch.manual_seed(params.seed)
            out = model.generate(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), **kwargs)
        self.num_generate_calls += 1
        self.num_requests += len(prompts)
        new_tokens = out.sequences[:, width:]
        scale = 1.0 if greedy else params.temperature
        # Step by step: stacking the raw (B, V) logits of every step would copy them several times over.
        logps = torch.stack([
            torch.log_softmax(_allow_only(step.float(), params.allowed_token_ids) / scale, dim=-1)
            .gather(-1, new_tokens[:, t : t + 1].to(step.device)).squeeze(-1)
            for t, step in enumerate(out.logits)], dim=1).cpu()
        new_tokens = new_tokens.cpu()
        return [self._finish(new_tokens[i].tolist(), logps[i].tolist(), params) for i in range(len(prompts))]

    def _one_token(self, input_ids, attention_mask, params: SamplingParams) -> list[Generation]:
        """One-token replies (e.g. game moves) need no decode loop: one forward pass, sampled here.

        Sampling uses transformers' own temperature/top-p warpers, so it matches ``generate``.
        """
        from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

        with eval_mode(self.model):
            position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
            logits = self.model(
                input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logits_to_keep=1
            ).logits[:, -1].float()
        logits = _allow_only(logits, params.allowed_token_ids)
        self.num_generate_calls += 1
        self.num_requests += len(input_ids)
        if params.temperature == 0:
            tokens = logits.argmax(-1)
            logps = torch.log_softmax(logits, -1)
        else:
            logps = torch.log_softmax(logits / params.temperature, -1)
            warped = TemperatureLogitsWarper(params.temperature)(input_ids, logits)
            if params.top_p < 1.0:
                warped = TopPLogitsWarper(params.top_p)(input_ids, warped)
            generator = None
            if params.seed is not None:
                generator = torch.Generator(device=logits.device).manual_seed(params.seed)
            tokens = torch.multinomial(torch.softmax(warped, -1), 1, generator=generator).squeeze(-1)
        chosen = logps.gather(-1, tokens[:, None]).squeeze(-1).cpu().tolist()
        return [self._finish([t], [lp], params) for t, lp in zip(tokens.cpu().tolist(), chosen)]

    def _finish(self, ids: list[int], logps: list[float], params: SamplingParams) -> Generation:
        eos = next((i for i, t in enumerate(ids) if t in self.eos_token_ids), None)
        end, reason = (eos + 1, "stop") if eos is not None else (len(ids), "length")
        if params.stop:
            # generate() pads a row stopped by a stop string; find where the string completed.
            for i in range(end):
                text = self.tokenizer.decode(ids[: i + 1], skip_special_tokens=True)
                if any(s in text for s in params.stop):
                    end, reason = i + 1, "stop_string"
                    break
        return Generation(ids[:end], logps[:end], reason)


def _allow_only(logits: torch.Tensor, allowed: tuple[int, ...] | None) -> torch.Tensor:
    """``logits`` with every token outside ``allowed`` at -inf (unchanged when ``allowed`` is None)."""
    if allowed is None:
        return logits
    keep = torch.zeros(logits.size(-1), dtype=torch.bool, device=logits.device)
    keep[list(allowed)] = True
    return logits.masked_fill(~keep, float("-inf"))


class _AllowOnly:
    """A ``generate`` logits processor that restricts every step to ``allowed`` tokens."""

    def __init__(self, allowed: tuple[int, ...]):
        self.allowed = allowed

    def __call__(self, input_ids, scores):
        return _allow_only(scores, self.allowed)


def _eos_ids(model, tokenizer) -> list[int]:
    ids = model.generation_config.eos_token_id
    ids = [] if ids is None else ([ids] if isinstance(ids, int) else list(ids))
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError("The model has no end-of-sequence token: set generation_config.eos_token_id")
    return ids
