"""Generation backends: one interface (token ids in, sampled ids and logprobs out)."""

from .base import Generation, GenerationBackend, SamplingParams
from .transformers import TransformersBackend

__all__ = ["Generation", "GenerationBackend", "SamplingParams", "TransformersBackend"]
