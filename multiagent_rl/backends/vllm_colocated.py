"""The policy sampled by an in-process vLLM engine that shares the trainer's device (colocated mode).

Requests from every running episode are gathered per event-loop tick (as in the transformers
backend) and handed to one ``LLM.generate`` call; vLLM batches them. Token ids in, token ids and
their logprobs at the sampling temperature out (``logprobs_mode="processed_logprobs"``), constrained
choices through ``allowed_token_ids``, teacher scoring through ``prompt_logprobs``. After every optimizer
step the trainer pushes its weights in ([`push_weights`][multiagent_rl.backends.vllm_sync.push_weights]). The
engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): on a CPU it starts in seconds.
"""

from __future__ import annotations

import os
from typing import Any

from .base import Generation, SamplingParams, TickBatcher


class VLLMColocatedBackend(TickBatcher):
    """An in-process ``vllm.LLM`` serving the policy (see the module docstring).

    ```pycon
    >>> backend = VLLMColocatedBackend("path/to/model", tokenizer, max_model_len=2048)  # doctest: +SKIP

    ```
    """

    supports_choices = True
    exact_logprobs = False
    """vLLM's kernels are not the trainer's: the trainer corrects the mismatch by importance sampling."""

    def __init__(self, model_path: str, tokenizer, *, model_id: str = "policy", max_model_len: int = 2048,
                 gpu_memory_utilization: float = 0.3, kv_cache_memory_bytes: int | None = None, dtype: str = "auto",
                 seed: int = 0, enforce_eager: bool = True, max_batch_size: int = 256):
        super().__init__()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: weights by reference
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with our own function
        import torch
        from vllm import LLM

        options: dict[str, Any] = dict(model=model_path, tokenizer=model_path, max_model_len=max_model_len, seed=seed,
                                       enforce_eager=enforce_eager, logprobs_mode="processed_logprobs", max_logprobs=-1,
                                       dtype=dtype if dtype != "auto" or torch.cuda.is_available() else "float32")
        if torch.cuda.is_available():
            options["gpu_memory_utilization"] = gpu_memory_utilization
        options["kv_cache_memory_bytes"] = kv_cache_memory_bytes or (None if torch.cuda.is_available() else 64 << 20)
        self.llm = LLM(**{k: v for k, v in options.items() if v is not None})
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.max_context = max_model_len
        self.max_batch_size = max_batch_size
        self.num_generate_calls = 0

    def _params(self, params: SamplingParams, **extra):
        from vllm import SamplingParams as VLLMParams

        return VLLMParams(temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
                          seed=params.seed, stop=list(params.stop) or None, logprobs=0,
                          allowed_token_ids=list(params.allowed_token_ids) if params.allowed_token_ids else None,
                          skip_special_tokens=False, **extra)

    def generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One ``LLM.generate`` call for prompts sharing the same sampling params."""
        from vllm.inputs import TokensPrompt

        self.num_generate_calls += 1
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], self._params(params),
                                    use_tqdm=False)
        results = []
        for out in outputs:
            completion = out.outputs[0]
            ids = list(completion.token_ids)
            logprobs = [step[token].logprob for step, token in zip(completion.logprobs, ids)]
            reason = "length" if completion.finish_reason == "length" else (
                "stop_string" if isinstance(completion.stop_reason, str) else "stop")
            results.append(Generation(ids, logprobs, reason))
        return results

    async def score(self, sequences, allowed=None, temperatures=None) -> list[list[float | None]]:
        """Logprob of every token given its prefix (``prompt_logprobs``); whole rows when a temperature other
        than 1 or constrained choices ask for renormalising."""
        import math

        from vllm import SamplingParams as VLLMParams
        from vllm.inputs import TokensPrompt

        results: list[list[float | None]] = []
        for i, seq in enumerate(sequences):
            if len(seq) < 2:
                results.append([None] * len(seq))
                continue
            allowed_i = None if allowed is None else allowed[i]
            temps = None if temperatures is None else temperatures[i]
            full = any(a is not None for a in allowed_i or ()) or any(t not in (None, 1.0) for t in temps or ())
            (out,) = self.llm.generate([TokensPrompt(prompt_token_ids=seq)],
                                       VLLMParams(max_tokens=1, prompt_logprobs=-1 if full else 0), use_tqdm=False)
            rows = out.prompt_logprobs
            scores: list[float | None] = [None]
            for j in range(1, len(seq)):
                row = {k: v.logprob for k, v in rows[j].items()}
                if not full:
                    scores.append(row[seq[j]])
                    continue
                t = 1.0 if temps is None or temps[j] is None else float(temps[j])
                ids = allowed_i[j] if allowed_i is not None and allowed_i[j] is not None else None
                scaled = {k: lp / t for k, lp in row.items() if ids is None or k in ids}
                top = max(scaled.values())
                scores.append(scaled[seq[j]] - top - math.log(sum(math.exp(v - top) for v in scaled.values())))
            results.append(scores)
        return results

    def sync_weights(self, model) -> None:
        from .vllm_sync import push_weights

        push_weights(self.llm, model)
