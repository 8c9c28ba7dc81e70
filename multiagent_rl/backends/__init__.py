"""Generation backends: one interface (token ids in, sampled ids and logprobs out; scoring for teachers).

[`build_backend`][multiagent_rl.backends.build_backend] turns a model reference from a config into a backend:

- ``"policy"``: the live policy the trainer passes in;
- ``"tiny"``, a Hub id or a local path: a frozen transformers model, loaded once per process and
  device however many seats and teachers name it;
- ``"vllm:URL#MODEL"``, ``"openai:URL#MODEL"`` or ``"endpoint:NAME"``: a model served elsewhere
  ([`endpoint`][multiagent_rl.backends.endpoint]), one client per reference.

[`build_policy_backend`][multiagent_rl.backends.build_policy_backend] builds the trained policy's: the live model itself
(transformers), an in-process vLLM engine ([`vllm_colocated`][multiagent_rl.backends.vllm_colocated]) or a vLLM server (``[model] backend = "vllm"``).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any

# TRL 1.16 warns, five times at import, that it supports vLLM 0.22-0.31 only. This package drives vLLM 0.32 through
# its own backends, not through TRL's vLLM integration, so the warning is silenced here, before TRL is imported (this
# package imports its backends before TRL); the colocated backend says once which versions run together.
warnings.filterwarnings("ignore", message=r"TRL currently supports vLLM versions", category=UserWarning)

from .base import Generation, GenerationBackend, SamplingParams, check_context  # noqa: E402
from .endpoint import (  # noqa: E402
    EndpointBackend, EndpointConfig, EndpointError, is_endpoint_reference, parse_reference,
)
from .transformers import TransformersBackend  # noqa: E402

logger = logging.getLogger(__name__)

POLICY = "policy"

_FROZEN: dict[tuple[str, str], GenerationBackend] = {}


def build_backend(model: str, *, device: Any = None, policy: GenerationBackend | None = None,
                  endpoints: dict[str, EndpointConfig] | None = None) -> GenerationBackend:
    """The backend serving ``model`` (see the module docstring); cached by (model, device) or by reference.

    ```pycon
    >>> backend = build_backend("tiny")  # doctest: +SKIP

    ```
    """
    if model == POLICY:
        if policy is None:
            raise ValueError("model='policy' binds a seat to the live policy, which only a trainer (or an "
                             "Orchestrator given a policy) provides")
        return policy
    if is_endpoint_reference(model):
        config = parse_reference(model, endpoints)
        key = (config.model_dump_json(), "endpoint")
        if key not in _FROZEN:
            _FROZEN[key] = EndpointBackend(config, model_id=model)
        return _FROZEN[key]
    import torch

    from ..models import load_model_and_tokenizer

    where = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    key = (model, str(where))
    if key not in _FROZEN:
        module, tok = load_model_and_tokenizer(model, device=where)
        module.eval().requires_grad_(False)
        _FROZEN[key] = TransformersBackend(module, tok, model_id=model)
    return _FROZEN[key]


def build_policy_backend(model_config: Any, live_model: Any, tokenizer: Any, *, max_batch_size: int = 256,
                         seed: int = 0, endpoints: dict[str, EndpointConfig] | None = None,
                         adapters: list[str] | None = None) -> GenerationBackend:
    """The trained policy's backend from ``[model]`` (a ``ModelConfig``): ``backend = "transformers"`` serves the
    live module itself; ``"vllm"`` an in-process engine (``vllm.mode = "colocate"``) or a server
    (``"server"``, ``vllm.base_url``), both fed the trainer's weights after an optimizer step, right before they
    next sample (``vllm.weight_handoff``: how a server gets them). A LoRA policy on the in-process engine is served
    as its adapter (vLLM's LoRA; ``adapters``: the PEFT adapters of several policies, the backend samples the first
    and its ``view(NAME)`` the others). A server is asked at once whether it is up and serves the model
    (``EndpointBackend.check_server``); its context length is the one it reports."""
    if model_config.backend == "transformers":
        return TransformersBackend(live_model, tokenizer, model_id=POLICY, max_batch_size=max_batch_size,
                                   **model_config.decoding)
    from ..models import resolve_model

    options = model_config.vllm
    path = resolve_model(model_config.name)
    if options.mode == "colocate":
        from .vllm_colocated import VLLMColocatedBackend

        loras = getattr(live_model, "peft_config", None) or {}  # a LoRA policy goes over as its adapter(s)
        adapters = adapters or ([live_model.active_adapter] if loras else None)
        rank = max((c.r for c in loras.values()), default=8)
        backend = VLLMColocatedBackend(
            path, tokenizer, max_model_len=options.max_model_len, gpu_memory_utilization=options.gpu_memory_utilization,
            kv_cache_memory_bytes=options.kv_cache_memory_bytes, seed=seed, max_batch_size=max_batch_size,
            adapter=adapters[0] if adapters else None, max_loras=len(adapters or ()) or 1,
            max_lora_rank=max(8, 1 << (rank - 1).bit_length()))
    else:
        served = EndpointConfig(kind="vllm", base_url=options.base_url, model=options.served_model or path,
                                api_key_env=options.api_key_env, timeout=options.timeout,
                                max_concurrency=options.max_concurrency)
        backend = EndpointBackend(served, tokenizer=tokenizer, model_id=POLICY, weight_handoff=options.weight_handoff,
                                  weights_dir=options.weights_dir)
        # a LoRA policy goes over as its adapter where the server takes adapters at runtime, else merged; several
        # policies must be adapters (one merged policy would overwrite the base all of them share)
        loras = getattr(live_model, "peft_config", None) or {}
        backend.adapter = adapters[0] if adapters else (live_model.active_adapter if loras else None)
        backend.may_merge = not adapters or len(loras) <= 1
        backend.check_server()  # up, serving this model? (else an EndpointError that says what to do) Its context:
        if backend.max_context is None:  # the server did not say
            backend.max_context = options.max_model_len
        elif "max_model_len" in options.model_fields_set and backend.max_context != options.max_model_len:
            logger.warning("[model.vllm] max_model_len = %d, but the server at %s serves %d positions: requests are "
                           "checked against the server's", options.max_model_len, options.base_url, backend.max_context)
    return backend


__all__ = ["EndpointBackend", "EndpointConfig", "EndpointError", "Generation", "GenerationBackend", "SamplingParams",
           "TransformersBackend", "build_backend", "build_policy_backend", "check_context"]
