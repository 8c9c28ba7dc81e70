"""Generation backends: one interface (token ids in, sampled ids and logprobs out; scoring for teachers).

:func:`build_backend` turns a model reference from a config into a backend:

- ``"policy"``: the live policy the trainer passes in;
- ``"tiny"``, a Hub id or a local path: a frozen transformers model, loaded once per process and
  device however many seats and teachers name it.
"""

from __future__ import annotations

from typing import Any

from .base import Generation, GenerationBackend, SamplingParams, check_context
from .transformers import TransformersBackend

POLICY = "policy"

_FROZEN: dict[tuple[str, str], GenerationBackend] = {}


def build_backend(model: str, *, device: Any = None, policy: GenerationBackend | None = None) -> GenerationBackend:
    """The backend serving ``model`` (see the module docstring); frozen ones are cached by (model, device).

    >>> backend = build_backend("tiny")  # doctest: +SKIP
    """
    if model == POLICY:
        if policy is None:
            raise ValueError("model='policy' binds a seat to the live policy, which only a trainer (or an "
                             "Orchestrator given a policy) provides")
        return policy
    import torch

    from ..models import load_model_and_tokenizer

    where = torch.device(device if device is not None else ("cuda" if torch.cuda.is_available() else "cpu"))
    key = (model, str(where))
    if key not in _FROZEN:
        module, tok = load_model_and_tokenizer(model, device=where)
        module.eval().requires_grad_(False)
        _FROZEN[key] = TransformersBackend(module, tok, model_id=model)
    return _FROZEN[key]


__all__ = ["Generation", "GenerationBackend", "SamplingParams", "TransformersBackend", "build_backend",
           "check_context"]
