"""The policy sampled by an in-process vLLM engine that shares the trainer's device (colocated mode).

Requests from every running episode are gathered per event-loop tick (as in the transformers
backend) and handed to one ``LLM.generate`` call; vLLM batches them. Token ids in, token ids and
their logprobs at the sampling temperature out (``logprobs_mode="processed_logprobs"``), constrained
choices through ``allowed_token_ids``, teacher scoring through ``prompt_logprobs``. After every optimizer
step the trainer pushes its weights in ([`push_weights`][multiagent_rl.backends.vllm_sync.push_weights]). The
engine runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``): on a CPU it starts in seconds.

The engine's torch process group is the default one of this process, which the trainer's end
(``accelerator.end_training()``) destroys; the backend's shutdown
([`shutdown_engine`][multiagent_rl.backends.vllm_colocated.shutdown_engine], at ``close()``, when the backend is
collected, or at exit) then releases the engine without destroying those groups a second time.
"""

from __future__ import annotations

import copy
import logging
import os
import shutil
import tempfile
import warnings
import weakref
from typing import Any

from .base import DeferredWeightPush, Generation, SamplingParams, TickBatcher

logger = logging.getLogger(__name__)
_said_versions = False
_REDUCE_OP = r"`torch.distributed.reduce_op` is deprecated"


def _say_versions_once() -> None:
    """One line instead of TRL's five import-time warnings about the vLLM version (silenced in ``backends``)."""
    global _said_versions
    if _said_versions:
        return
    _said_versions = True
    from importlib.metadata import PackageNotFoundError, version

    import vllm

    try:
        trl = version("trl")
    except PackageNotFoundError:
        trl = "?"
    logger.warning("vLLM %s with TRL %s: TRL lists vLLM 0.22-0.31 as tested; this package uses vLLM through its own "
                   "backends (tested with vLLM 0.32), not TRL's vLLM integration, so TRL's version warning is "
                   "silenced", vllm.__version__, trl)


def shutdown_engine(engine_core: Any) -> None:
    """Shut an in-process vLLM engine (``vllm.v1.engine.core.EngineCore``) down, also after the process group is gone.

    In one process vLLM makes the default torch process group its own and builds its groups on it. Destroying the
    default group (``accelerator.end_training()`` does at the end of a run) destroys them all, and vLLM's own shutdown
    would then destroy each of them again: ``ValueError: Invalid process group specified``, printed at exit by a run
    that succeeded. Its groups are then marked as already destroyed, so vLLM's teardown releases the rest quietly.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        from vllm.distributed import parallel_state

        for group in list(vars(parallel_state).values()):
            if isinstance(group, parallel_state.GroupCoordinator):
                for handle in ("device_group", "cpu_group"):
                    if hasattr(group, handle):
                        delattr(group, handle)
    engine_core.shutdown()


class VLLMColocatedBackend(DeferredWeightPush, TickBatcher):
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
                 seed: int = 0, enforce_eager: bool = True, max_batch_size: int = 256, adapter: str | None = None,
                 max_loras: int = 1, max_lora_rank: int = 16, policy_name: str | None = None):
        super().__init__()
        os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine in this process: weights by reference
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc with our own function
        import torch

        with warnings.catch_warnings():  # vLLM 0.32 reads torch.distributed's deprecated `reduce_op` when it loads
            warnings.filterwarnings("ignore", message=_REDUCE_OP, category=FutureWarning)
            from vllm import LLM

        options: dict[str, Any] = dict(model=model_path, tokenizer=model_path, max_model_len=max_model_len, seed=seed,
                                       enforce_eager=enforce_eager, logprobs_mode="processed_logprobs", max_logprobs=-1,
                                       dtype=dtype if dtype != "auto" or torch.cuda.is_available() else "float32")
        if torch.cuda.is_available():
            options["gpu_memory_utilization"] = gpu_memory_utilization
        if adapter is not None:  # the policy is a LoRA adapter: served as one (vLLM's LoRA), the base never moves
            options.update(enable_lora=True, max_loras=max_loras, max_lora_rank=max_lora_rank)
        options["kv_cache_memory_bytes"] = kv_cache_memory_bytes or (None if torch.cuda.is_available() else 64 << 20)
        _say_versions_once()
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_REDUCE_OP, category=FutureWarning)
            self.llm = LLM(**{k: v for k, v in options.items() if v is not None})
        self._shutdown = self._own_shutdown()
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.max_context = max_model_len
        self.max_batch_size = max_batch_size
        self.num_generate_calls = 0
        self.adapter = adapter
        """The PEFT adapter this backend samples (pushed as an adapter); None: the model's merged weights are pushed."""
        self.policy_name = policy_name
        self.lora_request = None
        """The engine's current version of ``adapter`` (None before the first push: the base model)."""
        self._adapters_dir = None if adapter is None else tempfile.mkdtemp(
            prefix="multiagent_rl-adapters-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        """Where pushed adapters are written (memory under /dev/shm where there is one), shared with the views."""
        if self._adapters_dir is not None:
            weakref.finalize(self, shutil.rmtree, self._adapters_dir, True)
        self._owns_engine = True

    def view(self, adapter: str, policy_name: str | None = None) -> VLLMColocatedBackend:
        """Another adapter of the same PEFT model on this engine (several policies): its own requests, batches and
        pushes, the engine shared (which ``max_loras`` sized for all of them)."""
        if self.adapter is None:
            raise ValueError("a view samples an adapter: build the engine with adapter=... (its LoRA support on)")
        other = copy.copy(self)
        TickBatcher.__init__(other)
        other.adapter, other.policy_name, other.lora_request, other._pending_model = adapter, policy_name, None, None
        other.num_weight_pushes = other.num_generate_calls = 0
        other._owns_engine = False  # closing a view leaves the engine and the adapters' folder to the owner
        return other

    def _own_shutdown(self) -> weakref.finalize | None:
        """Put [`shutdown_engine`][multiagent_rl.backends.vllm_colocated.shutdown_engine] in place of the engine
        client's own finalizer (which runs at exit or when the engine is collected); None if vLLM is not laid out as
        0.32 is (an in-process client with an ``engine_core`` and a ``_finalizer``)."""
        client = getattr(getattr(self.llm, "llm_engine", None), "engine_core", None)
        own = getattr(client, "_finalizer", None)
        if not isinstance(own, weakref.finalize) or not hasattr(client, "engine_core") or not own.alive:
            return None
        own.detach()
        client._finalizer = weakref.finalize(client, shutdown_engine, client.engine_core)
        return client._finalizer

    def close(self) -> None:
        """Shut the engine down now (idempotent; otherwise it happens when the backend is collected or at exit)."""
        if not self._owns_engine:
            return
        if self._shutdown is not None:
            self._shutdown()
        if self._adapters_dir is not None:
            shutil.rmtree(self._adapters_dir, ignore_errors=True)

    def _params(self, params: SamplingParams, **extra):
        from vllm import SamplingParams as VLLMParams

        return VLLMParams(temperature=params.temperature, top_p=params.top_p, max_tokens=params.max_new_tokens,
                          seed=params.seed, stop=list(params.stop) or None, logprobs=0,
                          allowed_token_ids=list(params.allowed_token_ids) if params.allowed_token_ids else None,
                          skip_special_tokens=False, **extra)

    def generate_batch(self, prompts: list[list[int]], params: SamplingParams) -> list[Generation]:
        """One ``LLM.generate`` call for prompts sharing the same sampling params."""
        from vllm.inputs import TokensPrompt

        self.push_pending_weights()
        self.num_generate_calls += 1
        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], self._params(params),
                                    use_tqdm=False, lora_request=self.lora_request)
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

        self.push_pending_weights()
        results: list[list[float | None]] = []
        for i, seq in enumerate(sequences):
            if len(seq) < 2:
                results.append([None] * len(seq))
                continue
            allowed_i = None if allowed is None else allowed[i]
            temps = None if temperatures is None else temperatures[i]
            full = any(a is not None for a in allowed_i or ()) or any(t not in (None, 1.0) for t in temps or ())
            (out,) = self.llm.generate([TokensPrompt(prompt_token_ids=seq)],
                                       VLLMParams(max_tokens=1, prompt_logprobs=-1 if full else 0), use_tqdm=False,
                                       lora_request=self.lora_request)
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

    def push_weights(self, model) -> None:
        """Into the engine now (``sync_weights`` defers this to the next request): this backend's adapter as an
        adapter, or the whole (merged) model."""
        from .vllm_sync import push_adapter, push_weights

        if self.adapter is None:
            push_weights(self.llm, model)
            return
        self.lora_request = push_adapter(self.llm, model, self.adapter, self.lora_request, self._adapters_dir)
