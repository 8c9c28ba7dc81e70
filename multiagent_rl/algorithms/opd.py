"""OPD: on-policy distillation from a teacher model.

The policy samples; a frozen teacher scores the same tokens. On each action token y_t::

    ref_logprobs_t = log π_T(y_t | y_<t)       (None on non-action tokens)
    ref_kl_t       = 1

and the loss pushes log π_θ(y_t) toward log π_T(y_t) with the per-token signal
log π_T(y_t) − log π_θ(y_t) (sampled-token reverse KL). The teacher reads each token at the
temperature the policy sampled it at, and with the same restricted softmax when a harness
constrained it to choices, exactly as the loss reads the student. Teacher and policy must share a
tokenizer. The teacher is a generation backend (``build_backend(teacher)``: a local or Hub model,
loaded once however many configs name it); one config names one teacher, and per-env or per-role
teachers come from several ``opd`` configs (one instance per distinct config).
"""

from __future__ import annotations

from typing import Any, Literal

from ..episodes.episode import Episode
from ..episodes.trace import TokenStreams, Trace
from .base import Algorithm, AlgorithmConfig, AlgorithmContext, is_trained, register


class OPDConfig(AlgorithmConfig):
    type: Literal["opd"] = "opd"
    """On-policy distillation: reverse KL toward a teacher's logprobs on the policy's own samples."""
    teacher: str
    """The teacher: ``"tiny"``, a Hub id or a local path (it must use the policy's tokenizer)."""


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
    return TokenStreams(algorithm=name, ref_kl_weights=weight, ref_logprobs=ref)


@register
class OPD(Algorithm):
    config_class = OPDConfig
    loss_types = ("ref_kl",)

    config: OPDConfig

    def __init__(self, config=None):
        super().__init__(config)
        self.teacher: Any = None
        self.temperature = 1.0

    async def setup(self, ctx: AlgorithmContext) -> None:
        if ctx.load_backend is None:
            raise ValueError(f"opd needs AlgorithmContext.load_backend to load its teacher {self.config.teacher!r}")
        self.teacher = ctx.load_backend(self.config.teacher)
        self.temperature = ctx.temperature
        check_same_vocabulary(ctx.tokenizer, self.teacher.tokenizer, f"opd teacher {self.config.teacher!r}")

    async def score_episode(self, episode: Episode, roles: set[str] | None = None) -> None:
        traces = [t for t in episode.traces if is_trained(episode, t, roles)]
        if not traces:
            return
        if self.teacher is None:
            raise RuntimeError("opd.score_episode called before setup()")
        # the teacher reads each token as the student is trained: same allowed ids, same temperature
        scores = await self.teacher.score([t.token_ids for t in traces], allowed=[t.allowed_token_ids for t in traces],
                                          temperatures=[t.loss_temperatures(self.temperature) for t in traces])
        for trace, logprobs in zip(traces, scores):
            trace.streams = teacher_streams(self.name, trace, logprobs)


def check_same_vocabulary(policy_tokenizer: Any, teacher_tokenizer: Any, who: str) -> None:
    """Refuse a teacher whose tokenizer differs from the policy's (its logprobs would be of other tokens)."""
    if policy_tokenizer is None or teacher_tokenizer is None:
        return
    if policy_tokenizer.get_vocab() != teacher_tokenizer.get_vocab():
        raise ValueError(
            f"{who} has a different tokenizer than the policy ({len(teacher_tokenizer)} vs {len(policy_tokenizer)} "
            "tokens): a teacher must share the policy's tokenizer"
        )
