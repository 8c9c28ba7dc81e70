"""OPSD: on-policy self-distillation from a demonstration-conditioned copy of the policy.

The teacher is the policy itself — ``frozen`` (a copy taken at setup) or ``live`` — shown a
hint (a system message holding a reference solution from the task) before the trace's tokens.
With h the hint tokens and y the trace's tokens, on each action token y_t::

    ref_logprobs_t = log π_T(y_t | h, y_<t)     (None on non-action tokens)
    ref_kl_t       = 1

The hint's own positions are not scored. The demonstration is ``task.data.info[demonstration_key]``,
falling back to ``task.data.answer``; traces of a task with neither get no streams and are
counted in ``skipped``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from ..backends import TransformersBackend
from ..backends.scoring import frozen_copy
from ..episodes.episode import Episode
from ..tasks.task import Task
from .base import Algorithm, AlgorithmConfig, AlgorithmContext, is_trained, register
from .opd import teacher_streams


class OPSDConfig(AlgorithmConfig):
    type: Literal["opsd"] = "opsd"
    """On-policy self-distillation: reverse KL toward the policy conditioned on a demonstration."""
    teacher: Literal["frozen", "live"] = "frozen"
    """``frozen``: a copy of the policy taken at setup; ``live``: the policy being trained."""
    demonstration_key: str = "demonstration"
    """Key of ``task.data.info`` holding the demonstration (falls back to ``task.data.answer``)."""
    template: str = "Here is a reference solution to learn from:\n{demonstration}"
    """System-message text of the hint; ``{demonstration}`` is replaced by the demonstration."""


@register
class OPSD(Algorithm):
    config_class = OPSDConfig
    loss_types = ("ref_kl",)

    config: OPSDConfig

    def __init__(self, config=None):
        super().__init__(config)
        self.teacher: Any = None
        self.tokenizer: Any = None
        self.skipped = 0
        self.temperature = 1.0
        """Traces that got no streams because their task has no demonstration."""

    async def setup(self, ctx: AlgorithmContext) -> None:
        if ctx.policy_backend is None or ctx.policy_model is None or ctx.tokenizer is None:
            raise ValueError("opsd needs the policy (backend and model) and its tokenizer in the AlgorithmContext")
        self.tokenizer, self.temperature = ctx.tokenizer, ctx.temperature
        if self.config.teacher == "live":
            self.teacher = ctx.policy_backend
        else:
            frozen = frozen_copy(ctx.policy_model)
            self.teacher = TransformersBackend(frozen, ctx.tokenizer, model_id="policy (frozen at setup)")

    def demonstration(self, task: Task) -> str | None:
        demo = task.data.info.get(self.config.demonstration_key)
        if demo is None:
            demo = task.data.answer
        return None if demo is None else str(demo)

    def hint_ids(self, demonstration: str) -> list[int]:
        content = self.config.template.format(demonstration=demonstration)
        ids = self.tokenizer.apply_chat_template([{"role": "system", "content": content}], tokenize=True)
        if isinstance(ids, Mapping) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        if ids and isinstance(ids[0], list):  # batched form of a single conversation
            ids = ids[0]
        return [int(t) for t in ids]

    async def score_episode(self, episode: Episode, roles: set[str] | None = None) -> None:
        traces = [t for t in episode.traces if is_trained(episode, t, roles)]
        if not traces:
            return
        demo = self.demonstration(episode.task)
        if demo is None:
            self.skipped += len(traces)
            return
        if self.teacher is None:
            raise RuntimeError("opsd.score_episode called before setup()")
        hint = self.hint_ids(demo)
        # the teacher reads each token as the student is trained: same allowed ids, same temperature
        scores = await self.teacher.score([hint + t.token_ids for t in traces],
                                          allowed=[[None] * len(hint) + t.allowed_token_ids for t in traces],
                                          temperatures=[[None] * len(hint) + t.loss_temperatures(self.temperature)
                                                        for t in traces])
        for trace, logprobs in zip(traces, scores):
            trace.streams = teacher_streams(self.name, trace, logprobs, offset=len(hint))
