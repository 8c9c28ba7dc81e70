"""Traces: one agent's run on one task, at token level.

A trace is an ordered list of [`Segment`][multiagent_rl.episodes.trace.Segment] s. ``prompt`` segments are context the agent was
given, ``action`` segments were sampled by the agent (with their sampling logprobs),
``observation`` segments are text fed back in a later turn (environment, tool, other agents).
Multi-turn traces grow by appending segments; the tokens the model saw at turn k+1 are exactly
``trace.token_ids`` up to that point.

Algorithms attach per-token weight streams ([`TokenStreams`][multiagent_rl.episodes.trace.TokenStreams]) to trainable traces; the
collator turns them into tensors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from numbers import Real
from typing import Any, Literal

from .streams import STREAMS, stream_fields

SegmentKind = Literal["prompt", "action", "observation"]
KINDS = ("prompt", "action", "observation")


@dataclass
class Segment:
    """A run of tokens of one kind. ``logprobs`` is set on sampled actions only.

    ``allowed`` is set on actions a harness constrained to a choice: per token, the ids the policy
    could pick from (``None`` = the whole vocabulary). The loss scores such a token with the
    softmax over exactly that set, as it was sampled; a token with one allowed id was forced.
    """

    kind: SegmentKind
    token_ids: list[int]
    logprobs: list[float] | None = None
    allowed: list[list[int] | None] | None = None
    temperature: float | None = None
    """Sampling temperature of an action sampled by a model (the loss scores it at the same one)."""

    def __post_init__(self):
        if self.kind not in KINDS:
            raise ValueError(f"Segment kind must be one of {KINDS}, got {self.kind!r}")
        if self.logprobs is not None and len(self.logprobs) != len(self.token_ids):
            raise ValueError(
                f"Segment has {len(self.token_ids)} tokens but {len(self.logprobs)} logprobs; they must match"
            )
        if self.allowed is not None:
            if len(self.allowed) != len(self.token_ids):
                raise ValueError(
                    f"Segment has {len(self.token_ids)} tokens but {len(self.allowed)} allowed-id sets; they must match"
                )
            for t, ids in zip(self.token_ids, self.allowed):
                if ids is not None and t not in ids:
                    raise ValueError(f"token {t} is not among the ids {ids} it was constrained to")


@dataclass
class RewardRecord:
    """A named reward component; ``trace.reward`` is the weighted sum of these."""

    name: str
    value: float
    weight: float = 1.0


class TokenStreams:
    """Per-token training signal written by an algorithm, aligned with ``trace.token_ids``.

    One field per loss stream of [`STREAMS`][multiagent_rl.episodes.streams.STREAMS] (built in: ``advantages``, the rl
    stream's advantage of each token it trains, 0 elsewhere; ``ce_weights``; ``ref_kl_weights``) and the extra
    per-token values a stream reads (``ref_logprobs``: the teacher's logprob of each token, ``None`` where it has
    none). A field left ``None`` means the algorithm does not write it. ``algorithm`` is the tag used for metrics.

    ```pycon
    >>> s = TokenStreams("grpo", advantages=[0.0, 0.5])
    >>> s.advantages, s.ce_weights, s.written()
    ([0.0, 0.5], None, {'rl'})

    ```
    """

    def __init__(self, algorithm: str, **values: list | None):
        unknown = set(values) - set(stream_fields())
        if unknown:
            raise TypeError(f"TokenStreams has no field {sorted(unknown)}; the streams' fields are {stream_fields()}")
        object.__setattr__(self, "algorithm", algorithm)
        object.__setattr__(self, "values", {k: v for k, v in values.items() if v is not None})

    def __getattr__(self, name: str):
        if name in stream_fields():
            return self.__dict__["values"].get(name)
        raise AttributeError(f"TokenStreams has no attribute {name!r}; the streams' fields are {stream_fields()}")

    def __setattr__(self, name: str, value) -> None:
        if name == "algorithm":
            object.__setattr__(self, name, value)
        elif name in stream_fields():
            if value is None:
                self.values.pop(name, None)
            else:
                self.values[name] = value
        else:
            raise AttributeError(f"TokenStreams has no field {name!r}; the streams' fields are {stream_fields()}")

    def __eq__(self, other) -> bool:
        return isinstance(other, TokenStreams) and (self.algorithm, self.values) == (other.algorithm, other.values)

    def __repr__(self) -> str:
        fields = ", ".join(f"{k}={v!r}" for k, v in self.values.items())
        return f"TokenStreams({self.algorithm!r}{', ' if fields else ''}{fields})"

    def has_weight(self) -> bool:
        """Whether some stream puts a non-zero weight on some token."""
        return any(any(w != 0 for w in self.values.get(s.field) or ()) for s in STREAMS)

    def written(self) -> set[str]:
        """The names of the loss streams this object writes (e.g. ``{"rl"}``)."""
        return {s.name for s in STREAMS if s.field in self.values}

    def to_dict(self) -> dict[str, Any]:
        """``{"algorithm": ..., field: values, ...}`` with every stream field (None where not written)."""
        return {"algorithm": self.algorithm, **{f: self.values.get(f) for f in stream_fields()}}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> TokenStreams:
        return cls(d["algorithm"], **{k: v for k, v in d.items() if k != "algorithm" and v is not None})


@dataclass
class Trace:
    """One agent's run on one task.

    ```pycon
    >>> t = Trace(role="solver", segments=[Segment("prompt", [1, 2]), Segment("action", [3], [-0.5])])
    >>> t.token_ids, t.num_action_tokens
    ([1, 2, 3], 1)

    ```
    """

    role: str = "agent"
    """The seat (role) that produced this trace, e.g. ``"player_0"`` or ``"solver"``."""
    segments: list[Segment] = field(default_factory=list)
    trainable: bool = False
    model: str | None = None
    policy: str | None = None
    """Which policy played it: a learner's name (``"policy"`` for a run's one policy, else its ``[policies]``
    name) or a pool snapshot's (``"policy@200"``); None for frozen models and scripted seats."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    rewards: list[RewardRecord] = field(default_factory=list)
    metrics: dict[str, float] = field(default_factory=dict)
    info: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    last_reply: str | None = None
    streams: TokenStreams | None = None
    token_exact: bool = True
    """False when some reply's tokens were re-tokenised from a text endpoint's reply (not the model's own ids):
    such a trace is never trained on."""

    # -- tokens ---------------------------------------------------------------------------
    @property
    def token_ids(self) -> list[int]:
        return [t for s in self.segments for t in s.token_ids]

    @property
    def token_kinds(self) -> list[str]:
        return [s.kind for s in self.segments for _ in s.token_ids]

    @property
    def token_temperatures(self) -> list[float | None]:
        """Per token, the temperature it was sampled at (``None``: not sampled by a model)."""
        return [s.temperature for s in self.segments for _ in s.token_ids]

    def loss_temperatures(self, default: float) -> list[float]:
        """Per token, the temperature the loss (and a teacher scoring for it) reads it at: the one it was sampled at
        when the trained policy sampled it, else ``default`` (the trainer's): tokens of a hand-built trace, of a
        frozen or scripted seat, or appended by the env."""
        by_policy = self.model == "policy"
        return [t if (t is not None and by_policy) else default for t in self.token_temperatures]

    @property
    def sampling_logprobs(self) -> list[float | None]:
        out: list[float | None] = []
        for s in self.segments:
            out.extend(s.logprobs if s.logprobs is not None else [None] * len(s.token_ids))
        return out

    @property
    def allowed_token_ids(self) -> list[list[int] | None]:
        """Per token, the ids a constrained choice allowed (``None``: unconstrained)."""
        out: list[list[int] | None] = []
        for s in self.segments:
            out.extend(s.allowed if s.allowed is not None else [None] * len(s.token_ids))
        return out

    @property
    def num_action_tokens(self) -> int:
        return sum(len(s.token_ids) for s in self.segments if s.kind == "action")

    @property
    def prompt_length(self) -> int:
        """Length of the first prompt segment: what the collator treats as the sample's prompt."""
        return len(self.segments[0].token_ids) if self.segments and self.segments[0].kind == "prompt" else 0

    def append(
        self,
        kind: SegmentKind,
        token_ids: list[int],
        logprobs: list[float] | None = None,
        allowed: list[list[int] | None] | None = None,
        temperature: float | None = None,
    ) -> None:
        """Append tokens, merging with the last segment when it has the same kind and sampling temperature."""
        if not token_ids:
            return
        new = Segment(kind, list(token_ids), None if logprobs is None else list(logprobs),
                      None if allowed is None else [None if a is None else list(a) for a in allowed], temperature)
        last = self.segments[-1] if self.segments else None
        if (last is not None and last.kind == kind and (last.logprobs is None) == (logprobs is None)
                and last.temperature == temperature):
            if last.allowed is not None or new.allowed is not None:
                last.allowed = (last.allowed or [None] * len(last.token_ids)) + (new.allowed or [None] * len(token_ids))
            last.token_ids.extend(new.token_ids)
            if logprobs is not None:
                last.logprobs.extend(new.logprobs)
        else:
            self.segments.append(new)

    # -- rewards --------------------------------------------------------------------------
    @property
    def reward(self) -> float:
        """The weighted sum of the reward records (0.0 when there are none)."""
        return float(sum((r.value * r.weight for r in self.rewards), 0.0))

    def add_reward(self, name: str, value: float, weight: float = 1.0) -> None:
        """Record a named reward component (once per name: ``trace.reward`` is the weighted sum of the components).
        Raises ``ValueError`` for a value that is not a finite number or a name already recorded."""
        if any(r.name == name for r in self.rewards):
            raise ValueError(f"role {self.role!r}: reward {name!r} is already recorded on this trace; record each "
                             "component once under its own name (e.g. 'turn_1', 'turn_2'): the trace's reward is "
                             "their weighted sum")
        for what, x in (("reward", value), ("weight", weight)):
            if isinstance(x, bool) or not isinstance(x, Real) or not math.isfinite(x):
                raise ValueError(
                    f"role {self.role!r}: {what} of reward {name!r} is {x!r}, not a finite number; "
                    "rewards must be finite floats"
                )
        self.rewards.append(RewardRecord(name, float(value), float(weight)))

    def reward_problem(self, ranges: Mapping[str, tuple[float, float]] | None = None) -> str | None:
        """Why this trace's rewards cannot be trained on (a non-finite record, or a value outside its declared
        range in ``ranges``, reward name -> inclusive (low, high)), or None."""
        for r in self.rewards:
            if not (math.isfinite(r.value) and math.isfinite(r.weight)):
                return f"role {self.role!r}: reward {r.name!r} is {r.value} (weight {r.weight}), not a finite number"
            low, high = (ranges or {}).get(r.name, (-math.inf, math.inf))
            if not low <= r.value <= high:
                return (f"role {self.role!r}: reward {r.name!r} is {r.value:g}, outside its declared range "
                        f"[{low:g}, {high:g}] (the env's reward_ranges): not trained on")
        return None
