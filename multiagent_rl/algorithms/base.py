"""The algorithm contract, the registry, and helpers shared by the algorithm files.

An algorithm turns finished episodes into per-token training signal. It writes a
[`TokenStreams`][multiagent_rl.episodes.trace.TokenStreams] onto each trace it trains (aligned with
``trace.token_ids``) and touches nothing else. It only ever trains a trace that is
``trainable``, has no ``error``, belongs to an episode with ``ok`` True, and whose role
(``trace.role``) is in the ``roles`` it was handed (``None`` = every role).

The trainer calls, per training step::

    await algo.setup(ctx)                        # once
    await algo.score_episode(episode, roles)     # per episode (teacher scoring)
    algo.score_group(episodes, roles)            # per task group: the G episodes of one task

Configs are pydantic models with a ``type`` discriminator; ``@register`` adds a class to
[`ALGORITHMS`][multiagent_rl.algorithms.base.ALGORITHMS] under its config's ``type``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

import pydantic
from pydantic import ConfigDict

from ..episodes.episode import Episode
from ..episodes.streams import stream_names
from ..episodes.trace import Trace
from ..registry import Registry


class AlgorithmConfig(pydantic.BaseModel):
    """Base of every algorithm config; ``type`` selects the algorithm."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    type: str
    """Registered algorithm name (``grpo``, ``max_rl``, ``rae``, ...)."""


@dataclass
class AlgorithmContext:
    """What the rollout engine hands to [`Algorithm.setup`][multiagent_rl.algorithms.base.Algorithm.setup]."""

    policy_backend: Any = None
    """The live policy as a generation backend (``generate``, ``score``), or None where no model is involved."""
    policy_model: Any = None
    """The live policy as a torch module (to take a frozen copy of it), or None."""
    tokenizer: Any = None
    """The policy's tokenizer, or None."""
    load_backend: Callable[[str], Any] | None = None
    """Model reference -> backend (``build_backend``); cached, so a teacher named twice is loaded once."""
    temperature: float = 1.0
    """The trainer's sampling temperature: what the loss reads a token at when no model recorded one
    (``Trace.loss_temperatures``), so a teacher reads those tokens the same way."""


class Algorithm:
    """Base class: override [`score_group`][multiagent_rl.algorithms.base.Algorithm.score_group] (credit) and/or
    [`score_episode`][multiagent_rl.algorithms.base.Algorithm.score_episode] (per-episode work)."""

    config_class: ClassVar[type[AlgorithmConfig]] = AlgorithmConfig
    loss_types: ClassVar[tuple[str, ...]] = ()
    """Streams this algorithm writes: a subset of ("rl", "ce", "ref_kl")."""
    required_streams: ClassVar[tuple[str, ...] | None] = None
    """Streams that must receive tokens whenever this algorithm trains a seat (default: ``loss_types``);
    a run where one stays empty for several steps in a row trains nothing and is stopped."""
    samples_from_policy: ClassVar[bool] = True
    """False when the trained tokens come from someone else (a frozen teacher, a scripted agent)."""
    uses_reward: ClassVar[bool] = False
    """True when credit is computed from ``trace.reward``: a trained trace without any reward record fails its
    episode (a silent 0.0 would train on a reward nobody gave)."""
    reward_range: ClassVar[tuple[float, float] | None] = None
    """Closed interval the rewards must lie in (e.g. (0, 1) for success rates), or None."""

    @classmethod
    def needs_group(cls, config: AlgorithmConfig, role: str | None) -> bool:
        """Whether credit for ``role`` compares the episodes of a task group (so a group of 1 trains nothing)."""
        return False

    @classmethod
    def streams_required(cls) -> tuple[str, ...]:
        return cls.loss_types if cls.required_streams is None else cls.required_streams

    def stream_problem(self, trace: Trace) -> str | None:
        """Why the streams written on ``trace`` break this algorithm's declared ``loss_types``, or None."""
        if trace.streams is None:
            return None
        extra = trace.streams.written() - set(self.loss_types)
        if extra:
            return (f"{type(self).__name__} wrote the {', '.join(sorted(extra))} stream on role {trace.role!r} "
                    f"but declares loss_types = {self.loss_types!r}; declare every stream it writes")
        return None

    def reward_problem(self, trace: Trace) -> str | None:
        """Why ``trace``'s rewards cannot be used by this algorithm, or None."""
        if self.uses_reward and not trace.rewards:
            return (f"role {trace.role!r} recorded no reward, but {self.name} computes credit from rewards; call "
                    "trace.add_reward(name, value) in the env's run() or finalize()")
        if self.reward_range is not None:
            low, high = self.reward_range
            if not low <= trace.reward <= high:
                return (f"role {trace.role!r}: {self.name} needs rewards in [{low:g}, {high:g}], got "
                        f"{trace.reward:g}; map the env's rewards into that range (a success indicator or an "
                        "affine rescaling) or choose grpo / rae, which take any finite reward")
        return None

    def __init__(self, config: AlgorithmConfig | dict[str, Any] | None = None):
        if config is None:
            config = self.config_class()
        elif isinstance(config, dict):
            config = self.config_class.model_validate(config)
        elif not isinstance(config, self.config_class):
            raise TypeError(f"{type(self).__name__} expects a {self.config_class.__name__}, got {type(config).__name__}")
        self.config = config

    @property
    def name(self) -> str:
        """The config's ``type``; the tag used for per-algorithm metrics."""
        return self.config.type

    async def setup(self, ctx: AlgorithmContext) -> None:
        """Load or connect what the algorithm needs (teachers). Default: nothing."""

    async def score_episode(self, episode: Episode, roles: set[str] | None = None) -> None:
        """Per-episode work such as teacher scoring. Default: nothing."""

    def score_group(self, episodes: list[Episode], roles: set[str] | None = None) -> None:
        """Group-relative credit over the G episodes of one task. Default: nothing."""

    def state_dict(self) -> dict[str, Any]:
        """JSON-able state saved in checkpoints. Default: none."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what [`state_dict`][multiagent_rl.algorithms.base.Algorithm.state_dict] returned. Default:
        nothing."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"


# -- registry -------------------------------------------------------------------------------

ALGORITHMS: Registry[type[Algorithm]] = Registry("algorithm", base=Algorithm)
"""Registered algorithm classes by config ``type``."""


def register(cls: type[Algorithm]) -> type[Algorithm]:
    """Class decorator: register ``cls`` under the default ``type`` of its ``config_class``."""
    name = cls.config_class.model_fields["type"].default
    if not isinstance(name, str) or not name:
        raise TypeError(f"{cls.config_class.__name__}.type needs a string default to be registered")
    return ALGORITHMS.register(name, cls)




def _import_algorithm(path: str) -> type[Algorithm]:
    """Import ``"package.module:MyAlgorithm"`` and register it under its config's ``type``."""
    return register(ALGORITHMS.lookup(path))


def parse_algorithm_config(d: dict[str, Any] | AlgorithmConfig) -> AlgorithmConfig:
    """Validate an algorithm config given as a dict (``{"type": "grpo", ...}``) or a config object.

    ``type`` is a registered name or an import path ``"package.module:MyAlgorithm"`` (then the class
    is imported and registered, and the config carries its registered name). Raises ValueError for a
    missing or unknown ``type`` (naming the known ones) and pydantic.ValidationError for unknown or
    ill-typed keys (naming the key).
    """
    if isinstance(d, AlgorithmConfig):
        if d.type not in ALGORITHMS:
            raise ValueError(f"Unknown algorithm type {d.type!r}; known types: {', '.join(sorted(ALGORITHMS))}")
        return d
    if not isinstance(d, dict):
        raise TypeError(f"An algorithm config must be a dict or an AlgorithmConfig, got {type(d).__name__}")
    kind = d.get("type")
    if kind is None:
        raise ValueError(f"Algorithm config {d!r} has no 'type'; known types: {', '.join(sorted(ALGORITHMS))}")
    if isinstance(kind, str) and ":" in kind:
        cls = _import_algorithm(kind)
        d = {**d, "type": cls.config_class.model_fields["type"].default}
        kind = d["type"]
    if kind not in ALGORITHMS:
        raise ValueError(f"Unknown algorithm type {kind!r}; known types: {', '.join(sorted(ALGORITHMS))}, or an "
                         "import path 'package.module:MyAlgorithm'")
    return ALGORITHMS[kind].config_class.model_validate(d)


def build_algorithm(d: dict[str, Any] | AlgorithmConfig) -> Algorithm:
    """Parse ``d`` and instantiate the matching algorithm, checking the loss streams it declares."""
    config = parse_algorithm_config(d)
    cls = ALGORITHMS[config.type]
    declared = set(cls.loss_types)
    if not declared or not declared <= set(stream_names()) or not set(cls.streams_required()) <= declared:
        raise TypeError(
            f"{cls.__name__}.loss_types = {cls.loss_types!r} must name one or more of {stream_names()} "
            f"(and required_streams a subset of them)"
        )
    return cls(config)


# -- helpers for algorithm files -------------------------------------------------------------


def is_trained(episode: Episode, trace: Trace, roles: set[str] | None) -> bool:
    """Whether an algorithm may write onto ``trace``."""
    return (
        episode.ok
        and trace.trainable
        and trace.token_exact
        and trace.error is None
        and (roles is None or trace.role in roles)
    )


def trained_traces(episodes: Iterable[Episode], roles: set[str] | None) -> Iterator[tuple[int, Episode, Trace]]:
    """``(episode index, episode, trace)`` for every trace an algorithm may train, in order."""
    for i, episode in enumerate(episodes):
        for trace in episode.traces:
            if is_trained(episode, trace, roles):
                yield i, episode, trace


PeerKey = Callable[[int, Episode, Trace], Hashable]


def by_role(index: int, episode: Episode, trace: Trace) -> Hashable:
    """Peer key: the trace's role across the whole task group (roles are never pooled)."""
    return trace.role


def peer_groups(episodes: list[Episode], roles: set[str] | None, key: PeerKey = by_role) -> dict[Hashable, list[Trace]]:
    """Trained traces grouped by ``key`` (insertion-ordered, so results are deterministic)."""
    groups: dict[Hashable, list[Trace]] = {}
    for i, episode, trace in trained_traces(episodes, roles):
        groups.setdefault(key(i, episode, trace), []).append(trace)
    return groups


def on_kind(trace: Trace, kind: str, value: float) -> list[float]:
    """A per-token stream that is ``value`` on tokens of ``kind`` and 0 elsewhere."""
    return [value if k == kind else 0.0 for k in trace.token_kinds]
