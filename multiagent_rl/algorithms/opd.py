"""OPD: on-policy distillation from a teacher model.

The policy samples; a frozen teacher scores the same tokens. On each action token y_t::

    ref_logprobs_t = log π_T(y_t | y_<t)       (None on non-action tokens)
    ref_kl_t       = 1

and the loss pushes log π_θ(y_t) toward log π_T(y_t) with the per-token signal
log π_T(y_t) − log π_θ(y_t) (sampled-token reverse KL). Teacher and policy must share a
tokenizer. One config names one teacher; per-env or per-role teachers come from several
``opd`` configs (the trainer builds one instance per distinct config).
"""

from __future__ import annotations

from typing import Any, Literal

from ..episode import Episode
from ..scoring import token_logprobs, vocab_size
from ..trace import TokenStreams, Trace
from .base import Algorithm, AlgorithmConfig, AlgorithmContext, is_trained, register


class OPDConfig(AlgorithmConfig):
    type: Literal["opd"] = "opd"
    """On-policy distillation: reverse KL toward a teacher's logprobs on the policy's own samples."""
    teacher: str
    """Teacher model id or local path (must use the policy's tokenizer)."""
    batch_size: int = 16
    """Traces per teacher forward pass."""


def teacher_streams(name: str, trace: Trace, logprobs: list[float | None], offset: int = 0) -> TokenStreams:
    """ref_logprobs/ref_kl on the trace's action tokens from a teacher's per-token logprobs.

    ``logprobs[offset + j]`` is the teacher's logprob of ``trace.token_ids[j]`` (``offset`` skips
    positions of a prefix the teacher saw but the trace does not have).
    """
    ref: list[float | None] = []
    weight: list[float] = []
    for j, kind in enumerate(trace.token_kinds):
        lp = logprobs[offset + j] if kind == "action" else None
        ref.append(lp)
        weight.append(1.0 if lp is not None else 0.0)
    return TokenStreams(algorithm=name, ref_kl=weight, ref_logprobs=ref)


def check_vocab(model: Any, sequences: list[list[int]], who: str) -> None:
    """Raise a clear error when a token id is outside ``model``'s vocabulary."""
    size = vocab_size(model)
    if size is None:
        return
    top = max((max(s) for s in sequences if s), default=-1)
    if top >= size:
        raise ValueError(
            f"{who} has a vocabulary of {size} tokens but the traces contain token id {top}: "
            "the teacher must share the policy's tokenizer"
        )


@register
class OPD(Algorithm):
    config_class = OPDConfig
    loss_types = ("ref_kl",)

    config: OPDConfig

    def __init__(self, config=None):
        super().__init__(config)
        self.teacher: Any = None

    async def setup(self, ctx: AlgorithmContext) -> None:
        if ctx.load_model is None:
            raise ValueError(f"opd needs AlgorithmContext.load_model to load its teacher {self.config.teacher!r}")
        self.teacher = ctx.load_model(self.config.teacher)
        size = vocab_size(self.teacher)
        if ctx.tokenizer is not None and size is not None:
            try:
                n = len(ctx.tokenizer)
            except TypeError:
                n = None
            if n is not None and n > size:
                raise ValueError(
                    f"opd teacher {self.config.teacher!r} has a vocabulary of {size} tokens, smaller than the "
                    f"policy tokenizer's {n}: the teacher must share the policy's tokenizer"
                )

    async def score_episode(self, episode: Episode, roles: set[str] | None = None) -> None:
        traces = [t for t in episode.traces if is_trained(episode, t, roles)]
        if not traces:
            return
        if self.teacher is None:
            raise RuntimeError("opd.score_episode called before setup()")
        sequences = [t.token_ids for t in traces]
        check_vocab(self.teacher, sequences, f"opd teacher {self.config.teacher!r}")
        allowed = [t.allowed_token_ids for t in traces]
        temperatures = [t.token_temperatures for t in traces]  # the teacher is read as the student is trained
        scores = token_logprobs(self.teacher, sequences, batch_size=self.config.batch_size, allowed=allowed,
                                temperatures=temperatures)
        for trace, logprobs in zip(traces, scores):
            trace.streams = teacher_streams(self.name, trace, logprobs)
