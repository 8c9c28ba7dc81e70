"""Experiment configuration: one schema for Python objects (notebooks) and TOML (recipes).

.. code-block:: toml

    [algo]                      # the default algorithm
    type = "rae"

    [model]
    name = "tiny"

    [[env]]
    id = "kuhn_poker"
    group_size = 8

    [env.roles.player_1]        # per-role binding and overrides
    model = "scripted"
    policy = "multiagent_rl.envs.kuhn_poker:random_policy"
    trainable = false

    [trainer]                   # fields of MixedAlgorithmConfig (a TRL GRPOConfig)
    max_steps = 100

Unknown keys and impossible combinations fail at load time with a message naming the key and
the fix.
"""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Annotated, Any, Callable

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from .algorithms import ALGORITHMS, AlgorithmConfig, parse_algorithm_config

ENVS: dict[str, str] = {
    "kuhn_poker": "multiagent_rl.envs.kuhn_poker:KuhnPokerEnv",
}
"""Built-in environment ids; any ``"package.module:Class"`` path works too."""


def import_object(path: str) -> Any:
    """Import ``"package.module:name"``."""
    if ":" not in path:
        raise ValueError(f"{path!r} is not an import path; write it as 'package.module:name'")
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"cannot import {path!r}: {exc}") from exc


# A dict such as {"type": "grpo"} becomes the registered algorithm's typed config.
OptionalAlgorithm = Annotated[
    AlgorithmConfig | None, BeforeValidator(lambda v: None if v is None else parse_algorithm_config(v))
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", arbitrary_types_allowed=True, use_attribute_docstrings=True)


class RoleConfig(_Strict):
    """How one seat of an environment is played and trained."""

    model: str = "policy"
    """``"policy"`` (the model being trained), a frozen model (``"tiny"``, a hub id or a local path) or ``"scripted"``."""
    trainable: bool | None = None
    """Whether this seat's traces are trained on; default: True for ``policy`` seats, False otherwise."""
    algo: OptionalAlgorithm = None
    """This role's algorithm; default: the environment's, then the experiment's."""
    policy: Callable[..., Any] | str | None = None
    """Scripted seats: a function ``turn -> str``, or an import path of a factory called with ``policy_args``."""
    policy_args: dict[str, Any] = Field(default_factory=dict)
    """Arguments of the scripted policy factory."""
    sampling: dict[str, Any] = Field(default_factory=dict)
    """Sampling overrides for this seat (``temperature``, ``max_new_tokens``, ...)."""

    @model_validator(mode="after")
    def _check(self):
        if self.model == "scripted" and self.policy is None:
            raise ValueError("model='scripted' needs `policy` (a function, or 'package.module:factory')")
        if self.model != "scripted" and self.policy is not None:
            raise ValueError(f"`policy` is only for scripted seats; this seat has model={self.model!r}")
        return self

    @property
    def is_trainable(self) -> bool:
        return self.model == "policy" if self.trainable is None else self.trainable

    def scripted_policy(self) -> Callable[..., Any]:
        if callable(self.policy):
            return self.policy
        return import_object(self.policy)(**self.policy_args)


class EnvConfig(_Strict):
    """One environment in the training mix."""

    id: str
    """A built-in id (``kuhn_poker``) or ``"package.module:EnvClass"``."""
    name: str | None = None
    """Label for metrics, traces and RAE baselines; default: ``id`` (suffixed when repeated)."""
    args: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the environment's constructor."""
    instance: Any = None
    """Python only: an already-built ``Env`` (then ``id`` is just its label)."""
    group_size: int = Field(8, ge=1)
    """Episodes per task (the group credit rules compare)."""
    weight: float = Field(1.0, gt=0)
    """Relative sampling weight among the environments active at a step."""
    algo: OptionalAlgorithm = None
    """This environment's algorithm; default: the experiment's ``[algo]``."""
    roles: dict[str, RoleConfig] = Field(default_factory=dict)
    """Per-seat bindings; seats not listed play the policy and are trained."""
    start_step: int = Field(0, ge=0)
    """First training step at which this environment is sampled (e.g. after a warm-up)."""
    stop_step: int | None = Field(None, ge=1)
    """Step from which it is no longer sampled (e.g. an SFT warm-up phase); None = never stops."""
    timeout: float | None = Field(None, gt=0)
    """Seconds one episode may take before it is recorded as failed."""

    @model_validator(mode="after")
    def _check(self):
        if self.instance is None and self.id not in ENVS and ":" not in self.id:
            raise ValueError(f"unknown env id {self.id!r}; built-in: {sorted(ENVS)}, or give 'package.module:Class'")
        if self.stop_step is not None and self.stop_step <= self.start_step:
            raise ValueError(f"env {self.id!r}: stop_step={self.stop_step} must be after start_step={self.start_step}")
        return self

    def build(self):
        if self.instance is not None:
            return self.instance
        return import_object(ENVS.get(self.id, self.id))(**self.args)

    def active(self, step: int) -> bool:
        return self.start_step <= step and (self.stop_step is None or step < self.stop_step)


class ModelConfig(_Strict):
    """The policy being trained."""

    name: str = "tiny"
    """``"tiny"`` (embedded, CPU), a hub id or a local path."""
    lora: dict[str, Any] | None = None
    """PEFT ``LoraConfig`` keyword arguments to train an adapter instead of the full model."""


class ExperimentConfig(_Strict):
    """Everything one training run needs."""

    algo: AlgorithmConfig = Field(default_factory=lambda: parse_algorithm_config({"type": "grpo"}))
    """The default algorithm for every environment and role that does not name its own."""
    env: list[EnvConfig]
    """The environments in the mix."""
    model: ModelConfig = Field(default_factory=ModelConfig)
    trainer: dict[str, Any] = Field(default_factory=dict)
    """Fields of :class:`~multiagent_rl.trainer.MixedAlgorithmConfig` (a TRL ``GRPOConfig``)."""

    @field_validator("algo", mode="before")
    @classmethod
    def _algo(cls, v):
        return parse_algorithm_config(v)

    @model_validator(mode="after")
    def _check(self):
        if not self.env:
            raise ValueError("the experiment needs at least one [[env]]")
        for i, env in enumerate(self.env):
            for role, rc in env.roles.items():
                algo = self.algorithm_for(env, role)
                where = f"env[{i}] ({env.id}) role {role!r}"
                if not rc.is_trainable:
                    continue
                spec = ALGORITHMS[algo.type]
                if spec.samples_from_policy and rc.model != "policy":
                    raise ValueError(
                        f"{where}: algo {algo.type!r} trains on the policy's own samples but the seat is played by "
                        f"{rc.model!r}; set trainable = false, bind model = 'policy', or use algo 'sft' to imitate it"
                    )
                if not spec.samples_from_policy and rc.model == "policy":
                    raise ValueError(
                        f"{where}: algo {algo.type!r} imitates a frozen teacher or scripted agent, but the seat samples "
                        f"from the policy; bind the seat to a frozen model or scripted policy, or choose an RL algorithm"
                    )
            if not env.roles and not ALGORITHMS[self.algorithm_for(env, None).type].samples_from_policy:
                raise ValueError(
                    f"env[{i}] ({env.id}): algo {self.algorithm_for(env, None).type!r} needs [env.roles.NAME] bound to "
                    f"a frozen model or scripted policy; unlisted seats play the policy"
                )
        return self

    def algorithm_for(self, env: EnvConfig, role: str | None) -> AlgorithmConfig:
        rc = env.roles.get(role) if role is not None else None
        return (rc.algo if rc is not None else None) or env.algo or self.algo

    @classmethod
    def from_toml(cls, path: str | Path) -> ExperimentConfig:
        with open(path, "rb") as f:
            data = tomllib.load(f)
        return cls.model_validate(data)
